"""End-to-end runs of main.py on a tiny synthetic data set: outputs, exact
resume, schedules, fine-tuning and the predecessor's known failures."""
import json
import re
import shutil

import pytest
import torch

import main
from tests.conftest import tiny_args
from utils.checkpoint import load_checkpoint
from utils.logs import read_tsv


def run(tiny, result, *extra):
    main.main(tiny_args(*tiny, result, *extra))


@pytest.mark.slow
def test_end_to_end_outputs(tiny_synthetic, tmp_path):
    result = tmp_path / 'new' / 'folder'  # created if missing (the predecessor required it)
    run(tiny_synthetic, result, '--n_epochs', '2', '--checkpoint', '1', '--inference',
        '--inference_stride', '4', '--tensorboard')
    opts = json.loads((result / 'opts.json').read_text())
    run_record = opts['run']
    assert opts['n_classes'] == 6 and run_record['n_parameters'] > 0
    assert run_record['gflops_per_clip'] > 0 and run_record['begin_epoch'] == 1
    train_log = read_tsv(result / 'train.log')
    assert [r['epoch'] for r in train_log] == ['1', '2']
    assert list(train_log[0])[:4] == ['epoch', 'loss', 'acc', 'lr']
    assert list(read_tsv(result / 'val.log')[0])[:3] == ['epoch', 'loss', 'acc']
    batch_log = read_tsv(result / 'train_batch.log')
    assert list(batch_log[0]) == ['epoch', 'batch', 'iter', 'loss', 'acc', 'lr']
    assert len(batch_log) == 2 * 3  # 24 training videos / batch 8, two epochs
    assert [int(r['iter']) for r in batch_log] == list(range(1, 7))
    ckpt = load_checkpoint(result / 'save_2.pth')
    assert {'epoch', 'arch', 'state_dict', 'optimizer', 'scheduler'} <= set(ckpt)
    assert ckpt['epoch'] == 2 and ckpt['arch'] == 'resnet-10'
    assert not any(k.startswith('module.') for k in ckpt['state_dict'])
    assert (result / 'save_1.pth').exists()
    results = json.loads((result / 'val.json').read_text())['results']
    assert len(results) == 12  # every validation video once
    for entries in results.values():
        assert len(entries) == 5
        scores = [e['score'] for e in entries]
        assert scores == sorted(scores, reverse=True) and 0 <= scores[-1] <= scores[0] <= 1
    assert not list(result.glob('*.tmp'))
    assert list(result.glob('events.out.tfevents.*'))


def _tb_events(result):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(result))
    acc.Reload()
    return acc


def _tb_scalars(result):
    acc = _tb_events(result)
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()['scalars']}


def _tb_steps(result):
    """{tag: [(step, value)]}"""
    acc = _tb_events(result)
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()['scalars']}


@pytest.mark.slow
def test_resumed_tensorboard_has_each_epoch_once(tiny_synthetic, tmp_path):
    run(tiny_synthetic, tmp_path, '--n_epochs', '3', '--checkpoint', '1', '--tensorboard', '--no_val')
    before = _tb_scalars(tmp_path)['train/loss']
    steps_before = _tb_steps(tmp_path / 'train_steps')['train_step/loss']
    run(tiny_synthetic, tmp_path, '--n_epochs', '3', '--checkpoint', '1', '--tensorboard', '--no_val',
        '--resume_path', str(tmp_path / 'save_1.pth'))
    after = _tb_scalars(tmp_path)['train/loss']
    assert len(after) == 3  # epochs 2 and 3 replaced, not appended
    assert after == pytest.approx(before)  # and the resumed run is exact
    steps_after = _tb_steps(tmp_path / 'train_steps')['train_step/loss']  # so are the steps'
    assert [s for s, _ in steps_after] == [2, 3, 5, 6, 8, 9] == [s for s, _ in steps_before]
    assert [v for _, v in steps_after] == pytest.approx([v for _, v in steps_before])


def test_tensorboard_has_the_steps_and_the_hyper_parameters(tiny_synthetic, tmp_path, capsys):
    """3 batches an epoch, --log_interval 2: a point after batches 2 and 3 of
    each epoch, each the mean of its interval's rows of train_batch.log."""
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData
    run(tiny_synthetic, tmp_path, '--n_epochs', '2', '--tensorboard', '--multistep_milestones', '1')
    steps = _tb_steps(tmp_path / 'train_steps')
    rows = read_tsv(tmp_path / 'train_batch.log')
    for key in ('loss', 'acc'):
        values = [float(r[key]) for r in rows]
        means = [sum(values[0:2]) / 2, values[2], sum(values[3:5]) / 2, values[5]]
        assert [s for s, _ in steps[f'train_step/{key}']] == [2, 3, 5, 6]
        assert [v for _, v in steps[f'train_step/{key}']] == pytest.approx(means, abs=1e-5)
    assert [v for _, v in steps['train_step/lr']] == pytest.approx([0.01, 0.01, 0.001, 0.001])
    val_log, train_log = read_tsv(tmp_path / 'val.log'), read_tsv(tmp_path / 'train.log')
    scalars = _tb_steps(tmp_path)
    assert scalars['hparams/val_acc'] == [(2, pytest.approx(float(val_log[-1]['acc']), abs=1e-5))]
    assert scalars['hparams/train_loss'] == [(2, pytest.approx(float(train_log[-1]['loss']), abs=1e-5))]
    content = _tb_events(tmp_path).PluginTagToContent('hparams')
    start = HParamsPluginData.FromString(content['_hparams_/session_start_info']).session_start_info
    assert start.hparams['learning_rate'].number_value == 0.01
    assert start.hparams['arch'].string_value == 'resnet-10'
    out = capsys.readouterr().out
    assert f'TensorBoard events: {tmp_path}/events.out.tfevents.' in out
    assert f'view them with: tensorboard --logdir {tmp_path}' in out
    assert re.search(r'^\d+ intra-op threads? a process \((OMP_NUM_THREADS|\d+ usable CPUs - 1 decoding); '
                     r'--threads to change\)$', out, re.M)
    assert not (tmp_path / 'curves.png').exists()


# A stand-in drawing that cannot finish before epoch 2's row is in train.log:
# if training waited for the drawing, this child would wait out its timeout.
_WAIT_FOR_EPOCH_2 = """
import sys, time
from pathlib import Path
folder = Path(sys.argv[1])
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    rows = (folder / 'train.log').read_text().splitlines()[1:]
    if any(r.split('\\t')[0] == '2' for r in rows):
        break
    time.sleep(0.05)
else:
    sys.exit('timed out waiting for epoch 2')
(folder / 'drawings').open('a').write('after epoch 2 started\\n')
"""


@pytest.mark.slow
def test_the_next_epoch_starts_before_a_slow_drawing_ends(tiny_synthetic, tmp_path, monkeypatch, capsys):
    import sys

    from utils import logs
    monkeypatch.setattr(logs, 'drawing_command',
                        lambda folder: [sys.executable, '-c', _WAIT_FOR_EPOCH_2, str(folder)])
    run(tiny_synthetic, tmp_path, '--n_epochs', '2')
    # the first drawing (asked for after epoch 1) ended only once epoch 2 was logged; the one
    # asked for after epoch 2 waited for it and ran at the end
    assert (tmp_path / 'drawings').read_text().splitlines() == ['after epoch 2 started'] * 2
    assert 'drawing' not in capsys.readouterr().out  # no failure note


def test_a_failed_drawing_is_one_note(tmp_path, monkeypatch, capsys):
    import sys

    from utils import logs
    monkeypatch.setattr(logs, 'drawing_command',
                        lambda folder: [sys.executable, '-c', 'raise SystemExit("no space left on device")'])
    with logs.CurvesPainter(tmp_path) as painter:
        painter.request()
        painter.request()  # while the first runs: one more at the end, not a queue
    out = capsys.readouterr().out
    assert out == f'note: drawing {tmp_path.resolve() / "curves.png"} failed: no space left on device\n' * 2


def test_without_tensorboard_curves_png_is_redrawn_after_every_epoch(tiny_synthetic, tmp_path, capsys,
                                                                     monkeypatch):
    from utils import logs
    monkeypatch.setattr(logs, 'tensorboard_installed', lambda: False)  # --tensorboard, not installed
    run(tiny_synthetic, tmp_path, '--n_epochs', '1', '--tensorboard')
    out = capsys.readouterr().out
    assert 'note: --tensorboard needs the tensorboard package (pip install tensorboard)' in out
    assert f'loss, accuracy and learning rate curves: {tmp_path / "curves.png"}' in out
    first = (tmp_path / 'curves.png').read_bytes()
    assert first[:4] == b'\x89PNG' and not list(tmp_path.rglob('events.out.tfevents.*'))
    run(tiny_synthetic, tmp_path, '--n_epochs', '2', '--resume_path', str(tmp_path / 'save_1.pth'))
    assert (tmp_path / 'curves.png').read_bytes() != first  # redrawn with epoch 2
    drawn = logs.draw_curves(tmp_path)
    train_log, val_log = read_tsv(tmp_path / 'train.log'), read_tsv(tmp_path / 'val.log')
    assert drawn['loss: train'] == [(int(r['epoch']), float(r['loss'])) for r in train_log]
    assert drawn['accuracy: validation (video)'] == [(int(r['epoch']), float(r['acc'])) for r in val_log]
    assert drawn['learning rate: lr'] == [(1, 0.01), (2, 0.01)]
    assert sorted(drawn) == ['accuracy: train (clip)', 'accuracy: validation (clip)',
                             'accuracy: validation (video)', 'learning rate: lr', 'loss: train',
                             'loss: validation']


@pytest.mark.slow
def test_tensorboard_records_real_lr(tiny_synthetic, tmp_path):
    run(tiny_synthetic, tmp_path, '--n_epochs', '2', '--tensorboard', '--no_val',
        '--multistep_milestones', '1')
    scalars = _tb_scalars(tmp_path)
    assert scalars['train/lr'] == pytest.approx([0.01, 0.001])  # not the accuracy
    assert {'train/loss', 'train/acc', 'train/clips_per_s', 'train/data_wait'} <= set(scalars)


def _weights(path):
    return load_checkpoint(path)['state_dict']


@pytest.mark.slow
def test_resume_is_exact_and_logs_append(tiny_synthetic, tmp_path):
    """Train 3 epochs; separately resume from epoch 1 of the same run: the final
    weights and optimizer state are identical, and the logs continue."""
    full = tmp_path / 'full'
    args = ('--n_epochs', '3', '--checkpoint', '1', '--multistep_milestones', '2',
            '--train_crop', 'random', '--colorjitter')
    run(tiny_synthetic, full, *args)
    resumed = tmp_path / 'resumed'
    resumed.mkdir()
    for name in ('save_1.pth', 'train.log', 'val.log', 'train_batch.log'):
        shutil.copy(full / name, resumed / name)
    # Keep only epoch 1's rows, as if the run had been killed during epoch 2.
    for name, n_rows in (('train.log', 1), ('val.log', 1), ('train_batch.log', 3)):
        lines = (resumed / name).read_text().splitlines(keepends=True)
        (resumed / name).write_text(''.join(lines[:1 + n_rows]))
    run(tiny_synthetic, resumed, *args, '--resume_path', str(resumed / 'save_1.pth'))

    a, b = _weights(full / 'save_3.pth'), _weights(resumed / 'save_3.pth')
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    opt_a = load_checkpoint(full / 'save_3.pth')['optimizer']['state']
    opt_b = load_checkpoint(resumed / 'save_3.pth')['optimizer']['state']
    for k in opt_a:
        assert torch.equal(opt_a[k]['momentum_buffer'], opt_b[k]['momentum_buffer'])
    for name in ('train.log', 'val.log', 'train_batch.log'):  # same rows, timings aside
        columns = ('epoch', 'batch', 'iter', 'loss', 'acc', 'clip_acc', 'lr')
        rows_full, rows_resumed = (
            [{k: v for k, v in row.items() if k in columns} for row in read_tsv(d / name)]
            for d in (full, resumed))
        assert rows_full == rows_resumed, name
    lr = [float(r['lr']) for r in read_tsv(resumed / 'train.log')]
    # The drop after milestone 2 comes at epoch 3, also after resuming from epoch 1.
    assert lr == pytest.approx([0.01, 0.01, 0.001])


@pytest.mark.slow
def test_overwrite_milestones_on_resume(tiny_synthetic, tmp_path):
    run(tiny_synthetic, tmp_path, '--n_epochs', '1', '--no_val', '--multistep_milestones', '5')
    run(tiny_synthetic, tmp_path, '--n_epochs', '3', '--no_val', '--multistep_milestones', '2',
        '--overwrite_milestones', '--resume_path', str(tmp_path / 'save_1.pth'))
    lr = [float(r['lr']) for r in read_tsv(tmp_path / 'train.log')]
    assert lr == pytest.approx([0.01, 0.01, 0.001])


@pytest.mark.slow
def test_adamw_is_honoured(tiny_synthetic, tmp_path):
    run(tiny_synthetic, tmp_path, '--n_epochs', '1', '--no_val', '--optimizer', 'adamw',
        '--learning_rate', '0.001')
    state = load_checkpoint(tmp_path / 'save_1.pth')['optimizer']['state']
    assert all('exp_avg' in s for s in state.values())


@pytest.mark.slow
def test_cosine_warmup_schedule(tiny_synthetic, tmp_path):
    run(tiny_synthetic, tmp_path, '--n_epochs', '2', '--no_val', '--lr_scheduler', 'cosine',
        '--warmup_epochs', '1', '--log_interval', '1')
    lrs = [float(r['lr']) for r in read_tsv(tmp_path / 'train_batch.log')]
    # 3 steps per epoch: warmup 1/3, 2/3, 1, then half a cosine over the other 3 steps.
    import math
    expected = [0.01 / 3, 0.02 / 3, 0.01] + \
        [0.01 * 0.5 * (1 + math.cos(math.pi * s / 3)) for s in (0, 1, 2)]
    assert lrs == pytest.approx(expected, rel=1e-4)


@pytest.mark.slow
def test_fine_tuning_freezes_earlier_modules(tiny_synthetic, tmp_path):
    pre = tmp_path / 'pre'
    run(tiny_synthetic, pre, '--n_epochs', '1', '--no_val')
    ft = tmp_path / 'ft'
    run(tiny_synthetic, ft, '--n_epochs', '1', '--no_val', '--pretrain_path',
        str(pre / 'save_1.pth'), '--n_pretrain_classes', '6', '--ft_begin_module', 'layer4')
    before, after = _weights(pre / 'save_1.pth'), _weights(ft / 'save_1.pth')
    for k in before:
        frozen = not k.startswith(('layer4', 'fc'))
        if frozen:  # weights and BatchNorm statistics untouched
            assert torch.equal(before[k], after[k]), k
    assert not torch.equal(before['layer4.0.conv1.weight'], after['layer4.0.conv1.weight'])


@pytest.mark.slow
def test_pretrained_with_other_class_count_and_module_prefix(tiny_synthetic, tmp_path):
    import argparse

    from model import generate_model
    opt = argparse.Namespace(model='resnet', model_depth=10, n_classes=10, n_input_channels=3,
                             conv1_t_size=7, conv1_t_stride=1, no_max_pool=False,
                             resnet_shortcut='B', resnet_widen_factor=0.25)
    net = generate_model(opt)
    path = tmp_path / 'pretrained.pth'
    torch.save({'epoch': 200, 'arch': 'resnet-10',
                'state_dict': {'module.' + k: v for k, v in net.state_dict().items()}}, path)
    run(tiny_synthetic, tmp_path / 'ft', '--n_epochs', '1', '--no_val', '--pretrain_path',
        str(path), '--n_pretrain_classes', '10', '--ft_begin_module', 'fc')
    weights = _weights(tmp_path / 'ft' / 'save_1.pth')
    assert weights['fc.weight'].shape == (6, net.fc.in_features)
    for k, v in net.state_dict().items():
        if not k.startswith('fc.'):
            assert torch.equal(weights[k], v), k  # loaded, then frozen


@pytest.mark.slow
def test_predecessor_command_line(tiny_synthetic, tmp_path):
    """A command line written for 3D-ResNets-PyTorch runs unchanged."""
    video_path, annotation_path = tiny_synthetic
    root = video_path.parent
    main.main(['--root_path', str(root), '--video_path', video_path.name,
               '--annotation_path', annotation_path.name, '--result_path', 'results_x',
               '--dataset', 'ucf101', '--n_classes', '6', '--model', 'resnet',
               '--model_depth', '10', '--batch_size', '8', '--n_threads', '1',
               '--checkpoint', '1', '--sample_size', '32', '--sample_duration', '8',
               '--n_epochs', '1', '--resnet_widen_factor', '0.25', '--no_progress'])
    assert (root / 'results_x' / 'save_1.pth').exists()
    shutil.rmtree(root / 'results_x')


@pytest.mark.slow
def test_plateau_follows_validation_loss(tiny_synthetic, tmp_path):
    run(tiny_synthetic, tmp_path, '--n_epochs', '4', '--lr_scheduler', 'plateau',
        '--plateau_patience', '0', '--learning_rate', '0.05')
    val_loss = [float(r['loss']) for r in read_tsv(tmp_path / 'val.log')]
    lr = [float(r['lr']) for r in read_tsv(tmp_path / 'train.log')]
    # ReduceLROnPlateau('min', patience=0): x0.1 after every epoch whose loss is
    # not below the best so far by the default relative threshold 1e-4.
    expected, best, current = [], float('inf'), 0.05
    for loss in val_loss:
        expected.append(current)
        if loss < best * (1 - 1e-4):
            best = loss
        else:
            current *= 0.1
    assert lr == pytest.approx(expected, rel=1e-3)


@pytest.mark.slow
def test_hdf5_videos_with_zero_based_segments(tiny_synthetic, tmp_path):
    """Frames packed by util_scripts.generate_video_hdf5 and a Kinetics-style
    annotation with 0-based segments train, validate and infer like the jpgs."""
    from util_scripts import generate_video_hdf5
    video_path, annotation_path = tiny_synthetic
    hdf5 = tmp_path / 'hdf5'
    generate_video_hdf5.main([str(video_path), str(hdf5), 'ucf101', '--n_jobs', '1'])
    ann = json.loads(annotation_path.read_text())
    for entry in ann['database'].values():
        begin, end = entry['annotations']['segment']
        entry['annotations']['segment'] = [begin - 1, end - 1]
    (tmp_path / 'kinetics.json').write_text(json.dumps(ann))
    run((hdf5, tmp_path / 'kinetics.json'), tmp_path / 'r', '--file_type', 'hdf5',
        '--dataset', 'kinetics', '--n_epochs', '1', '--inference', '--inference_stride', '4',
        '--sample_duration', '12', '--train_t_crop', 'center')
    results = json.loads((tmp_path / 'r' / 'val.json').read_text())['results']
    assert len(results) == 12


@pytest.mark.slow
def test_inference_per_clip_results(tiny_synthetic, tmp_path):
    run(tiny_synthetic, tmp_path, '--n_epochs', '1', '--no_val', '--inference',
        '--inference_no_average', '--inference_stride', '2', '--output_topk', '0',
        '--inference_subset', 'test')
    results = json.loads((tmp_path / 'test.json').read_text())['results']
    assert len(results) == 3  # every test video, though its label is unknown
    for clips in results.values():
        # 12-frame videos, 8-frame windows every 2 frames: starts 0, 2, 4 -> 3 clips
        assert [c['segment'] for c in clips] == [[1, 9], [3, 11], [5, 13]]
        for c in clips:
            assert len(c['result']) == 6  # --output_topk 0: every class
            assert sum(e['score'] for e in c['result']) == pytest.approx(1, abs=1e-4)


@pytest.mark.slow
def test_two_channel_flow_from_hdf5(tiny_synthetic, tmp_path):
    """--input_type flow: hdf5 files with video_u / video_v JPEG frames feed a
    2-channel network through training, validation and inference."""
    import io

    import h5py
    import numpy as np
    from PIL import Image
    video_path, annotation_path = tiny_synthetic
    ann = json.loads(annotation_path.read_text())
    flow = tmp_path / 'flow'
    for vid, entry in ann['database'].items():
        label = entry['annotations'].get('label', 'test') if entry['subset'] != 'testing' \
            else 'test'
        frames = sorted((video_path / label / vid).glob('image_*.jpg'))
        (flow / label).mkdir(parents=True, exist_ok=True)
        encoded = {'video_u': [], 'video_v': []}
        for f in frames:
            rgb = np.asarray(Image.open(f))
            for key, channel in (('video_u', 0), ('video_v', 1)):
                buf = io.BytesIO()
                Image.fromarray(rgb[:, :, channel]).save(buf, format='JPEG')
                encoded[key].append(np.frombuffer(buf.getvalue(), dtype=np.uint8))
        with h5py.File(flow / label / f'{vid}.hdf5', 'w') as h:
            for key, values in encoded.items():
                d = h.create_dataset(key, (len(values),), dtype=h5py.vlen_dtype(np.uint8))
                for i, v in enumerate(values):
                    d[i] = v
        if 'segment' in entry['annotations']:
            entry['annotations']['segment'] = [0, len(frames)]
    (tmp_path / 'flow.json').write_text(json.dumps(ann))
    run((flow, tmp_path / 'flow.json'), tmp_path / 'r', '--file_type', 'hdf5',
        '--input_type', 'flow', '--n_epochs', '1', '--inference', '--inference_stride', '4')
    weights = load_checkpoint(tmp_path / 'r' / 'save_1.pth')['state_dict']
    assert weights['conv1.weight'].shape[1] == 2
    assert len(json.loads((tmp_path / 'r' / 'val.json').read_text())['results']) == 12


@pytest.mark.slow
def test_no_train_on_a_mid_epoch_checkpoint_logs_the_epoch_it_is_in(tiny_synthetic, tmp_path, capsys):
    run(tiny_synthetic, tmp_path, '--n_epochs', '1', '--no_val', '--checkpoint_steps', '1')
    run(tiny_synthetic, tmp_path / 'eval', '--no_train', '--resume_path', str(tmp_path / 'save_1_2.pth'))
    assert [r['epoch'] for r in read_tsv(tmp_path / 'eval' / 'val.log')] == ['1']
    assert 'validation of epoch 1 after 2 of its batches:' in capsys.readouterr().out
