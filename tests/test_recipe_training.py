"""The training-recipe options wired through training.py and main.py: gradient
clipping, amp dtype, EMA in checkpoints/val.log/resume/inference, mixup with
label smoothing, precise BN, activation checkpointing and torch.compile in
whole runs, and torch.compile under DDP."""
import json
import shutil

import pytest
import torch
import torch.nn as nn

import main
from model import make_parallel
from tests.conftest import tiny_args
from tests.dist_helpers import run_ranks
from training import LoopConfig, LossWatch, Trainer, optimizer_step, train_epoch
from utils.checkpoint import load_checkpoint, save_checkpoint_atomic
from utils.distributed import DistContext
from utils.logs import read_tsv
from utils.precision import AMP_DTYPES, amp_dtype, autocast_context


def run(tiny, result, *extra):
    main.main(tiny_args(*tiny, result, *extra))


# ---- optimizer step, amp dtype ------------------------------------------------

def _large_gradients(scaler):
    torch.manual_seed(0)
    model = nn.Linear(10, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    before = [p.detach().clone() for p in model.parameters()]
    loss = model(torch.randn(4, 10) * 100).pow(2).sum()
    scaler.scale(loss).backward()
    norm = torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item()
    return model, optimizer, before, norm


@pytest.mark.parametrize('scaled', [False, True])
def test_gradient_clipping_bounds_the_norm_after_unscaling(scaled):
    scaler = torch.amp.GradScaler('cpu', enabled=scaled, init_scale=1024.0)
    model, optimizer, before, raw_norm = _large_gradients(scaler)
    assert raw_norm > 100
    optimizer_step(optimizer, scaler, clip_grad_norm=2.0)
    # Plain SGD with lr 1: the update is minus the clipped (unscaled) gradient.
    step = torch.cat([(b - p.detach()).flatten() for b, p in zip(before, model.parameters())])
    assert step.norm().item() == pytest.approx(2.0, rel=1e-4)
    assert all(p.grad is None for p in model.parameters())


def test_no_clipping_by_default():
    scaler = torch.amp.GradScaler('cpu', enabled=False)
    model, optimizer, before, raw_norm = _large_gradients(scaler)
    optimizer_step(optimizer, scaler)
    step = torch.cat([(b - p.detach()).flatten() for b, p in zip(before, model.parameters())])
    assert step.norm().item() == pytest.approx(raw_norm, rel=1e-4)


def test_amp_dtype_choice():
    cpu = torch.device('cpu')
    assert amp_dtype(cpu) == torch.bfloat16
    assert amp_dtype(cpu, 'fp16') == torch.float16 and amp_dtype(cpu, 'bf16') == torch.bfloat16
    with autocast_context(cpu, True, 'fp16'):
        assert torch.mm(torch.randn(2, 2), torch.randn(2, 2)).dtype == torch.float16
    assert set(AMP_DTYPES) == {'bf16', 'fp16'}


# ---- whole runs -----------------------------------------------------------

RECIPE = ('--label_smoothing', '0.1', '--mixup_alpha', '0.4', '--cutmix_alpha', '1.0',
          '--ema_decay', '0.9', '--clip_grad_norm', '5', '--randaugment', '2', '9',
          '--random_erasing', '0.25', '--train_crop', 'random')


@pytest.mark.slow
def test_recipe_run_logs_ema_and_saves_it_with_plain_keys(tiny_synthetic, tmp_path, capsys):
    run(tiny_synthetic, tmp_path, '--n_epochs', '2', '--checkpoint', '1', '--precise_bn', '2',
        '--grad_checkpointing', '--tensorboard', *RECIPE)
    out = capsys.readouterr().out
    assert "against each clip's dominant label" in out and 'ema video acc' in out
    assert 'activation checkpointing of layer1, layer2, layer3, layer4' in out
    rows = read_tsv(tmp_path / 'val.log')
    assert list(rows[0]) == ['epoch', 'loss', 'acc', 'clip_acc', 'ema_loss', 'ema_acc']
    assert all(0 <= float(r['ema_acc']) <= 1 for r in rows)
    ckpt = load_checkpoint(tmp_path / 'save_2.pth')
    assert set(ckpt['ema_state_dict']) == set(ckpt['state_dict'])
    assert ckpt['ema_n_averaged'] == 1 + 2 * 3  # the copy, then 3 steps an epoch
    assert any(not torch.equal(ckpt['ema_state_dict'][k], v) for k, v in ckpt['state_dict'].items()
               if v.is_floating_point())


@pytest.mark.slow
def test_ema_and_mixup_resume_exactly(tiny_synthetic, tmp_path):
    full = tmp_path / 'full'
    args = ('--n_epochs', '3', '--checkpoint', '1', '--no_val', *RECIPE)
    run(tiny_synthetic, full, *args)
    resumed = tmp_path / 'resumed'
    resumed.mkdir()
    shutil.copy(full / 'save_1.pth', resumed / 'save_1.pth')
    run(tiny_synthetic, resumed, *args, '--resume_path', str(resumed / 'save_1.pth'))
    a, b = load_checkpoint(full / 'save_3.pth'), load_checkpoint(resumed / 'save_3.pth')
    for key in ('state_dict', 'ema_state_dict'):
        for name, value in a[key].items():
            assert torch.equal(value, b[key][name]), (key, name)
    assert a['ema_n_averaged'] == b['ema_n_averaged'] == 10
    losses = [[r['loss'] for r in read_tsv(d / 'train.log')] for d in (full, resumed)]
    assert losses[0][1:] == losses[1]  # epochs 2 and 3


@pytest.mark.slow
def test_inference_with_ema_weights(tiny_synthetic, tmp_path):
    """A checkpoint whose EMA classifier always says class 2: inference with
    --inference_weights ema says class 2 for every video, raw does not."""
    run(tiny_synthetic, tmp_path / 'train', '--n_epochs', '1', '--no_val', '--ema_decay', '0.5')
    ckpt = load_checkpoint(tmp_path / 'train' / 'save_1.pth')
    ckpt['ema_state_dict']['fc.weight'].zero_()
    ckpt['ema_state_dict']['fc.bias'].copy_(torch.tensor([0., 0., 20., 0., 0., 0.]))
    save_checkpoint_atomic(ckpt, tmp_path / 'rigged.pth')
    labels = {}
    for weights in ('ema', 'raw'):
        result = tmp_path / weights
        run(tiny_synthetic, result, '--no_train', '--no_val', '--inference', '--resume_path',
            str(tmp_path / 'rigged.pth'), '--inference_weights', weights)
        top = json.loads((result / 'val.json').read_text())['results']
        labels[weights] = {v[0]['label'] for v in top.values()}
    class_names = sorted(labels['ema'] | labels['raw'])
    assert len(labels['ema']) == 1 and labels['raw'] != labels['ema'], class_names


@pytest.mark.slow
def test_inference_weights_ema_needs_ema_in_the_checkpoint(tiny_synthetic, tmp_path, capsys):
    run(tiny_synthetic, tmp_path, '--n_epochs', '1', '--no_val')
    with pytest.raises(SystemExit):
        run(tiny_synthetic, tmp_path / 'eval', '--no_train', '--resume_path',
            str(tmp_path / 'save_1.pth'), '--inference_weights', 'ema')
    assert 'holds no EMA weights' in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run(tiny_synthetic, tmp_path / 'x', '--inference_weights', 'ema')
    assert '--inference_weights ema needs --ema_decay' in capsys.readouterr().err


@pytest.mark.slow
def test_grad_checkpointing_trains_like_the_plain_model(tiny_synthetic, tmp_path):
    for name, extra in (('plain', ()), ('ckpt', ('--grad_checkpointing',))):
        run(tiny_synthetic, tmp_path / name, '--n_epochs', '1', '--no_val', *extra)
    a = load_checkpoint(tmp_path / 'plain' / 'save_1.pth')['state_dict']
    b = load_checkpoint(tmp_path / 'ckpt' / 'save_1.pth')['state_dict']
    assert list(a) == list(b)
    for key in a:
        assert torch.allclose(a[key].float(), b[key].float(), atol=1e-4), key


@pytest.mark.slow
def test_compile_run_reports_compile_time_and_keeps_plain_keys(tiny_synthetic, tmp_path, capsys):
    run(tiny_synthetic, tmp_path, '--n_epochs', '1', '--compile', '--inference',
        '--inference_stride', '8')
    out = capsys.readouterr().out
    assert 'compile: the first training step took' in out
    state = load_checkpoint(tmp_path / 'save_1.pth')['state_dict']
    assert not any(k.startswith(('_orig_mod', 'module')) for k in state)
    assert (tmp_path / 'val.json').exists()


# ---- torch.compile under DDP ---------------------------------------------------

def _conv_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv3d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool3d(1),
                         nn.Flatten(), nn.Linear(4, 3))


def _batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 3, 4, 8, 8, generator=g), torch.randint(0, 3, (4,), generator=g))
            for _ in range(2)]


def _train_compiled(ctx, out_path):
    model = torch.compile(make_parallel(_conv_net(), ctx))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler('cpu', enabled=False)
    data = [(x[ctx.rank * 2:(ctx.rank + 1) * 2], y[ctx.rank * 2:(ctx.rank + 1) * 2])
            for x, y in _batches()]
    train_epoch(1, data, model, nn.CrossEntropyLoss(), Trainer(optimizer, None, scaler), ctx,
                LoopConfig(log_interval=100, progress_bar=False))
    if ctx.rank == 0:
        torch.save(model._orig_mod.module.state_dict(), out_path)


@pytest.mark.slow
def test_compiled_ddp_equals_one_eager_process_with_the_global_batch(tmp_path):
    run_ranks(_train_compiled, 2, str(tmp_path / 'ddp.pt'))
    eager = _conv_net()
    optimizer = torch.optim.SGD(eager.parameters(), lr=0.1)
    train_epoch(1, _batches(), eager, nn.CrossEntropyLoss(),
                Trainer(optimizer, None, torch.amp.GradScaler('cpu', enabled=False)), DistContext(),
                LoopConfig(log_interval=100, progress_bar=False))
    got = torch.load(tmp_path / 'ddp.pt', weights_only=True)
    for key, value in eager.state_dict().items():
        assert torch.allclose(got[key], value, atol=1e-5), key


@pytest.mark.slow
def test_averaged_checkpoint_runs_inference(tiny_synthetic, tmp_path):
    from util_scripts import average_checkpoints
    run(tiny_synthetic, tmp_path, '--n_epochs', '2', '--checkpoint', '1', '--no_val',
        '--ema_decay', '0.5')
    saves = [str(tmp_path / f'save_{e}.pth') for e in (1, 2)]
    for weights in ('raw', 'ema'):
        average_checkpoints.main([*saves, '--weights', weights, '--output',
                                  str(tmp_path / f'avg_{weights}.pth')])
        result = tmp_path / f'infer_{weights}'
        run(tiny_synthetic, result, '--no_train', '--no_val', '--inference', '--resume_path',
            str(tmp_path / f'avg_{weights}.pth'))
        assert len(json.loads((result / 'val.json').read_text())['results']) == 12
    a = load_checkpoint(tmp_path / 'avg_raw.pth')['state_dict']['fc.weight']
    b = load_checkpoint(tmp_path / 'avg_ema.pth')['state_dict']['fc.weight']
    assert not torch.equal(a, b)


# ---- the optimizer steps of train_epoch: accumulation groups, fp16 skips ---------

def _linear_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(6, 3))


def _linear_batches(n, poison=None):
    g = torch.Generator().manual_seed(2)
    data = [(torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g)) for _ in range(n)]
    if poison is not None:  # inf inputs: nan gradients, which an fp16 scaler skips
        data[poison][0][0, 0] = float('inf')
    return data


def test_the_last_partial_accumulation_group_is_its_own_mean():
    """5 micro-batches, accumulation 2: groups (1, 2), (3, 4), (5); the last
    step is batch 5's own gradient, not half of it."""
    data = _linear_batches(5)
    model = _linear_net()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    train_epoch(1, data, model, nn.CrossEntropyLoss(),
                Trainer(optimizer, None, torch.amp.GradScaler('cpu', enabled=False)), DistContext(),
                LoopConfig(accumulation_steps=2, log_interval=100, progress_bar=False))
    by_hand = _linear_net()
    reference = torch.optim.SGD(by_hand.parameters(), lr=1.0)
    criterion = nn.CrossEntropyLoss()
    for group in (data[0:2], data[2:4], data[4:5]):
        sum(criterion(by_hand(x), y) for x, y in group).div(len(group)).backward()
        reference.step()
        reference.zero_grad()
    for a, b in zip(model.parameters(), by_hand.parameters()):
        assert torch.allclose(a, b, atol=1e-6), (a - b).abs().max()


def test_a_step_the_fp16_scaler_skips_advances_neither_ema_nor_schedule():
    from utils.ema import make_ema
    from utils.lr_schedule import LRSchedule, ScheduleConfig
    data = _linear_batches(4, poison=1)
    model = _linear_net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    schedule = LRSchedule(optimizer, ScheduleConfig('cosine', n_epochs=1), 4)
    scaler = torch.amp.GradScaler('cpu', init_scale=2.0 ** 8)  # enabled, as under fp16
    ema = make_ema(model, 0.5)
    states = []
    optimizer.register_step_post_hook(
        lambda *_: states.append({k: v.clone() for k, v in model.state_dict().items()}))
    train_epoch(1, data, model, nn.CrossEntropyLoss(), Trainer(optimizer, schedule, scaler, ema),
                DistContext(), LoopConfig(log_interval=100, progress_bar=False))
    assert scaler.get_scale() == 2.0 ** 7 and len(states) == 3  # step 2 skipped
    assert schedule.scheduler.last_epoch == 3 and ema.n_averaged == 4
    expected = dict(_linear_net().state_dict())
    for state in states:  # the average over the 3 steps that ran
        expected = {k: 0.5 * v + 0.5 * state[k] for k, v in expected.items()}
    for key, value in ema.module.state_dict().items():
        assert torch.allclose(value, expected[key], atol=1e-6), key


# ---- a diverging run: one warning naming --learning_rate ----------------------

def test_the_loss_watch_warns_once_on_nan_or_tenfold_growth_in_the_first_epochs():
    watch = LossWatch(0.1, first_epoch=1)
    assert watch.check(1, 2.0, first_loss=2.3) is None  # falling: no
    assert watch.check(2, 20.0, first_loss=1.5) is None  # 8.7x the run's first step: no
    line = watch.check(3, 23.0, first_loss=20.0)
    assert line == ('warning: the training loss grew from 2.3 (the first step) to 23 (epoch 3): the '
                    'learning rate is likely too high for this data; give a smaller --learning_rate '
                    'than 0.1 (e.g. 0.01)')
    assert watch.check(4, float('nan'), 1.0) is None  # once a run
    assert 'loss is nan in epoch 1:' in LossWatch(0.1, 1).check(1, float('nan'), float('nan'))
    assert 'to 3.1e+09 (epoch 1)' in LossWatch(0.1, 1).check(1, 3.1e9, 1.8)  # within epoch 1
    late = LossWatch(0.1, first_epoch=1)
    assert late.check(1, 1.0, 1.8) is None and late.check(6, 100.0, 90.0) is None  # 5 epochs only
    resumed = LossWatch(0.1, first_epoch=7)  # a resumed run watches its own first epochs
    assert resumed.check(7, 1.0, 1.0) is None and 'epoch 8' in resumed.check(8, 10.0, 9.0)


def test_a_diverging_run_names_the_learning_rate_once(tiny_synthetic, tmp_path, capsys):
    run(tiny_synthetic, tmp_path, '--n_epochs', '3', '--no_val', '--learning_rate', '1000')
    lines = [line for line in capsys.readouterr().out.splitlines() if '--learning_rate' in line]
    assert len(lines) == 1 and lines[0].startswith('warning: the training loss'), lines
    assert 'than 1000 (e.g. 100)' in lines[0]
