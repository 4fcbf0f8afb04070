"""dataset.py and main.py glue: the same temporal stride in training, validation
and inference; per-rank random streams; small subsets; linear lr scaling; AMP."""
import json

import pytest
import torch

import dataset as data
import main
from opts import parse_opts
from tests.conftest import tiny_args
from utils.distributed import DistContext
from utils.logs import read_tsv
from utils.resumable_data import epoch_seed, restart_seed, sample_seed


def parsed(tiny, tmp_path, *extra):
    return parse_opts(tiny_args(*tiny, tmp_path / 'r', *extra))


def prepared(tiny, tmp_path, *extra):
    """(options, run record) of a one-process CPU run."""
    opt = parsed(tiny, tmp_path, *extra)
    record, _ = main.prepare(opt, DistContext())
    return opt, record


def test_sample_t_stride_applies_to_train_val_and_inference(tiny_synthetic, tmp_path):
    opt, record = prepared(tiny_synthetic, tmp_path, '--sample_t_stride', '2',
                           '--sample_duration', '4', '--train_t_crop', 'center')
    train_set, _ = data.get_training_data(opt, record)
    val_set, _ = data.get_validation_data(opt, record)
    infer_set, _ = data.get_inference_data(opt, record)
    assert list(train_set.temporal_transform(0, 12)) == [2, 4, 6, 8]  # centre 7 frames, every 2nd
    for clip in val_set.temporal_transform(0, 12):
        assert [b - a for a, b in zip(clip, clip[1:])] == [2, 2, 2]
    for window in infer_set.sliding_window(0, 12):
        assert [b - a for a, b in zip(window, window[1:])] == [2, 2, 2]
    x, _, (begin, end) = infer_set[0]
    assert x.shape[1] == 4 and (begin, end) == (1, 8)  # 1-based frames 1..7


def test_ranks_augment_differently_and_repeatably(tiny_synthetic, tmp_path):
    opt, record = prepared(tiny_synthetic, tmp_path, '--train_crop', 'random', '--colorjitter')
    train_set, _ = data.get_training_data(opt, record)

    def first_clip(rank, epoch):
        data.seed_worker_rngs(epoch_seed(opt.manual_seed, rank, epoch))
        return train_set[0][0]

    assert not torch.equal(first_clip(0, 1), first_clip(1, 1))  # ranks differ
    assert not torch.equal(first_clip(0, 1), first_clip(0, 2))  # epochs differ
    assert torch.equal(first_clip(1, 3), first_clip(1, 3))      # and are reproducible


def test_seeds_keep_their_values():
    """Every seed is mixed in utils/resumable_data.py; the values are those the
    runs before it drew (a checkpoint written then resumes as it did)."""
    assert sample_seed(7, 3, 11) == 7000255000803
    assert epoch_seed(7, 1, 3) == 7010031
    assert restart_seed(12345, 4) == 12345407389
    assert sample_seed(2**62, 1, -1) == 4611686018428387936  # wraps at 2**63


@pytest.mark.slow
def test_validation_subset_with_fewer_than_five_videos(tiny_synthetic, tmp_path):
    """The predecessor divided by zero on subsets of fewer than 5 videos."""
    video_path, annotation_path = tiny_synthetic
    ann = json.loads(annotation_path.read_text())
    val_ids = [k for k, v in ann['database'].items() if v['subset'] == 'validation']
    for vid in val_ids[2:]:
        del ann['database'][vid]
    small = tmp_path / 'small.json'
    small.write_text(json.dumps(ann))
    main.main(tiny_args(video_path, small, tmp_path / 'r', '--n_epochs', '1',
                        '--n_val_samples', '1', '--inference'))
    assert len(json.loads((tmp_path / 'r' / 'val.json').read_text())['results']) == 2


def test_linear_lr_scaling(tiny_synthetic, tmp_path):
    opt = parsed(tiny_synthetic, tmp_path, '--lr_scaling', 'linear', '--base_batch_size', '4',
                 '--accumulation_steps', '2', '--learning_rate', '0.01')
    record, _ = main.prepare(opt, DistContext(rank=0, world_size=2))
    # global batch 8 x 2 accumulation steps over a base batch of 4
    assert record.learning_rate == pytest.approx(0.04)
    assert opt.learning_rate == 0.01  # the options stay as given
    assert record.batch_per_process == 4
    opt = parsed(tiny_synthetic, tmp_path, '--batch_size', '7')
    with pytest.raises(Exception, match='divisible'):
        main.prepare(opt, DistContext(rank=0, world_size=2))


@pytest.mark.slow
def test_amp_is_ignored_on_cpu(tiny_synthetic, tmp_path, capsys):
    main.main(tiny_args(*tiny_synthetic, tmp_path / 'r', '--n_epochs', '1', '--amp', '--no_val'))
    assert '--amp is ignored on CPU' in capsys.readouterr().out
    ckpt = torch.load(tmp_path / 'r' / 'save_1.pth', weights_only=True)
    assert all(torch.isfinite(v).all() for v in ckpt['state_dict'].values()
               if v.is_floating_point())


def test_one_parameter_group_without_frozen_tensors():
    from training import OptimizerConfig, make_optimizer
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    net[0].requires_grad_(False)
    optimizer = make_optimizer(net, OptimizerConfig('sgd', 0.1, weight_decay=0.0))
    assert len(optimizer.param_groups) == 1
    assert len(optimizer.param_groups[0]['params']) == 2


@pytest.mark.slow
def test_channels_last_gives_the_same_training(tiny_synthetic, tmp_path):
    for name, extra in (('plain', ()), ('cl', ('--channels_last',))):
        main.main(tiny_args(*tiny_synthetic, tmp_path / name, '--n_epochs', '1', '--no_val',
                            '--inference', *extra))
    a = torch.load(tmp_path / 'plain' / 'save_1.pth', weights_only=True)['state_dict']
    b = torch.load(tmp_path / 'cl' / 'save_1.pth', weights_only=True)['state_dict']
    # oneDNN picks other convolution kernels for channels_last; with one thread
    # (OMP_NUM_THREADS=1) their rounding differs by up to 7e-4 after 3 steps.
    for k in a:
        assert torch.allclose(a[k].float(), b[k].float(), atol=2e-3), k
    ra = json.loads((tmp_path / 'plain' / 'val.json').read_text())['results']
    rb = json.loads((tmp_path / 'cl' / 'val.json').read_text())['results']
    assert [e['label'] for v in ra.values() for e in v[:1]] == \
        [e['label'] for v in rb.values() for e in v[:1]]


def test_normalizing_on_the_device_gives_the_same_clips(tiny_synthetic, tmp_path):
    outputs = {}
    for mode in ('off', 'on'):
        opt, record = prepared(tiny_synthetic, tmp_path, '--normalize_on_device', mode,
                               '--train_crop', 'random', '--colorjitter')
        train_set, _ = data.get_training_data(opt, record)
        val_set, _ = data.get_validation_data(opt, record)
        infer_set, _ = data.get_inference_data(opt, record)
        items = []
        for ds in (train_set, val_set, infer_set):
            data.seed_worker_rngs(5)
            x = ds[1][0]
            normalizer = ds.spatial_transform.device_normalizer
            if normalizer is not None:
                assert x.dtype == torch.uint8
                x = normalizer(x.flatten(0, -5) if x.dim() == 5 else x[None])
                x = x if ds is val_set else x[0]
            items.append(x)
        outputs[mode] = items
    for a, b in zip(outputs['off'], outputs['on']):
        assert a.dtype == b.dtype == torch.float32 and a.shape == b.shape
        assert torch.allclose(a, b, atol=1e-6)


@pytest.mark.slow
def test_training_with_normalization_on_the_device(tiny_synthetic, tmp_path):
    for mode in ('off', 'on'):
        main.main(tiny_args(*tiny_synthetic, tmp_path / mode, '--n_epochs', '1',
                            '--normalize_on_device', mode, '--inference'))
    a = torch.load(tmp_path / 'off' / 'save_1.pth', weights_only=True)['state_dict']
    b = torch.load(tmp_path / 'on' / 'save_1.pth', weights_only=True)['state_dict']
    for k in a:
        assert torch.allclose(a[k].float(), b[k].float(), atol=1e-5), k
    va = read_tsv(tmp_path / 'off' / 'val.log')[0]
    vb = read_tsv(tmp_path / 'on' / 'val.log')[0]
    assert float(va['loss']) == pytest.approx(float(vb['loss']), rel=1e-4)
