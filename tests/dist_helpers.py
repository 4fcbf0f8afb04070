"""Runs a function on N gloo processes (loopback) for the distributed tests."""
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from utils.distributed import DistContext, free_port


def _entry(rank, world_size, port, fn, args):
    os.environ['OMP_NUM_THREADS'] = '1'
    torch.set_num_threads(1)
    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank,
                            world_size=world_size)
    try:
        ctx = DistContext(rank=rank, local_rank=rank, world_size=world_size,
                          device=torch.device('cpu'), distributed=True)
        fn(ctx, *args)
    finally:
        dist.destroy_process_group()


def run_ranks(fn, world_size, *args):
    """fn(ctx, *args) on world_size processes; fn must be importable (top level)."""
    mp.spawn(_entry, args=(world_size, free_port(), fn, args), nprocs=world_size, join=True)
