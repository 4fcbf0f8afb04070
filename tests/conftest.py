import os
from pathlib import Path

import pytest
import torch
import torch.nn as nn


def pytest_configure(config):
    config.addinivalue_line('markers', 'gpu: runs on a CUDA device (skipped without one)')
    if os.environ.get('PYTEST_XDIST_WORKER'):
        # pytest-xdist runs one worker a core (pyproject.toml): one intra-op thread
        # each, in the worker and the processes it starts. More threads than cores
        # make OpenMP's threads wait on each other: two tiny trainings took 61 s
        # instead of 2.3.
        os.environ['OMP_NUM_THREADS'] = '1'
        torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def cpu_unless_marked_gpu(request, monkeypatch):
    """Tests run on CPU even on a GPU machine (the suite's figures and the
    2-process tests assume it), unless marked @pytest.mark.gpu. Subprocesses
    inherit the hidden devices through CUDA_VISIBLE_DEVICES."""
    if request.node.get_closest_marker('gpu') is not None:
        if not torch.cuda.is_available():
            pytest.skip('needs a CUDA device')
        return
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '')
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 0)


@pytest.fixture(scope='session')
def tiny_synthetic(tmp_path_factory):
    """A small copy of the built-in data set (6 classes, 12-frame 32x32 videos),
    in the jpg layout with a ucf101-style annotation file."""
    from datasets.synthetic import prepare_synthetic
    root = tmp_path_factory.mktemp('synthetic')
    video_path, annotation_path = prepare_synthetic(
        root, seed=0, n_train_per_class=4, n_val_per_class=2, n_test=3, n_frames=12,
        frame_size=32)
    return Path(video_path), Path(annotation_path)


@pytest.fixture(scope='session')
def tiny_shards(tiny_synthetic, tmp_path_factory):
    """util_scripts.make_shards of tiny_synthetic's 39 jpg folders (hdf5 payloads), 4 shards."""
    from util_scripts import make_shards
    video_path, annotation = tiny_synthetic
    out = tmp_path_factory.mktemp('shards')
    make_shards.main([str(annotation), str(video_path), str(out), '--dataset', 'ucf101', '--file_type', 'jpg',
                      '--shard_size', '250KB', '--no_progress'])
    assert len(list(out.glob('shard-*.tar'))) > 1
    return out


@pytest.fixture(scope='module')
def shards_http(tiny_shards):
    """tiny_shards served with byte ranges: http://127.0.0.1:PORT."""
    from tests.servers import http_server
    with http_server(tiny_shards) as url:
        yield url


@pytest.fixture(scope='module')
def shards_s3(tiny_shards):
    """tiny_shards on moto's S3 server: (s3://bucket-PORT/prefix, storage_options)."""
    pytest.importorskip('moto.server')
    pytest.importorskip('s3fs')
    from tests.servers import s3_server
    with s3_server(tiny_shards) as (url, options):
        yield url, options


def tiny_args(video_path, annotation_path, result_path, *extra):
    """A command line for a fast run on tiny_synthetic: resnet-10 at width 1/4 on
    8x32x32 clips, one worker process."""
    return ['--dataset', 'ucf101', '--video_path', str(video_path),
            '--annotation_path', str(annotation_path), '--result_path', str(result_path),
            '--n_classes', '6', '--model', 'resnet', '--model_depth', '10',
            '--resnet_widen_factor', '0.25', '--sample_size', '32', '--sample_duration', '8',
            '--batch_size', '8', '--n_threads', '1', '--learning_rate', '0.01',
            '--n_val_samples', '2', '--no_hflip', '--mean_dataset', '0.5', '--no_progress',
            '--log_interval', '2', *extra]


@pytest.fixture(scope='module')
def one_torch_thread():
    """One intra-op thread for a module's runs in this process: on these tiny
    tensors it is as fast as more, and 2-3 times faster while other processes
    load the CPU (OpenMP threads then wait on each other); restored after."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def inductor_in_process():
    """Inductor compiles its kernels in this process: on a small CPU its pool of
    compile workers costs more to start than it saves."""
    import torch._inductor.config as inductor_config
    with inductor_config.patch(compile_threads=1):
        yield


@pytest.fixture(scope='session')
def rank_pool():
    """Two gloo processes kept for the whole session (tests.dist_helpers.RankPool):
    a two-rank test then costs its own work, not the seconds two processes take
    to start and import torch and the project."""
    from tests.dist_helpers import RankPool
    pool = RankPool(2)
    yield pool
    pool.close()


def skip_curves(monkeypatch):
    """Runs in this process skip drawing curves.png (a matplotlib process after
    each epoch, 1-2 s of CPU): for tests that do not look at it (test_main.py's
    do)."""
    from tests.dist_helpers import no_drawing
    from utils import logs
    monkeypatch.setattr(logs, 'drawing_command', no_drawing)


@pytest.fixture
def no_curves(monkeypatch):
    skip_curves(monkeypatch)


class OneStageResNet(nn.Module):
    """ResNet's pieces at 4 and 8 channels: the stem (conv, BN, ReLU, max-pool),
    one residual stage `layer1` whose block strides and widens through its
    shortcut (type A: strided slicing and zero padding), average pooling and
    `fc`. Inductor's compile time grows with the kernels a graph needs (minutes
    for resnet-10 on a small CPU): the torch.compile tests of test_models.py
    and test_recipe.py train this on 2x3x4x16x16 clips, one graph that
    inductor's cache compiles once a session."""

    def __init__(self, n_classes=5, shortcut_type='A'):
        super().__init__()
        from models import resnet
        self.conv1 = nn.Conv3d(3, 4, kernel_size=(3, 7, 7), stride=(1, 2, 2), padding=(1, 3, 3),
                               bias=False)
        self.bn1 = nn.BatchNorm3d(4)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool3d(kernel_size=3, stride=2, padding=1)
        self.layer1 = resnet.make_layer(resnet.BasicBlock, 4, 8, 1, stride=2,
                                        shortcut_type=shortcut_type)
        self.avgpool = nn.AdaptiveAvgPool3d(1)
        self.fc = nn.Linear(8, n_classes)
        resnet.init_weights(self)

    def forward(self, x):
        x = self.layer1(self.maxpool(self.relu(self.bn1(self.conv1(x)))))
        return self.fc(torch.flatten(self.avgpool(x), 1))
