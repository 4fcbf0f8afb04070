"""Two gloo processes against one process: the same mathematics with the global
batch (DDP + synchronised BatchNorm), exact validation, gradient accumulation."""

import pytest
import torch
import torch.nn as nn

from datasets.samplers import ShardSampler
from model import make_parallel
from models import resnet
from tests.dist_helpers import run_ranks
from training import LoopConfig, OptimizerConfig, make_optimizer, train_epoch
from utils.distributed import CpuSyncBatchNorm, DistContext, convert_sync_batchnorm
from validation import val_epoch

SINGLE = DistContext()
N_CLASSES = 4


SGD_CONFIG = OptimizerConfig('sgd', 0.01, momentum=0.9, weight_decay=1e-3)


def loop_config(accumulation_steps=1):
    return LoopConfig(accumulation_steps=accumulation_steps, log_interval=100,
                      progress_bar=False)


def tiny_resnet():
    torch.manual_seed(0)
    return resnet.generate_model(10, n_classes=N_CLASSES, widen_factor=0.25)


def conv_net():
    """No BatchNorm: accumulation is then exactly a bigger batch."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv3d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool3d(1),
                         nn.Flatten(), nn.Linear(4, N_CLASSES))


def batches(n_steps=3, batch=8):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, 3, 8, 32, 32, generator=g),
             torch.randint(0, N_CLASSES, (batch,), generator=g)) for _ in range(n_steps)]


def shard(batch_list, ctx, per_rank_micro):
    """Rank r's micro-batches: its slice of each global batch, split further."""
    out = []
    for x, y in batch_list:
        n = x.shape[0] // ctx.world_size
        xs, ys = x[ctx.rank * n:(ctx.rank + 1) * n], y[ctx.rank * n:(ctx.rank + 1) * n]
        for j in range(0, n, per_rank_micro):
            out.append((xs[j:j + per_rank_micro], ys[j:j + per_rank_micro]))
    return out


def train(model_fn, ctx, sync_bn, accumulation_steps, per_rank_micro, out_path=None):
    model = make_parallel(model_fn(), ctx, batchnorm_sync=sync_bn)
    optimizer = make_optimizer(model, SGD_CONFIG)
    scaler = torch.amp.GradScaler('cpu', enabled=False)
    data = shard(batches(), ctx, per_rank_micro)
    train_epoch(1, data, model, nn.CrossEntropyLoss(), optimizer, None, scaler, ctx,
                loop_config(accumulation_steps))
    net = model.module if ctx.distributed else model
    params = {k: v.detach().clone() for k, v in net.named_parameters()}
    if out_path is not None and ctx.rank == 0:
        torch.save(params, out_path)
    return params


def _train_worker(ctx, model_name, sync_bn, accumulation_steps, per_rank_micro, out_path):
    model_fn = {'resnet': tiny_resnet, 'conv': conv_net}[model_name]
    train(model_fn, ctx, sync_bn, accumulation_steps, per_rank_micro, out_path)


def max_diff(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_ddp_sync_batchnorm_equals_one_process_with_global_batch(tmp_path):
    reference = train(tiny_resnet, SINGLE, sync_bn=False, accumulation_steps=1, per_rank_micro=8)
    run_ranks(_train_worker, 2, 'resnet', True, 1, 4, tmp_path / 'p.pth')
    two = torch.load(tmp_path / 'p.pth', weights_only=True)
    err = max_diff(reference, two)
    print(f'max |w_1proc - w_2proc| with synchronised BN: {err:.3g}')
    assert err < 2e-5


def test_ddp_without_sync_bn_differs_only_by_bn_statistics(tmp_path):
    run_ranks(_train_worker, 2, 'resnet', False, 1, 4, tmp_path / 'p.pth')
    two = torch.load(tmp_path / 'p.pth', weights_only=True)
    reference = train(tiny_resnet, SINGLE, sync_bn=False, accumulation_steps=1, per_rank_micro=8)
    assert max_diff(reference, two) > 1e-4  # per-rank BN statistics change the result
    # One process that normalizes each half-batch on its own and averages the
    # two gradients reproduces the two-process run.
    model = tiny_resnet()
    optimizer = make_optimizer(model, SGD_CONFIG)
    model.train()
    for x, y in batches():
        optimizer.zero_grad()
        for half in (slice(0, 4), slice(4, 8)):
            (nn.functional.cross_entropy(model(x[half]), y[half]) / 2).backward()
        optimizer.step()
    simulated = {k: v.detach() for k, v in model.named_parameters()}
    assert max_diff(simulated, two) < 2e-5


def test_gradient_accumulation_equals_global_batch(tmp_path):
    reference = train(conv_net, SINGLE, sync_bn=False, accumulation_steps=1, per_rank_micro=8)
    # 2 ranks x 2 micro-batches of 2 clips, all-reduced once per step (no_sync).
    run_ranks(_train_worker, 2, 'conv', False, 2, 2, tmp_path / 'p.pth')
    two = torch.load(tmp_path / 'p.pth', weights_only=True)
    assert max_diff(reference, two) < 1e-5
    # Also in one process.
    one = train(conv_net, SINGLE, sync_bn=False, accumulation_steps=4, per_rank_micro=2)
    assert max_diff(reference, one) < 1e-5


def _sync_bn_worker(ctx, x, out_path):
    torch.manual_seed(0)
    bn = convert_sync_batchnorm(nn.Sequential(nn.BatchNorm3d(3)), ctx.device)
    assert isinstance(bn[0], CpuSyncBatchNorm)
    with torch.no_grad():
        bn[0].weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
    n = x.shape[0] // ctx.world_size
    xs = x[ctx.rank * n:(ctx.rank + 1) * n].clone().requires_grad_(True)
    y = bn(xs)
    (y * torch.arange(y.numel()).view_as(y).float() / y.numel()).sum().backward()
    torch.save({'y': y.detach(), 'grad': xs.grad, 'w_grad': bn[0].weight.grad,
                'running_mean': bn[0].running_mean, 'running_var': bn[0].running_var},
               out_path / f'r{ctx.rank}.pth')


def test_cpu_sync_batchnorm_matches_batchnorm_on_concatenated_batch(tmp_path):
    x = torch.randn(4, 3, 2, 3, 3) * 3 + 1
    run_ranks(_sync_bn_worker, 2, x, tmp_path)
    parts = [torch.load(tmp_path / f'r{r}.pth', weights_only=True) for r in range(2)]
    bn = nn.BatchNorm3d(3)
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
    xr = x.clone().requires_grad_(True)
    y = bn(xr)
    # The same per-rank loss weights as the workers used on their halves.
    w = torch.cat([torch.arange(y[:2].numel()).view_as(y[:2]).float() / y[:2].numel()] * 2)
    (y * w).sum().backward()
    assert torch.allclose(torch.cat([p['y'] for p in parts]), y, atol=1e-5)
    assert torch.allclose(torch.cat([p['grad'] for p in parts]), xr.grad, atol=1e-5)
    # Each rank's weight gradient is its own share; DDP sums (averages) them.
    assert torch.allclose(parts[0]['w_grad'] + parts[1]['w_grad'], bn.weight.grad, atol=1e-4)
    for p in parts:
        assert torch.allclose(p['running_mean'], bn.running_mean, atol=1e-6)
        assert torch.allclose(p['running_var'], bn.running_var, atol=1e-5)


class VideoSet(torch.utils.data.Dataset):
    """Videos of 2 clips each, as the validation set yields them."""

    def __init__(self, n_videos=7):
        g = torch.Generator().manual_seed(2)
        self.clips = torch.randn(n_videos, 2, 3, 8, 32, 32, generator=g)
        self.targets = torch.randint(0, N_CLASSES, (n_videos,), generator=g)

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, i):
        return self.clips[i], int(self.targets[i])


def validate(ctx, out_path=None, n_videos=7):
    dataset = VideoSet(n_videos)
    loader = torch.utils.data.DataLoader(dataset, batch_size=2,
                                         sampler=ShardSampler(len(dataset), ctx.rank,
                                                              ctx.world_size))
    model = tiny_resnet()
    model.train()
    with torch.no_grad():  # non-trivial running statistics
        model(torch.randn(4, 3, 8, 32, 32))
    model = make_parallel(model, ctx)
    # A training step first, as in a run: DDP then syncs buffers in forward.
    x = torch.randn(2, 3, 8, 32, 32, generator=torch.Generator().manual_seed(0))
    model(x).sum().backward()  # the same batch on every rank: same BN statistics
    model.zero_grad()
    stats = val_epoch(1, loader, model, ctx, loop_config())
    if out_path is not None and ctx.rank == 0:
        torch.save(stats, out_path)
    return stats


def test_validation_on_two_ranks_equals_one_process_with_odd_video_count(tmp_path):
    one = validate(SINGLE)
    run_ranks(validate, 2, tmp_path / 'v.pth')
    two = torch.load(tmp_path / 'v.pth', weights_only=True)
    assert one['n_videos'] == two['n_videos'] == 7  # no padded duplicates
    for key in ('loss', 'acc', 'clip_acc'):
        assert two[key] == pytest.approx(one[key], abs=1e-6), key


def test_validation_with_uneven_batch_counts_over_ranks(tmp_path):
    """5 videos in batches of 2: rank 0 runs 2 batches, rank 1 one; evaluation
    must not wait on a collective the other rank never enters."""
    one = validate(SINGLE, n_videos=5)
    run_ranks(validate, 2, tmp_path / 'v.pth', 5)
    two = torch.load(tmp_path / 'v.pth', weights_only=True)
    assert two['n_videos'] == 5
    assert two['loss'] == pytest.approx(one['loss'], abs=1e-6)


def test_shard_sampler_covers_every_item_once():
    shards = [list(ShardSampler(7, r, 3)) for r in range(3)]
    assert sorted(sum(shards, [])) == list(range(7))


def test_validation_confusion_matrix_on_two_ranks_equals_one_process(tmp_path):
    one = validate(SINGLE)
    run_ranks(validate, 2, tmp_path / 'v.pth')
    two = torch.load(tmp_path / 'v.pth', weights_only=True)
    assert one['confusion'].shape == (N_CLASSES, N_CLASSES)
    assert int(one['confusion'].sum()) == 7
    assert torch.equal(one['confusion'], two['confusion'])
    # its diagonal is the video accuracy
    assert one['confusion'].diagonal().sum().item() / 7 == pytest.approx(one['acc'])
