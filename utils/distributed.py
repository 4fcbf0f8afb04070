"""Process-group set-up and the few collectives the training loop needs.

One process per device. Launched by torchrun (RANK, LOCAL_RANK, WORLD_SIZE in
the environment), by the deprecated torch.distributed.launch (--local-rank), or
by main.py itself (--distributed without a launcher spawns one process per
visible GPU and uses --dist_url / --world_size / --node_rank).
"""
import datetime
import os
import socket
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

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


def select_device(no_cuda, local_rank):
    if not no_cuda and torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device('cuda', local_rank)
    return torch.device('cpu')


PG_TIMEOUT = datetime.timedelta(minutes=30)


def _attempt_store(rank, world_size):
    """The launcher's store, with a key prefix per restart attempt.

    torchrun's static rendezvous keeps one TCPStore across restarts, while
    init_process_group('env://') assumes a fresh store each attempt: after an
    elastic restart the new ranks read the dead ranks' addresses and the gloo
    or NCCL connection hangs or is refused. A prefix per attempt avoids that.
    """
    addr, port = os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT'])
    agent_store = os.environ.get('TORCHELASTIC_USE_AGENT_STORE') == 'True'
    store = dist.TCPStore(addr, port, world_size, is_master=not agent_store and rank == 0,
                          timeout=PG_TIMEOUT, multi_tenant=not agent_store)
    attempt = os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')
    return dist.PrefixStore(f'resnets3d/attempt_{attempt}', store)


def init_distributed(opt, local_rank=None, rank=None, world_size=None):
    """Initialises the process group; returns the DistContext of this process.

    With no arguments, reads torchrun's environment. main.py's own spawner
    passes local_rank, rank and world_size explicitly.
    """
    if not opt.distributed:
        return DistContext(device=select_device(opt.no_cuda, 0))
    if rank is None:
        if not launched_by_torchrun():
            raise RuntimeError('--distributed needs a launcher environment (RANK, WORLD_SIZE); '
                               'run under torchrun, or let main.py spawn processes')
        rank = int(os.environ['RANK'])
        world_size = int(os.environ['WORLD_SIZE'])
        local_rank = int(os.environ.get('LOCAL_RANK', opt.local_rank or 0))
        init = dict(store=_attempt_store(rank, world_size))
    else:
        init = dict(init_method=opt.dist_url)
    device = select_device(opt.no_cuda, local_rank)
    backend = opt.dist_backend or ('nccl' if device.type == 'cuda' else 'gloo')
    kwargs = dict(backend=backend, rank=rank, world_size=world_size, timeout=PG_TIMEOUT, **init)
    if backend == 'nccl':
        kwargs['device_id'] = device  # binds the communicator eagerly, avoids a hang on mismatch
    dist.init_process_group(**kwargs)
    return DistContext(rank=rank, local_rank=local_rank, world_size=world_size,
                       device=device, distributed=True)


def set_collective_timeout(ctx, seconds):
    """After start-up (which may wait long for other nodes or rank 0's checks),
    a rank that died or froze makes the others' next collective fail after
    `seconds` instead of the 30 minutes of PG_TIMEOUT."""
    if ctx.distributed and seconds and seconds > 0:
        dist.set_timeout(datetime.timedelta(seconds=seconds))


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


def gather_objects_to_main(obj, ctx):
    """List of every rank's obj on rank 0 (None elsewhere)."""
    if not ctx.distributed:
        return [obj]
    out = [None] * ctx.world_size if ctx.is_main else None
    dist.gather_object(obj, out, dst=0)
    return out


def broadcast_object(obj, ctx):
    if not ctx.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


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
        count = torch.tensor([x.numel() / x.size(1)], dtype=x.dtype, device=x.device)
        stats = torch.cat([x.sum(dims), (x * x).sum(dims), count])
        stats = all_reduce(stats)
        c = x.size(1)
        n = stats[-1]
        mean = stats[:c] / n
        var = stats[c:2 * c] / n - mean * mean  # biased, used to normalize
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                momentum = self.momentum if self.momentum is not None else \
                    1.0 / float(self.num_batches_tracked)
                unbiased = var * (n / (n - 1).clamp(min=1))
                self.running_mean.mul_(1 - momentum).add_(momentum * mean.detach())
                self.running_var.mul_(1 - momentum).add_(momentum * unbiased.detach())
        shape = [1, c] + [1] * (x.dim() - 2)
        y = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
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

