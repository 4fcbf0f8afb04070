"""The training-recipe pieces on their own: mixup/cutmix, EMA, precise BN,
gradient checkpointing, torch.compile, gradient clipping, clip RandAugment and
erasing, checkpoint averaging; then the same options wired through
training.py and main.py: clipping, amp dtype, EMA in checkpoints, val.log,
resume and inference, mixup with label smoothing, precise BN, activation
checkpointing and torch.compile in whole runs and under DDP."""
import copy
import functools
import json
import shutil

import numpy as np
import pytest
import torch
import torch.nn as nn

import main
from datasets.spatial_transforms import build_train_transform
from model import make_parallel
from models import densenet, resnet
from tests.conftest import OneStageResNet, tiny_args
from training import LoopConfig, LossWatch, Trainer, optimizer_step, train_epoch
from util_scripts import average_checkpoints
from utils.checkpoint import load_checkpoint, save_checkpoint_atomic
from utils.distributed import DistContext, unwrap
from utils.ema import ema_checkpoint_entries, load_ema, make_ema, update_ema
from utils.grad_checkpoint import enable_grad_checkpointing
from utils.logs import read_tsv
from utils.mix import MixConfig, mix_batch
from utils.precise_bn import recompute_bn_stats
from utils.precision import AMP_DTYPES, amp_dtype, autocast_context

CPU = DistContext()
pytestmark = pytest.mark.usefixtures('one_torch_thread', 'no_curves')


def tiny_resnet(seed=0, n_classes=5):
    torch.manual_seed(seed)
    return resnet.generate_model(10, n_classes=n_classes, widen_factor=0.25)


def labelled_clips(n=6, t=4, size=16):
    """Clip i is filled with i + 1 (plus nothing else): the source of every
    pixel of a mixed clip can be read off its value."""
    clips = torch.arange(1, n + 1, dtype=torch.float32).view(n, 1, 1, 1, 1)
    return clips.expand(n, 3, t, size, size).contiguous(), torch.arange(n) % 5


# ---- mixup / cutmix -------------------------------------------------------

def test_cutmix_targets_sum_to_one_and_match_the_pasted_area():
    clips, labels = labelled_clips()
    config = MixConfig(cutmix_alpha=1.0)
    rng = np.random.default_rng(0)
    for _ in range(20):
        out = mix_batch(clips, labels, 5, config, rng)
        assert torch.allclose(out.targets.sum(1), torch.ones(6))
        for i in range(6):
            pasted = (out.clips[i] == 6 - i).float().mean().item()  # from clip 5 - i
            assert pasted == pytest.approx(1 - out.lam, abs=1e-6)
            expected = torch.zeros(5)
            expected[labels[i]] += out.lam
            expected[labels[5 - i]] += 1 - out.lam
            assert torch.allclose(out.targets[i], expected)
        assert torch.equal(out.dominant, labels if out.lam >= 0.5 else labels.flip(0))


def test_cutmix_uses_one_box_for_every_frame_and_channel():
    clips, labels = labelled_clips(t=8)
    rng = np.random.default_rng(1)
    seen_partial = False
    for _ in range(10):
        out = mix_batch(clips, labels, 5, MixConfig(cutmix_alpha=1.0), rng)
        mask = out.clips != clips
        assert torch.equal(mask, mask[:, :1, :1].expand_as(mask))
        # The pasted region is a rectangle.
        rows, cols = mask[0, 0, 0].any(1), mask[0, 0, 0].any(0)
        assert torch.equal(mask[0, 0, 0], rows[:, None] & cols[None, :])
        seen_partial |= 0 < out.lam < 1
    assert seen_partial


def test_mixup_is_the_weighted_sum_with_the_mirrored_clip():
    clips, labels = labelled_clips()
    clips = clips + torch.rand_like(clips)
    out = mix_batch(clips, labels, 5, MixConfig(mixup_alpha=0.4), np.random.default_rng(2))
    lam = out.lam
    assert 0 < lam < 1
    assert torch.allclose(out.clips, lam * clips + (1 - lam) * clips.flip(0))
    assert torch.allclose(out.targets.sum(1), torch.ones(6))


def test_mix_prob_and_switch_and_determinism():
    clips, labels = labelled_clips()
    out = mix_batch(clips, labels, 5, MixConfig(mixup_alpha=1.0, prob=0.0),
                    np.random.default_rng(0))
    assert out.clips is clips and out.targets is labels and out.lam == 1.0
    kinds = set()
    for seed in range(20):
        a = mix_batch(clips, labels, 5, MixConfig(1.0, 1.0), np.random.default_rng(seed))
        b = mix_batch(clips, labels, 5, MixConfig(1.0, 1.0), np.random.default_rng(seed))
        assert torch.equal(a.clips, b.clips) and a.lam == b.lam
        # Mixup gives values between two clips' values; cutmix only whole ones.
        kinds.add(bool((a.clips != a.clips.round()).any()))
    assert kinds == {True, False}


def test_soft_targets_loss_with_label_smoothing_is_crossentropys_own():
    logits = torch.randn(4, 5)
    labels = torch.tensor([0, 3, 1, 1])
    soft = nn.functional.one_hot(labels, 5).float()
    eps = 0.1
    crit = nn.CrossEntropyLoss(label_smoothing=eps)
    smoothed = soft * (1 - eps) + eps / 5
    by_hand = -(smoothed * logits.log_softmax(1)).sum(1).mean()
    assert crit(logits, soft).item() == pytest.approx(by_hand.item(), rel=1e-6)
    assert crit(logits, labels).item() == pytest.approx(by_hand.item(), rel=1e-6)


# ---- EMA ------------------------------------------------------------------

class TinyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x):
        return self.bn(self.fc(x))


def _train_steps(model, ema, k, seed=0):
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    history = []
    for _ in range(k):
        x = torch.randn(8, 3, generator=gen)
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        if ema is not None:
            update_ema(ema, model)
        history.append({k: v.clone() for k, v in model.state_dict().items()})
    return history


def test_ema_after_k_steps_equals_the_hand_computed_average():
    torch.manual_seed(0)
    model = TinyNet()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    decay = 0.9
    ema = make_ema(model, decay)
    history = _train_steps(model, ema, 4)
    for key in ('fc.weight', 'fc.bias', 'bn.weight', 'bn.running_mean', 'bn.running_var'):
        expected = start[key]
        for state in history:
            expected = decay * expected + (1 - decay) * state[key]
        assert torch.allclose(ema.module.state_dict()[key], expected, atol=1e-6), key
    assert not torch.allclose(ema.module.fc.weight, model.fc.weight)
    assert int(ema.n_averaged) == 5


def test_ema_resume_is_exact():
    torch.manual_seed(0)
    model = TinyNet()
    ema = make_ema(model, 0.8)
    _train_steps(model, ema, 3, seed=1)
    saved_model = copy.deepcopy(model.state_dict())
    saved = copy.deepcopy(ema_checkpoint_entries(ema))
    _train_steps(model, ema, 3, seed=2)

    torch.manual_seed(5)
    resumed_model = TinyNet()
    resumed_model.load_state_dict(saved_model)
    resumed = make_ema(resumed_model, 0.8)
    assert load_ema(resumed, saved, 'save_3.pth')
    _train_steps(resumed_model, resumed, 3, seed=2)
    for key, value in ema.module.state_dict().items():
        assert torch.equal(resumed.module.state_dict()[key], value), key
    assert resumed.n_averaged == ema.n_averaged == 7
    assert set(saved['ema_state_dict']) == set(model.state_dict())  # plain keys


def test_ema_equals_averaged_model_bit_for_bit():
    """The same arithmetic as torch's AveragedModel(get_ema_multi_avg_fn,
    use_buffers=True), integer num_batches_tracked included."""
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
    torch.manual_seed(0)
    model = TinyNet()
    reference = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.7), use_buffers=True)
    reference.update_parameters(model)
    ema = make_ema(model, 0.7)
    gen = torch.Generator().manual_seed(3)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(5):
        model(torch.randn(8, 3, generator=gen)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        reference.update_parameters(model)
        update_ema(ema, model)
    expected = reference.module.state_dict()
    assert expected['bn.num_batches_tracked'] > 0
    for key, value in ema.module.state_dict().items():
        assert torch.equal(value, expected[key]), key
    assert ema.n_averaged == int(reference.n_averaged) == 6


def _ops_of_one_update(update):
    """(op name, devices of its tensor arguments) of every aten op `update` runs."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            devices = {a.device.type for a in tree_leaves((args, kwargs or {}))
                       if isinstance(a, torch.Tensor)}
            self.ops.append((str(func), devices))
            return func(*args, **(kwargs or {}))
    with Record() as record:
        update()
    return record.ops


def test_ema_update_moves_nothing_between_host_and_device():
    """On a device (meta stands in for a GPU), an update only reads and
    writes that device's tensors: AveragedModel copies its CPU count there
    for every dtype group, every step (a blocking host/device sync on GPUs)."""
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
    model = TinyNet().to('meta')
    reference = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9), use_buffers=True)
    reference.update_parameters(model)
    assert any('cpu' in devices for _, devices in _ops_of_one_update(
        lambda: reference.update_parameters(model)))  # the stand-in shows the copy
    ema = make_ema(model, 0.9)
    ops = _ops_of_one_update(lambda: update_ema(ema, model))
    assert ops and all(devices == {'meta'} for _, devices in ops), ops
    assert not any('_to_copy' in name for name, _ in ops)
    assert any('_foreach_lerp_' in name for name, _ in ops)
    assert isinstance(ema.n_averaged, int) and ema.n_averaged == 2


# ---- precise BN -----------------------------------------------------------

def _batches(n, seed, size=16):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(4, 3, 4, size, size, generator=gen) * (i + 1) for i in range(n)]


def test_precise_bn_recomputes_statistics_and_nothing_else():
    model = tiny_resnet()
    model.train()
    for clips in _batches(2, 9):
        model(clips)  # running statistics from training
    model.layer1.eval()  # as if frozen by fine-tuning
    before = copy.deepcopy(model.state_dict())
    batches = _batches(3, 1)
    # By hand for the first BN: the mean of the per-batch means and unbiased variances.
    inputs = [model.conv1(b) for b in batches]
    means = torch.stack([x.mean((0, 2, 3, 4)) for x in inputs]).mean(0)
    variances = torch.stack([x.var((0, 2, 3, 4), unbiased=True) for x in inputs]).mean(0)
    assert recompute_bn_stats(model, batches, CPU) == 3
    after = model.state_dict()
    assert torch.allclose(after['bn1.running_mean'], means, atol=1e-5)
    assert torch.allclose(after['bn1.running_var'], variances, rtol=1e-4)
    for key, value in before.items():
        changed = not torch.equal(after[key], value)
        is_stat = key.endswith(('running_mean', 'running_var')) and not key.startswith('layer1')
        assert changed == is_stat, key
    assert model.bn1.momentum == 0.1 and model.training and not model.layer1.training


def _precise_bn_rank(ctx, out_dir):
    model = tiny_resnet()
    model.train()
    recompute_bn_stats(model, _batches(2, 10 + ctx.rank), ctx)
    torch.save(model.state_dict(), f'{out_dir}/rank{ctx.rank}.pt')


@pytest.mark.slow
def test_precise_bn_averages_over_ranks(tmp_path, rank_pool):
    rank_pool.run(_precise_bn_rank, str(tmp_path))
    singles = []
    for rank in (0, 1):
        model = tiny_resnet()
        model.train()
        recompute_bn_stats(model, _batches(2, 10 + rank), CPU)
        singles.append(model.state_dict())
    for rank in (0, 1):
        got = torch.load(tmp_path / f'rank{rank}.pt', weights_only=True)
        for key in ('bn1.running_mean', 'layer4.0.bn2.running_var'):
            assert torch.allclose(got[key], (singles[0][key] + singles[1][key]) / 2, atol=1e-6)


# ---- gradient checkpointing and torch.compile --------------------------------

def _outputs_and_grads(model, clips):
    model.train()
    out = model(clips)
    out.square().sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return out.detach(), grads, copy.deepcopy(model.state_dict())


@pytest.mark.parametrize('family', ['resnet', 'densenet'])
@pytest.mark.slow
def test_grad_checkpointing_matches_eager(family):
    def build():
        torch.manual_seed(0)
        if family == 'resnet':
            return tiny_resnet()
        return densenet.DenseNet(growth_rate=4, block_config=(1, 2, 1, 1), num_init_features=8,
                                 n_classes=5)
    clips = torch.randn(2, 3, 4, 32, 32)
    eager = build()
    checkpointed = build()
    keys = list(checkpointed.state_dict())
    names = enable_grad_checkpointing(checkpointed)
    assert len(names) == 4 and list(checkpointed.state_dict()) == keys
    out_a, grads_a, state_a = _outputs_and_grads(eager, clips)
    out_b, grads_b, state_b = _outputs_and_grads(checkpointed, clips)
    assert torch.allclose(out_a, out_b, atol=1e-5)
    for name in grads_a:
        assert torch.allclose(grads_a[name], grads_b[name], atol=1e-5, rtol=1e-4), name
    for key in state_a:  # BN statistics counted once, not twice
        assert torch.allclose(state_a[key].float(), state_b[key].float(), atol=1e-6), key
    with torch.no_grad():
        eager.eval()
        checkpointed.eval()
        assert torch.allclose(eager(clips), checkpointed(clips), atol=1e-5)


def test_grad_checkpointing_refuses_a_model_without_stages():
    with pytest.raises(ValueError, match='--grad_checkpointing'):
        enable_grad_checkpointing(TinyNet())


# ---- RandAugment and random erasing on whole clips ----------------------------

def _identical_frames_clip(t=5, size=24):
    g = torch.Generator().manual_seed(0)
    frame = torch.randint(0, 255, (1, 3, size, size), generator=g, dtype=torch.uint8)
    return frame.expand(t, -1, -1, -1).contiguous()


def test_randaugment_changes_the_clip_with_one_draw_for_all_frames():
    clip = _identical_frames_clip()
    tr = build_train_transform(24, train_crop='center', hflip=False, randaugment=(2, 9))
    changed = 0
    for seed in range(10):
        torch.manual_seed(seed)
        out = tr.augment(clip)
        assert out.dtype == torch.uint8 and out.shape == clip.shape
        assert all(torch.equal(out[0], out[t]) for t in range(1, 5))
        changed += not torch.equal(out, clip)
    assert changed >= 8


def test_random_erasing_fills_one_box_per_clip_with_the_mean_gray():
    clip = _identical_frames_clip()
    tr = build_train_transform(24, train_crop='center', hflip=False, random_erasing=1.0,
                               mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5])
    for seed in range(5):
        torch.manual_seed(seed)
        out = tr.augment(clip)
        erased = (out != clip).any(1)  # (T, H, W)
        assert erased.any() and torch.equal(erased, erased[:1].expand_as(erased))
        assert (out.permute(1, 0, 2, 3)[:, erased] == 128).all()
    never = build_train_transform(24, train_crop='center', hflip=False, random_erasing=0.0)
    assert torch.equal(never.augment(clip), clip)


def one_stage_net():
    torch.manual_seed(0)
    return OneStageResNet()


@pytest.mark.slow
@pytest.mark.usefixtures('inductor_in_process')
def test_compiled_model_matches_eager_and_keeps_plain_keys():
    eager = one_stage_net()
    compiled = torch.compile(one_stage_net())
    clips = torch.randn(2, 3, 4, 16, 16)
    out_a, grads_a, _ = _outputs_and_grads(eager, clips)
    out_b, grads_b, _ = _outputs_and_grads(compiled, clips)
    assert torch.allclose(out_a, out_b, atol=1e-4)
    for name, grad in grads_a.items():
        # inductor reorders float32 sums: relative error ~5e-4 here, not bit equality
        error = (grad - grads_b['_orig_mod.' + name]).norm() / grad.norm()
        assert error < 5e-3, (name, error)
    assert list(unwrap(compiled).state_dict()) == list(eager.state_dict())


# ---- checkpoint averaging -------------------------------------------------

def _save(path, model, epoch, arch='resnet-10', **extra):
    save_checkpoint_atomic({'epoch': epoch, 'arch': arch, 'state_dict': model.state_dict(),
                            **extra}, path)


def test_averaging_two_checkpoints_equals_the_hand_average(tmp_path, capsys):
    a, b = tiny_resnet(seed=1), tiny_resnet(seed=2)
    b.bn1.num_batches_tracked.fill_(7)
    _save(tmp_path / 'save_1.pth', a, 1)
    _save(tmp_path / 'save_2.pth', b, 2)
    average_checkpoints.main([str(tmp_path / 'save_1.pth'), str(tmp_path / 'save_2.pth'),
                              '--output', str(tmp_path / 'avg.pth')])
    assert 'averaged 2 checkpoints' in capsys.readouterr().out
    out = load_checkpoint(tmp_path / 'avg.pth')
    assert out['arch'] == 'resnet-10' and out['epoch'] == 2
    sa, sb = a.state_dict(), b.state_dict()
    for key, value in out['state_dict'].items():
        if value.is_floating_point():
            assert torch.allclose(value, (sa[key] + sb[key]) / 2, atol=1e-7), key
    assert out['state_dict']['bn1.num_batches_tracked'].item() == 7
    tiny_resnet().load_state_dict(out['state_dict'])  # loads as a model


def test_averaging_refuses_different_architectures(tmp_path, capsys):
    _save(tmp_path / 'a.pth', tiny_resnet(), 1)
    _save(tmp_path / 'b.pth', tiny_resnet(n_classes=6), 2)
    _save(tmp_path / 'c.pth', tiny_resnet(), 3, arch='resnet-18')
    for other, message in (('b.pth', 'shape'), ('c.pth', 'holds resnet-18')):
        with pytest.raises(SystemExit):
            average_checkpoints.main([str(tmp_path / 'a.pth'), str(tmp_path / other),
                                      '--output', str(tmp_path / 'avg.pth')])
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        average_checkpoints.main([str(tmp_path / 'a.pth'), str(tmp_path / 'b.pth'),
                                  '--weights', 'ema', '--output', str(tmp_path / 'avg.pth')])
    assert 'no ema_state_dict' in capsys.readouterr().err
    assert not (tmp_path / 'avg.pth').exists()


@pytest.mark.slow
@pytest.mark.usefixtures('inductor_in_process')
def test_grad_checkpointing_under_compile_matches_eager():
    """Compiled, checkpoint() takes no context_fn: the recomputation is part of
    the backward graph and BatchNorm statistics are still updated once."""
    eager = one_stage_net()
    checkpointed = one_stage_net()
    assert enable_grad_checkpointing(checkpointed) == ['layer1']
    compiled = torch.compile(checkpointed)
    clips = torch.randn(2, 3, 4, 16, 16)
    out_a, grads_a, state_a = _outputs_and_grads(eager, clips)
    out_b, grads_b, state_b = _outputs_and_grads(compiled, clips)
    assert torch.allclose(out_a, out_b, atol=1e-4)
    for name, grad in grads_a.items():
        error = (grad - grads_b['_orig_mod.' + name]).norm() / grad.norm()
        assert error < 5e-3, (name, error)
    for key, value in state_a.items():
        assert torch.allclose(value.float(), state_b['_orig_mod.' + key].float(), atol=1e-4,
                              rtol=1e-3), key


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
def test_compile_run_reports_compile_time_and_keeps_plain_keys(tiny_synthetic, tmp_path, capsys,
                                                               monkeypatch):
    """main.py's --compile path: training steps through the compiled model, then
    validation and inference (eager, as always). Dynamo and AOT autograd capture
    resnet-10's forward and backward graphs; the aot_eager backend runs them
    without inductor's C++ code generation (40 s of a small CPU for this
    network), which the tests above compare with eager on a one-stage network."""
    monkeypatch.setattr(torch, 'compile', functools.partial(torch.compile, backend='aot_eager'))
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


def _labelled_batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 3, 4, 8, 8, generator=g), torch.randint(0, 3, (4,), generator=g))
            for _ in range(2)]


def _train_compiled(ctx, out_path):
    model = torch.compile(make_parallel(_conv_net(), ctx))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler('cpu', enabled=False)
    data = [(x[ctx.rank * 2:(ctx.rank + 1) * 2], y[ctx.rank * 2:(ctx.rank + 1) * 2])
            for x, y in _labelled_batches()]
    train_epoch(1, data, model, nn.CrossEntropyLoss(), Trainer(optimizer, None, scaler), ctx,
                LoopConfig(log_interval=100, progress_bar=False))
    if ctx.rank == 0:
        torch.save(model._orig_mod.module.state_dict(), out_path)


@pytest.mark.slow
def test_compiled_ddp_equals_one_eager_process_with_the_global_batch(tmp_path, rank_pool):
    rank_pool.run(_train_compiled, str(tmp_path / 'ddp.pt'))
    eager = _conv_net()
    optimizer = torch.optim.SGD(eager.parameters(), lr=0.1)
    train_epoch(1, _labelled_batches(), eager, nn.CrossEntropyLoss(),
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
                    'than 0.1 (e.g. 0.01), or warm up to it (--lr_scheduler cosine --warmup_epochs 2)')
    assert watch.check(4, float('nan'), 1.0) is None  # once a run
    assert 'loss is nan in epoch 1:' in LossWatch(0.1, 1).check(1, float('nan'), float('nan'))
    assert 'to 3.1e+09 (epoch 1)' in LossWatch(0.1, 1).check(1, 3.1e9, 1.8)  # within epoch 1
    late = LossWatch(0.1, first_epoch=1)
    assert late.check(1, 1.0, 1.8) is None and late.check(6, 100.0, 90.0) is None  # 5 epochs only
    resumed = LossWatch(0.1, first_epoch=7)  # a resumed run watches its own first epochs
    assert resumed.check(7, 1.0, 1.0) is None and 'epoch 8' in resumed.check(8, 10.0, 9.0)


def test_the_loss_watch_names_nan_at_any_epoch_and_a_tenfold_validation_loss():
    watch = LossWatch(0.1, first_epoch=1)
    assert watch.check(1, 1.0, 1.8, val_loss=2.0) is None
    assert watch.check(2, 0.5, 0.9, val_loss=0.5) is None  # the lowest: 0.5 (epoch 2)
    assert watch.check(3, 0.2, 0.3, val_loss=4.9) is None  # 9.8x
    line = watch.check(4, 0.1, 0.2, val_loss=5.0)
    assert line.startswith('warning: the validation loss grew from 0.5 (epoch 2) to 5 (epoch 4): the '
                           'learning rate is likely too high') and '--warmup_epochs' in line
    assert watch.check(5, 0.1, 0.2, val_loss=50.0) is None  # once a run
    assert 'training loss is inf in epoch 9:' in watch.check(9, float('inf'), 0.2)  # past the first epochs
    late_nan = LossWatch(0.1, first_epoch=1)
    assert late_nan.check(1, 1.0, 1.0, 1.0) is None
    line = late_nan.check(12, float('nan'), float('nan'), float('nan'))  # one line for both
    assert 'training loss is nan in epoch 12' in line and late_nan.check(13, 1.0, 1.0, float('nan')) \
        == late_nan._line('validation loss is nan in epoch 13 (lowest 1, epoch 1)')


def test_a_diverging_run_names_the_learning_rate_once(tiny_synthetic, tmp_path, capsys):
    run(tiny_synthetic, tmp_path, '--n_epochs', '3', '--no_val', '--learning_rate', '1000')
    lines = [line for line in capsys.readouterr().out.splitlines() if '--learning_rate' in line]
    assert len(lines) == 1 and lines[0].startswith('warning: the training loss'), lines
    assert 'than 1000 (e.g. 100)' in lines[0]
