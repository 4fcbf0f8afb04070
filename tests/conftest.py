from pathlib import Path

import pytest
import torch


def pytest_configure(config):
    config.addinivalue_line('markers', 'gpu: runs on a CUDA device (skipped without one)')


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
