"""Two gloo processes against one process: the same mathematics with the global
batch (DDP + synchronised BatchNorm), exact validation, gradient accumulation."""
import argparse
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

from datasets.device_batches import DeviceLoader, ToDevice
from datasets.samplers import ShardSampler
from model import make_parallel
from models import resnet
from tests.dist_helpers import main_worker
from training import LoopConfig, OptimizerConfig, Trainer, make_optimizer, train_epoch
from utils import distributed as du
from utils.distributed import CpuSyncBatchNorm, DistContext, convert_sync_batchnorm
from utils.precision import amp_dtype
from validation import val_epoch

SINGLE = DistContext()
N_CLASSES = 4
pytestmark = pytest.mark.usefixtures('one_torch_thread')


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
    train_epoch(1, data, model, nn.CrossEntropyLoss(), Trainer(optimizer, None, scaler), ctx,
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


@pytest.mark.slow
def test_ddp_sync_batchnorm_equals_one_process_with_global_batch(tmp_path, rank_pool):
    reference = train(tiny_resnet, SINGLE, sync_bn=False, accumulation_steps=1, per_rank_micro=8)
    rank_pool.run(_train_worker, 'resnet', True, 1, 4, tmp_path / 'p.pth')
    two = torch.load(tmp_path / 'p.pth', weights_only=True)
    err = max_diff(reference, two)
    print(f'max |w_1proc - w_2proc| with synchronised BN: {err:.3g}')
    assert err < 2e-5


@pytest.mark.slow
def test_ddp_without_sync_bn_differs_only_by_bn_statistics(tmp_path, rank_pool):
    rank_pool.run(_train_worker, 'resnet', False, 1, 4, tmp_path / 'p.pth')
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


@pytest.mark.slow
def test_gradient_accumulation_equals_global_batch(tmp_path, rank_pool):
    reference = train(conv_net, SINGLE, sync_bn=False, accumulation_steps=1, per_rank_micro=8)
    # 2 ranks x 2 micro-batches of 2 clips, all-reduced once per step (no_sync).
    rank_pool.run(_train_worker, 'conv', False, 2, 2, tmp_path / 'p.pth')
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


# The second case has a mean far from 0 against a small spread (as after a ReLU):
# E[x^2] - mean^2 in float32 loses that variance to cancellation.
@pytest.mark.parametrize('scale,offset,atol', [(3.0, 1.0, 1e-5), (0.05, 100.0, 2e-3)],
                         ids=['centred', 'large_mean'])
@pytest.mark.slow
def test_cpu_sync_batchnorm_matches_batchnorm_on_concatenated_batch(tmp_path, scale, offset, atol, rank_pool):
    x = torch.randn(4, 3, 2, 3, 3, generator=torch.Generator().manual_seed(0)) * scale + offset
    rank_pool.run(_sync_bn_worker, x, tmp_path)
    parts = [torch.load(tmp_path / f'r{r}.pth', weights_only=True) for r in range(2)]
    bn = nn.BatchNorm3d(3)
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
    xr = x.clone().requires_grad_(True)
    y = bn(xr)
    # The same per-rank loss weights as the workers used on their halves.
    w = torch.cat([torch.arange(y[:2].numel()).view_as(y[:2]).float() / y[:2].numel()] * 2)
    (y * w).sum().backward()
    assert torch.allclose(torch.cat([p['y'] for p in parts]), y, atol=atol)
    grad_scale = 1 / scale  # dy/dx grows as the spread shrinks
    assert torch.allclose(torch.cat([p['grad'] for p in parts]), xr.grad, atol=atol * grad_scale)
    # Each rank's weight gradient is its own share; DDP sums (averages) them.
    assert torch.allclose(parts[0]['w_grad'] + parts[1]['w_grad'], bn.weight.grad, atol=1e-4 + atol)
    for p in parts:
        assert torch.allclose(p['running_mean'], bn.running_mean, atol=1e-6 * offset)
        assert torch.allclose(p['running_var'], bn.running_var, rtol=1e-3, atol=1e-5)


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
    loader = _val_loader(ctx, n_videos)
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


@pytest.mark.slow
def test_validation_on_two_ranks_equals_one_process_with_odd_video_count(tmp_path, rank_pool):
    one = validate(SINGLE)
    rank_pool.run(validate, tmp_path / 'v.pth')
    two = torch.load(tmp_path / 'v.pth', weights_only=True)
    assert one['n_videos'] == two['n_videos'] == 7  # no padded duplicates
    for key in ('loss', 'acc', 'clip_acc'):
        assert two[key] == pytest.approx(one[key], abs=1e-6), key


@pytest.mark.slow
def test_validation_with_uneven_batch_counts_over_ranks(tmp_path, rank_pool):
    """5 videos in batches of 2: rank 0 runs 2 batches, rank 1 one; evaluation
    must not wait on a collective the other rank never enters."""
    one = validate(SINGLE, n_videos=5)
    rank_pool.run(validate, tmp_path / 'v.pth', 5)
    two = torch.load(tmp_path / 'v.pth', weights_only=True)
    assert two['n_videos'] == 5
    assert two['loss'] == pytest.approx(one['loss'], abs=1e-6)


def _val_loader(ctx, n_videos=7):
    dataset = VideoSet(n_videos)
    loader = torch.utils.data.DataLoader(dataset, batch_size=2, sampler=ShardSampler(
        len(dataset), ctx.rank, ctx.world_size))
    return DeviceLoader(loader, ToDevice(ctx.device), with_targets=True)


def _train_then_validate(ctx, out_path):
    """Each rank trains on its half of every batch without synchronised BN (so
    the BatchNorm running statistics, and their EMA, differ per rank), then
    validates through validation.validate, as main.py's fit does."""
    from utils.ema import make_ema, update_ema
    from validation import validate
    model = make_parallel(tiny_resnet(), ctx, batchnorm_sync=False)
    optimizer = make_optimizer(model, SGD_CONFIG)
    ema = make_ema(model, 0.5)
    model.train()
    for x, y in shard(batches(), ctx, per_rank_micro=4):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        update_ema(ema, model)
    if ctx.rank == 0:  # what the checkpoint holds: rank 0's weights and buffers
        torch.save({'raw': du.unwrap(model).state_dict(), 'ema': ema.module.state_dict()},
                   out_path / 'state.pth')
    stats = validate(1, _val_loader(ctx), model, ema, ctx, loop_config(), None, None)
    if ctx.rank == 0:
        torch.save(stats, out_path / 'stats.pth')


@pytest.mark.slow
def test_validation_without_sync_bn_uses_rank_0s_buffers(tmp_path, rank_pool):
    rank_pool.run(_train_then_validate, tmp_path)
    two = torch.load(tmp_path / 'stats.pth', weights_only=True)
    state = torch.load(tmp_path / 'state.pth', weights_only=True)
    one = {}
    for which in ('raw', 'ema'):
        model = tiny_resnet()
        model.load_state_dict(state[which])
        one[which] = val_epoch(1, _val_loader(SINGLE), model, SINGLE, loop_config())
    print(f"|loss 2 proc - 1 proc|: {abs(two['loss'] - one['raw']['loss']):.3g}, "
          f"EMA {abs(two['ema_loss'] - one['ema']['loss']):.3g}")
    for key in ('loss', 'acc', 'clip_acc'):
        assert two[key] == pytest.approx(one['raw'][key], abs=1e-6), key
    assert torch.equal(two['confusion'], one['raw']['confusion'])
    assert two['ema_loss'] == pytest.approx(one['ema']['loss'], abs=1e-6)
    assert two['ema_acc'] == pytest.approx(one['ema']['acc'], abs=1e-6)


@pytest.mark.slow
def test_inference_after_training_without_sync_bn_scores_the_saved_model(tiny_synthetic, tmp_path,
                                                                          rank_pool, no_curves):
    """No validation between the last training step and inference: the ranks'
    BatchNorm statistics still differ there unless rank 0's are broadcast. (A
    small learning rate keeps the softmax away from 1.0, where it hides them.)"""
    import json

    import main
    from tests.conftest import tiny_args
    views = ('--inference', '--inference_n_clips', '2', '--output_topk', '0')
    rank_pool.run(main_worker, tiny_args(*tiny_synthetic, tmp_path / 'two', '--distributed',
                                         '--n_epochs', '1', '--no_val', '--n_threads', '0',
                                         '--batch_size', '4', '--learning_rate', '1e-4', *views))
    main.main(tiny_args(*tiny_synthetic, tmp_path / 'one', '--no_train', '--no_val',
                        '--resume_path', str(tmp_path / 'two' / 'save_1.pth'), *views))
    two, one = (json.loads((tmp_path / name / 'val.json').read_text())['results']
                for name in ('two', 'one'))
    assert list(two) == list(one)
    assert max(e['score'] for v in one for e in one[v]) < 0.9
    worst = max(abs(a['score'] - b['score']) for v in one for a, b in
                zip(sorted(one[v], key=lambda e: e['label']),
                    sorted(two[v], key=lambda e: e['label'])))
    print(f'max |score 2 proc - 1 proc| {worst:.3g}')
    assert worst < 1e-5


def test_shard_sampler_covers_every_item_once():
    shards = [list(ShardSampler(7, r, 3)) for r in range(3)]
    assert sorted(sum(shards, [])) == list(range(7))


@pytest.mark.slow
def test_validation_confusion_matrix_on_two_ranks_equals_one_process(tmp_path, rank_pool):
    one = validate(SINGLE)
    rank_pool.run(validate, tmp_path / 'v.pth')
    two = torch.load(tmp_path / 'v.pth', weights_only=True)
    assert one['confusion'].shape == (N_CLASSES, N_CLASSES)
    assert int(one['confusion'].sum()) == 7
    assert torch.equal(one['confusion'], two['confusion'])
    # its diagonal is the video accuracy
    assert one['confusion'].diagonal().sum().item() / 7 == pytest.approx(one['acc'])


# --- launchers: torchrun, srun, mpirun; the errors for launches that cannot work

def test_torchrun_variables_come_first():
    env = {'RANK': '3', 'WORLD_SIZE': '8', 'LOCAL_RANK': '1', 'MASTER_ADDR': 'n0',
           'MASTER_PORT': '29500', 'SLURM_PROCID': '0', 'SLURM_STEP_NUM_TASKS': '2',
           'SLURM_LOCALID': '0'}
    assert du.read_launch_env(env) == du.LaunchEnv(3, 8, 1, 'n0', 29500)


def test_srun_variables_give_rank_world_local_rank_and_master():
    env = {'SLURM_PROCID': '5', 'SLURM_STEP_NUM_TASKS': '16', 'SLURM_LOCALID': '1',
           'SLURM_STEP_NODELIST': 'gpu[07-08]', 'SLURM_JOB_NODELIST': 'gpu[07-08]',
           'SLURM_JOB_ID': '123456'}
    assert du.read_launch_env(env, device_count=4) == \
        du.LaunchEnv(5, 16, 1, 'gpu07', 20000 + 123456 % 20000)


def test_the_batch_script_itself_is_not_a_rank():
    # sbatch's shell has SLURM_PROCID and SLURM_NTASKS but no job step.
    env = {'SLURM_PROCID': '0', 'SLURM_NTASKS': '16', 'SLURM_JOB_ID': '1'}
    with pytest.raises(du.LaunchError, match='torchrun or srun'):
        du.read_launch_env(env)


@pytest.mark.parametrize('extra, cli, gpus, expected', [
    ({'LOCAL_RANK': '2'}, None, 8, 2),
    ({'SLURM_LOCALID': '3'}, None, 8, 3),
    ({'OMPI_COMM_WORLD_LOCAL_RANK': '4'}, None, 8, 4),
    ({}, 1, 8, 1),          # torch.distributed.launch's --local-rank
    ({}, None, 4, 11 % 4),  # RANK/WORLD_SIZE only: rank % visible GPUs
    ({}, None, 0, 0),       # CPU
])
def test_local_rank_fallbacks(extra, cli, gpus, expected):
    env = dict(RANK='11', WORLD_SIZE='16', MASTER_ADDR='a', MASTER_PORT='1', **extra)
    assert du.read_launch_env(env, cli, gpus).local_rank == expected


@pytest.mark.parametrize('nodelist, host', [
    ('node1', 'node1'), ('a,b', 'a'), ('gpu[07-10,12],cpu3', 'gpu07'),
    ('rack[1-2]-n[3-4]', 'rack1-n3'), ('x-y[001-004]', 'x-y001'), ('10.0.0.5', '10.0.0.5'),
])
def test_first_host_of_a_slurm_node_list(nodelist, host):
    assert du.first_host(nodelist) == host


def test_local_rank_beyond_the_visible_gpus_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 2)
    with pytest.raises(du.LaunchError, match='local rank 2 but only 2 GPU'):
        du.select_device(False, 2)


def _opt(**kw):
    base = dict(distributed=True, no_cuda=True, dist_backend=None, local_rank=None,
                dist_url='tcp://127.0.0.1:1')
    base.update(kw)
    return argparse.Namespace(**base)


def test_nccl_without_gpus_is_a_clear_error(monkeypatch):
    monkeypatch.setenv('RANK', '0')
    monkeypatch.setenv('WORLD_SIZE', '2')
    monkeypatch.setenv('MASTER_ADDR', '127.0.0.1')
    monkeypatch.setenv('MASTER_PORT', str(du.free_port()))
    with pytest.raises(du.LaunchError, match='--dist_backend nccl needs GPUs'):
        du.init_distributed(_opt(dist_backend='nccl'))  # fails before waiting for rank 1


def test_torchrun_without_distributed_is_taken_as_distributed(monkeypatch):
    """torchrun sets the environment: as a user expects, its processes train as one job
    (the nccl refusal shows the distributed path was taken, before waiting for rank 1)."""
    for name, value in dict(RANK='0', WORLD_SIZE='2', MASTER_ADDR='127.0.0.1',
                            MASTER_PORT=str(du.free_port())).items():
        monkeypatch.setenv(name, value)
    with pytest.raises(du.LaunchError, match='--dist_backend nccl needs GPUs'):
        du.init_distributed(_opt(distributed=False, dist_backend='nccl'))


@pytest.mark.parametrize('environ, several', [
    (dict(RANK='0', WORLD_SIZE='2'), True), (dict(RANK='0', WORLD_SIZE='1'), False),
    (dict(SLURM_PROCID='1', SLURM_STEP_NUM_TASKS='4'), True),
    (dict(SLURM_PROCID='0', SLURM_STEP_NUM_TASKS='1'), False),
    (dict(SLURM_PROCID='0'), False),  # the batch script itself, not a step's task
    ({}, False)])
def test_started_as_several(monkeypatch, environ, several):
    for name in ('RANK', 'WORLD_SIZE', 'SLURM_PROCID', 'SLURM_STEP_NUM_TASKS'):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert du.started_as_several(environ) == several


@pytest.mark.parametrize('local_world, prefixed', [('2', True), ('1', False)])
def test_restart_prefix_only_where_one_agent_holds_every_rank(local_world, prefixed):
    """Each node's agent counts its own restarts: on two nodes their counts
    differ, so the prefix would split the ranks (the two-agent test in
    test_torchrun.py shows the job then recovers)."""
    agent_store = torch.distributed.TCPStore('127.0.0.1', 0, is_master=True,
                                             wait_for_workers=False)  # torchrun's
    launch = du.LaunchEnv(0, 2, 0, '127.0.0.1', agent_store.port)
    env = {'LOCAL_WORLD_SIZE': local_world, 'TORCHELASTIC_RESTART_COUNT': '1',
           'TORCHELASTIC_USE_AGENT_STORE': 'True'}
    store = du._launcher_store(launch, env)
    assert isinstance(store, torch.distributed.PrefixStore) == prefixed
    store.set('k', 'v')
    assert agent_store.check(['resnets3d/attempt_1/k' if prefixed else 'k'])


def test_multi_node_restarts_with_a_shared_store_are_warned_about():
    shared = {'TORCHELASTIC_USE_AGENT_STORE': 'True', 'TORCHELASTIC_MAX_RESTARTS': '3'}
    assert 'TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1' in du.multi_node_store_warning(
        dict(shared, LOCAL_WORLD_SIZE='8'), 16)
    assert du.multi_node_store_warning(dict(shared, LOCAL_WORLD_SIZE='16'), 16) is None  # one node
    assert du.multi_node_store_warning(dict(shared, LOCAL_WORLD_SIZE='8',
                                            TORCHELASTIC_MAX_RESTARTS='0'), 16) is None
    assert du.multi_node_store_warning({'TORCHELASTIC_USE_AGENT_STORE': 'False',
                                        'TORCHELASTIC_MAX_RESTARTS': '3',
                                        'LOCAL_WORLD_SIZE': '8'}, 16) is None  # fresh store


def test_ddp_options_under_synchronised_batchnorm():
    assert du.ddp_options(True) == dict(forward_sync_buffers=False, gradient_as_bucket_view=True)
    assert du.ddp_options(False)['forward_sync_buffers'] is True


@pytest.mark.parametrize('capability, dtype', [((7, 0), torch.float16), ((7, 5), torch.float16),
                                               ((8, 0), torch.bfloat16), ((9, 0), torch.bfloat16)])
def test_amp_dtype_follows_compute_capability(monkeypatch, capability, dtype):
    # is_bf16_supported() says True on a V100 (emulation); the capability decides.
    monkeypatch.setattr(torch.cuda, 'is_bf16_supported', lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda device=None: capability)
    assert amp_dtype(torch.device('cuda', 0)) == dtype
    assert amp_dtype(torch.device('cpu')) == torch.bfloat16


@pytest.mark.slow
def test_gpus_are_hidden_from_unmarked_tests():
    assert not torch.cuda.is_available() and torch.cuda.device_count() == 0
    out = subprocess.run([sys.executable, '-c', 'import torch; print(torch.cuda.device_count())'],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == '0'


@pytest.mark.gpu
def test_gpu_marked_tests_see_the_gpu():
    assert torch.cuda.device_count() >= 1
    assert amp_dtype(torch.device('cuda', 0)) == (
        torch.bfloat16 if torch.cuda.get_device_capability(0) >= (8, 0) else torch.float16)


def test_channels_last_clips_are_normalized_straight_into_that_layout():
    from datasets.spatial_transforms import NormalizeToInput
    norm = NormalizeToInput([0.4, 0.5, 0.6], [0.2, 0.25, 0.3])
    clips = torch.randint(0, 256, (2, 8, 3, 16, 16), dtype=torch.uint8)
    plain = ToDevice(torch.device('cpu'), norm, channels_last=False).clips(clips)
    last = ToDevice(torch.device('cpu'), norm, channels_last=True).clips(clips)
    assert plain.is_contiguous() and last.is_contiguous(memory_format=torch.channels_last_3d)
    assert torch.equal(plain, last)
    # One float copy: the normalizer's output is the tensor handed on.
    out = norm(clips, memory_format=torch.channels_last_3d)
    assert out.is_contiguous(memory_format=torch.channels_last_3d) and torch.equal(out, plain)
