"""Process-group set-up and the few collectives the training loop needs.

One process per device. Launched by torchrun (RANK, LOCAL_RANK, WORLD_SIZE in
the environment), by the deprecated torch.distributed.launch (--local-rank), or
by main.py itself (--distributed without a launcher spawns one process per
visible GPU and uses --dist_url / --world_size / --node_rank).
"""
import datetime
import os
import re
import socket
import warnings
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

from utils.errors import LaunchError

# The differentiable all_reduce is deprecated in favour of functional
# collectives that have no autograd support yet; it is the one that works here.
warnings.filterwarnings('ignore', message='torch.distributed.nn.functional.all_reduce is deprecated')


@dataclass
class DistContext:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device('cpu')
    distributed: bool = False
    # Small host-side collectives (stop flags, gathered results) go through a
    # gloo group: never through GPU memory, no device synchronisation. None is
    # the default group, itself gloo on CPU.
    cpu_group: object = None

    @property
    def is_main(self):
        return self.rank == 0


def free_port():
    """A TCP port free on loopback now (for single-node launches and tests)."""
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def launched_by_torchrun():
    return 'RANK' in os.environ and 'WORLD_SIZE' in os.environ


def launched_by_srun(environ=os.environ):
    """A process of an srun job step (srun sets SLURM_STEP_NUM_TASKS; the batch
    script itself, which must not wait for peers, has no step)."""
    return 'SLURM_PROCID' in environ and 'SLURM_STEP_NUM_TASKS' in environ


def launched_by_a_launcher():
    return launched_by_torchrun() or launched_by_srun()


def started_as_several(environ=os.environ) -> bool:
    """Started by torchrun or srun as one of several processes: --distributed is
    implied (each would otherwise train alone into the same --result_path)."""
    if launched_by_torchrun():
        return int(environ.get('WORLD_SIZE', 1)) > 1
    return launched_by_srun(environ) and int(environ.get('SLURM_STEP_NUM_TASKS', 1)) > 1


@dataclass(frozen=True)
class LaunchEnv:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int


def first_host(nodelist):
    """The first host of a SLURM node list: 'gpu[07-10,12],cpu3' -> 'gpu07'."""
    first, depth = '', 0
    for ch in nodelist:  # the first entry: up to the first comma outside brackets
        depth += ch == '['
        depth -= ch == ']'
        if ch == ',' and depth == 0:
            break
        first += ch
    # In each bracket keep the first item, and of a range its start.
    return re.sub(r'\[([^\]]*)\]', lambda m: re.split(r'[-,]', m.group(1))[0], first)


def local_rank_from(environ, rank, cli_local_rank, device_count):
    """LOCAL_RANK (torchrun), SLURM_LOCALID (srun), OMPI_COMM_WORLD_LOCAL_RANK
    (mpirun), --local_rank (torch.distributed.launch), else rank % GPUs."""
    for key in ('LOCAL_RANK', 'SLURM_LOCALID', 'OMPI_COMM_WORLD_LOCAL_RANK'):
        if key in environ:
            return int(environ[key])
    if cli_local_rank is not None:
        return cli_local_rank
    return rank % device_count if device_count > 0 else 0


def read_launch_env(environ, cli_local_rank=None, device_count=0):
    """Rank, world size, local rank and master address from torchrun's variables,
    or from SLURM's for `srun python main.py --distributed`."""
    if 'RANK' in environ and 'WORLD_SIZE' in environ:
        rank, world_size = int(environ['RANK']), int(environ['WORLD_SIZE'])
    elif launched_by_srun(environ):
        rank, world_size = int(environ['SLURM_PROCID']), int(environ['SLURM_STEP_NUM_TASKS'])
    else:
        raise LaunchError('--distributed needs a launcher environment (RANK and WORLD_SIZE '
                          'from torchrun, or an srun job step); run under torchrun or srun, '
                          'or let main.py spawn processes')
    nodes = environ.get('SLURM_STEP_NODELIST') or environ.get('SLURM_JOB_NODELIST', '')
    addr = environ.get('MASTER_ADDR') or (first_host(nodes) if nodes else '127.0.0.1')
    # Every task of a job derives the same port from the job id.
    port = environ.get('MASTER_PORT') or 20000 + int(environ.get('SLURM_JOB_ID', 0)) % 20000
    return LaunchEnv(rank, world_size, local_rank_from(environ, rank, cli_local_rank, device_count),
                     addr, int(port))


def select_device(no_cuda, local_rank):
    if not no_cuda and torch.cuda.is_available():
        n = torch.cuda.device_count()
        if local_rank >= n:
            raise LaunchError(f'local rank {local_rank} but only {n} GPU(s) are visible '
                              f'(CUDA_VISIBLE_DEVICES={os.environ.get("CUDA_VISIBLE_DEVICES")}): '
                              f'start at most {n} processes per node')
        torch.cuda.set_device(local_rank)
        return torch.device('cuda', local_rank)
    return torch.device('cpu')


PG_TIMEOUT = datetime.timedelta(minutes=30)


def one_agent_holds_all_ranks(environ, world_size):
    return int(environ.get('LOCAL_WORLD_SIZE', -1)) == world_size


def _launcher_store(launch, environ=os.environ):
    """The store the ranks meet in; a key prefix per restart where that is right.

    torchrun's agent keeps its TCPStore across restarts (static rendezvous, and
    c10d sharing its store with the workers), while init_process_group assumes
    a fresh store: after a restart the new ranks would read the dead ranks'
    addresses. TORCHELASTIC_RESTART_COUNT names the attempt only when one agent
    holds every rank: each node's agent counts its own restarts, and a restart
    caused by another node is a membership change, not counted. Several nodes
    need a fresh store per round instead: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
    (multi_node_store_warning).
    """
    agent_store = environ.get('TORCHELASTIC_USE_AGENT_STORE') == 'True'
    store = dist.TCPStore(launch.master_addr, launch.master_port, launch.world_size,
                          is_master=not agent_store and launch.rank == 0,
                          timeout=PG_TIMEOUT, multi_tenant=not agent_store)
    if not one_agent_holds_all_ranks(environ, launch.world_size):
        return store
    attempt = environ.get('TORCHELASTIC_RESTART_COUNT', '0')
    return dist.PrefixStore(f'resnets3d/attempt_{attempt}', store)


def multi_node_store_warning(environ, world_size):
    """A line for rank 0 when several torchrun agents share their store across
    restarts: a restarted round can then read the dead round's addresses (seen
    as 'Connection refused' on loopback), and no key prefix can tell the rounds
    apart on every node. None when restarts are safe."""
    if environ.get('TORCHELASTIC_USE_AGENT_STORE') != 'True' or \
            one_agent_holds_all_ranks(environ, world_size) or \
            int(environ.get('TORCHELASTIC_MAX_RESTARTS', 0)) == 0:
        return None
    return ('warning: torchrun restarts on several nodes need a fresh store per round: '
            'export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 on every node (docs/distributed.md, elastic restarts)')


def check_backend(backend, device):
    if backend == 'nccl' and device.type != 'cuda':
        raise LaunchError('--dist_backend nccl needs GPUs: drop --no_cuda, or use '
                          '--dist_backend gloo to run on CPU')


def init_distributed(opt, local_rank=None, rank=None, world_size=None):
    """Initialises the process group; returns the DistContext of this process.

    With no arguments, reads the launcher's environment (torchrun or srun).
    main.py's own spawner passes local_rank, rank and world_size explicitly.
    """
    implied = not opt.distributed and started_as_several(os.environ)
    if not (opt.distributed or implied):
        return DistContext(device=select_device(opt.no_cuda, 0))
    launch = None
    if rank is None:
        n_gpus = 0 if opt.no_cuda else torch.cuda.device_count()
        launch = read_launch_env(os.environ, opt.local_rank, n_gpus)
        rank, world_size, local_rank = launch.rank, launch.world_size, launch.local_rank
    device = select_device(opt.no_cuda, local_rank)
    backend = opt.dist_backend or ('nccl' if device.type == 'cuda' else 'gloo')
    check_backend(backend, device)
    init = dict(store=_launcher_store(launch)) if launch else dict(init_method=opt.dist_url)
    kwargs = dict(backend=backend, rank=rank, world_size=world_size, timeout=PG_TIMEOUT, **init)
    if backend == 'nccl':
        kwargs['device_id'] = device  # binds the communicator eagerly, avoids a hang on mismatch
    dist.init_process_group(**kwargs)
    cpu_group = dist.new_group(backend='gloo', timeout=kwargs['timeout']) \
        if backend == 'nccl' else None
    warning = multi_node_store_warning(os.environ, world_size) if launch else None
    if warning and rank == 0:
        print(warning, flush=True)
    if implied and rank == 0:
        print(f'started as one of {world_size} processes by a launcher: distributed training '
              f'(--distributed is implied)', flush=True)
    return DistContext(rank=rank, local_rank=local_rank, world_size=world_size,
                       device=device, distributed=True, cpu_group=cpu_group)


def _set_timeout(timeout, group=None):
    """dist.set_timeout; older releases (torch 2.6 among them, which requirements.txt
    admits) have it under its private name only."""
    setter = getattr(dist, 'set_timeout', None) or dist.distributed_c10d._set_pg_timeout
    setter(timeout, group)


def set_collective_timeout(ctx, seconds):
    """After start-up (which may wait long for other nodes or rank 0's checks),
    a rank that died or froze makes the others' next collective fail after
    `seconds` instead of the 30 minutes of PG_TIMEOUT. dist.set_timeout with
    no group changes only the default group (NCCL's on GPUs): the gloo CPU
    group, which carries the stop flags and the broadcasts around checkpoint
    writes, is set too."""
    if ctx.distributed and seconds and seconds > 0:
        timeout = datetime.timedelta(seconds=seconds)
        _set_timeout(timeout)
        if ctx.cpu_group is not None:
            _set_timeout(timeout, ctx.cpu_group)


def cleanup(ctx):
    if ctx.distributed and dist.is_initialized():
        dist.destroy_process_group()


def barrier(ctx):
    if ctx.distributed:
        if ctx.device.type == 'cuda':
            dist.barrier(device_ids=[ctx.local_rank])
        else:
            dist.barrier()


def all_reduce_sum(tensor, ctx):
    """Sums a tensor over ranks in place (one collective) and returns it."""
    if ctx.distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def gather_objects_to_main(obj, ctx, group=None, timeout=None):
    """List of every rank's obj on rank 0 (None elsewhere), over the CPU group
    (or `group`, whose timeout becomes `timeout` seconds when given)."""
    if not ctx.distributed:
        return [obj]
    group = group or ctx.cpu_group
    if timeout is not None:
        _set_timeout(datetime.timedelta(seconds=timeout), group)
    out = [None] * ctx.world_size if ctx.is_main else None
    dist.gather_object(obj, out, dst=0, group=group)
    return out


@contextmanager
def waiting_group(ctx):
    """A gloo group of its own for the collective that ends work the ranks
    finish far apart (inference over uneven videos and storage), which
    --dist_timeout must not cut short: its timeout is given at the wait
    (gather_objects_to_main). Made while the ranks are in step, at the start
    of that work: a peer that dies meanwhile has its connection closed and
    the wait fails at once. None when not distributed."""
    if not ctx.distributed:
        yield None
        return
    group = dist.new_group(backend='gloo', timeout=PG_TIMEOUT)
    try:
        yield group
    finally:
        dist.destroy_process_group(group)


def broadcast_object(obj, ctx):
    if not ctx.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=ctx.cpu_group)
    return box[0]


def broadcast_buffers(model, ctx):
    """Rank 0's buffers (BatchNorm running statistics) on every rank.

    DDP broadcasts them only before a training forward, whose update then
    differs per rank without synchronised BatchNorm (and so do their EMA
    averages): before validation every rank takes rank 0's, the ones its
    checkpoint saves, so N processes validate the saved model as one does."""
    if not ctx.distributed:
        return
    for buffer in unwrap(model).buffers():
        dist.broadcast(buffer, src=0)


def ddp_options(batchnorm_sync):
    """DistributedDataParallel keyword arguments. Synchronised BatchNorm keeps
    the running statistics equal on every rank, so rank 0's need not be
    broadcast before each forward (they still are once, at wrapping);
    gradients as views of the all-reduce buckets save a copy and the memory
    of a second set of gradients."""
    return {'forward_sync_buffers': not batchnorm_sync, 'gradient_as_bucket_view': True}


class CpuSyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm whose batch statistics are reduced over all ranks.

    torch.nn.SyncBatchNorm only runs on GPUs; this one builds the same
    mathematics from the differentiable all_reduce so CPU/gloo runs (laptop
    debugging, the test suite) see one batch across processes. State-dict keys
    are those of BatchNorm3d.
    """

    def _check_input_dim(self, x):
        if x.dim() < 2:
            raise ValueError(f'expected at least 2D input (got {x.dim()}D input)')

    def forward(self, x):
        if not (self.training and dist.is_available() and dist.is_initialized()):
            return super().forward(x)
        from torch.distributed.nn.functional import all_reduce

        dims = [0] + list(range(2, x.dim()))
        c = x.size(1)
        shape = [1, c] + [1] * (x.dim() - 2)
        count = torch.tensor([x.numel() / c], dtype=x.dtype, device=x.device)
        totals = all_reduce(torch.cat([x.sum(dims), count]))
        n = totals[-1]
        mean = totals[:c] / n
        # Two passes, as BatchNorm does: E[x^2] - mean^2 in float32 loses the
        # variance to cancellation when |mean| >> std (after a ReLU, say).
        centered = x - mean.view(shape)
        var = all_reduce((centered * centered).sum(dims)) / n  # biased, used to normalize
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                momentum = self.momentum if self.momentum is not None else \
                    1.0 / float(self.num_batches_tracked)
                unbiased = var * (n / (n - 1).clamp(min=1))
                self.running_mean.mul_(1 - momentum).add_(momentum * mean.detach())
                self.running_var.mul_(1 - momentum).add_(momentum * unbiased.detach())
        y = centered * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y


def convert_sync_batchnorm(model, device):
    """torch.nn.SyncBatchNorm on GPUs, CpuSyncBatchNorm on CPU."""
    if device.type == 'cuda':
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return _convert_cpu(model)


def _convert_cpu(module):
    out = module
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and \
            not isinstance(module, CpuSyncBatchNorm):
        out = CpuSyncBatchNorm(module.num_features, module.eps, module.momentum,
                               module.affine, module.track_running_stats)
        if module.affine:  # share the Parameters: keeps requires_grad (frozen layers)
            out.weight = module.weight
            out.bias = module.bias
        if module.track_running_stats:
            out.running_mean = module.running_mean
            out.running_var = module.running_var
            out.num_batches_tracked = module.num_batches_tracked
        out.train(module.training)
    for name, child in module.named_children():
        out.add_module(name, _convert_cpu(child))
    return out


def eval_module(model):
    """The network to evaluate, in eval mode: without the DDP wrapper, which
    evaluation does not need, so ranks with different numbers of batches
    never meet in a collective. A torch.compile'd model is evaluated eagerly
    (no recompilation for the evaluation shapes)."""
    model = getattr(model, '_orig_mod', model)
    if isinstance(model, nn.parallel.DistributedDataParallel):
        model = model.module
    return model.eval()


def unwrap(model):
    """The network inside DDP / torch.compile wrappers."""
    while True:
        if hasattr(model, 'module'):
            model = model.module
        elif hasattr(model, '_orig_mod'):
            model = model._orig_mod
        else:
            return model

