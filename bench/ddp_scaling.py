"""Throughput of DDP training for 1 vs N processes on the same global batch.

    python -m bench.ddp_scaling --nprocs 1 2 --global_batch 8 --steps 10
    python -m bench.ddp_scaling --nprocs 1 8 --device cuda --model_depth 18 \
        --sample_size 112 --sample_duration 16 --global_batch 64   # one 8-GPU node

Data are random tensors already in memory: this measures the model step and
the gradient all-reduce, not data loading (see bench/data_loading.py).
For each process count it prints clips/s and the exposed communication time
per step, measured as (step time with all-reduce) - (step time under
no_sync()). On CPU the processes share the machine's cores (each gets
cores / N threads), so CPU figures show the overhead of the collective, not
the speed-up of adding devices.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

from models import resnet
from utils.distributed import convert_sync_batchnorm, ddp_options, free_port


def _time_steps(model, optimizer, x, y, steps, sync, device):
    criterion = nn.CrossEntropyLoss()
    ctx = model.no_sync if (not sync and isinstance(model, nn.parallel.DistributedDataParallel)) \
        else None
    times = []
    for _ in range(steps):
        if device.type == 'cuda':
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        if ctx is None:
            criterion(model(x), y).backward()
        else:
            with ctx():
                criterion(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == 'cuda':
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]  # median: robust to a slow first step


def _worker(rank, world, port, args, results):
    threads = max(1, (os.cpu_count() or 1) // world)
    torch.set_num_threads(threads)
    if args.device == 'cuda':
        torch.cuda.set_device(rank)
        device = torch.device('cuda', rank)
    else:
        device = torch.device('cpu')
    backend = 'nccl' if device.type == 'cuda' else 'gloo'
    if world > 1:
        dist.init_process_group(backend, init_method=f'tcp://127.0.0.1:{port}', rank=rank,
                                world_size=world)
    torch.manual_seed(0)
    model = resnet.generate_model(args.model_depth, n_classes=args.n_classes,
                                  widen_factor=args.widen_factor)
    if world > 1 and args.sync_bn:
        model = convert_sync_batchnorm(model, device)
    model = model.to(device)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(
            model, device_ids=[rank] if device.type == 'cuda' else None,
            **ddp_options(args.sync_bn))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    per_rank = args.global_batch // world
    x = torch.randn(per_rank, 3, args.sample_duration, args.sample_size, args.sample_size,
                    device=device)
    y = torch.randint(0, args.n_classes, (per_rank,), device=device)
    _time_steps(model, optimizer, x, y, 2, True, device)  # warm-up
    with_comm = _time_steps(model, optimizer, x, y, args.steps, True, device)
    without = _time_steps(model, optimizer, x, y, args.steps, False, device) if world > 1 \
        else with_comm
    if rank == 0:
        results.put((world, threads, with_comm, without))
    if world > 1:
        dist.destroy_process_group()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--nprocs', type=int, nargs='+', default=[1, 2])
    p.add_argument('--device', default='cpu', choices=['cpu', 'cuda'])
    p.add_argument('--global_batch', type=int, default=8)
    p.add_argument('--steps', type=int, default=10)
    p.add_argument('--model_depth', type=int, default=10)
    p.add_argument('--widen_factor', type=float, default=0.5)
    p.add_argument('--n_classes', type=int, default=400)
    p.add_argument('--sample_size', type=int, default=64)
    p.add_argument('--sample_duration', type=int, default=8)
    p.add_argument('--sync_bn', action='store_true')
    args = p.parse_args(argv)
    ctx = mp.get_context('spawn')
    print(f'resnet-{args.model_depth} x{args.widen_factor}, global batch {args.global_batch}, '
          f'clips {args.sample_duration}x{args.sample_size}x{args.sample_size}, '
          f'{args.device}, sync_bn={args.sync_bn}')
    print('| processes | threads each | step ms | clips/s | exposed comm ms/step |')
    print('|---|---|---|---|---|')
    for n in args.nprocs:
        if args.global_batch % n:
            raise SystemExit(f'--global_batch {args.global_batch} is not divisible by {n}')
        results = ctx.SimpleQueue()
        mp.start_processes(_worker, args=(n, free_port(), args, results), nprocs=n,
                           join=True, start_method='spawn')
        world, threads, with_comm, without = results.get()
        print(f'| {world} | {threads} | {with_comm * 1e3:.1f} | '
              f'{args.global_batch / with_comm:.1f} | {(with_comm - without) * 1e3:.1f} |',
              flush=True)


if __name__ == '__main__':
    main()
