"""Runs a function on N gloo processes (loopback) for the distributed tests."""
import os
import queue
import sys
import time
import traceback
from unittest import mock

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


def _pool_worker(rank, world_size, port, parent_pid, tasks, results):
    import torch._inductor.config as inductor_config
    os.environ['OMP_NUM_THREADS'] = '1'
    torch.set_num_threads(1)
    inductor_config.compile_threads = 1  # no pool of compile workers per rank
    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank,
                            world_size=world_size)
    ctx = DistContext(rank=rank, local_rank=rank, world_size=world_size,
                      device=torch.device('cpu'), distributed=True)
    try:
        while os.getppid() == parent_pid:  # a pytest that died leaves no process waiting
            try:
                task = tasks.get(timeout=1)
            except queue.Empty:
                continue
            if task is None:
                break
            fn, args = task
            try:
                fn(ctx, *args)
                results.put((rank, None))
            except BaseException:
                results.put((rank, traceback.format_exc()))
    finally:
        dist.destroy_process_group()


class RankPool:
    """world_size gloo processes (loopback, one thread each) started at the first
    run() and reused by every later one: a start costs seconds (each process
    imports torch and the project), a task only its own work. run(fn, *args)
    is run_ranks's: fn(ctx, *args) on every rank, fn importable. A rank that
    fails (or a task past `timeout`) ends the processes; the next run() starts
    new ones."""

    def __init__(self, world_size=2):
        self.world_size = world_size
        self.procs = []

    def _start(self):
        context = mp.get_context('spawn')
        self.tasks = [context.Queue() for _ in range(self.world_size)]
        self.results = context.Queue()
        port = free_port()
        # CPU ranks, as under run_ranks in a test
        with mock.patch.dict(os.environ, CUDA_VISIBLE_DEVICES=''):
            self.procs = [context.Process(target=_pool_worker, args=(
                rank, self.world_size, port, os.getpid(), self.tasks[rank], self.results))
                for rank in range(self.world_size)]
            for proc in self.procs:
                proc.start()

    def run(self, fn, *args, timeout=900):
        if not self.procs or not all(p.is_alive() for p in self.procs):
            self.close()
            self._start()
        for tasks in self.tasks:
            tasks.put((fn, args))
        answers, failures = 0, []
        deadline = time.monotonic() + timeout
        while answers < self.world_size:
            try:
                rank, error = self.results.get(timeout=1)
            except queue.Empty:
                exit_codes = [p.exitcode for p in self.procs if not p.is_alive()]
                if exit_codes:  # ended without answering: its process group's start, a signal
                    failures.append(f'a rank process ended (exit code {exit_codes[0]}) without answering')
                elif time.monotonic() > deadline:
                    failures.append(f'{self.world_size - answers} rank(s) gave no answer in time')
                else:
                    continue
                break
            answers += 1
            if error is not None:
                failures.append(f'rank {rank}:\n{error}')
                # The others may wait in a collective for good: 10 s more for their answers.
                deadline = min(deadline, time.monotonic() + 10)
        if failures:
            self.close()
            raise RuntimeError('\n'.join(failures))

    def close(self):
        for proc, tasks in zip(self.procs, getattr(self, 'tasks', [])):
            if proc.is_alive():
                tasks.put(None)
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self.procs = []


def no_drawing(result_path):
    """utils.logs.drawing_command's stand-in: a process that draws nothing."""
    return [sys.executable, '-c', '']


def main_worker(ctx, argv):
    """main.run on this rank, the path torchrun takes after start-up; curves.png
    is not drawn (a matplotlib process an epoch: the tests do not look at it)."""
    import main
    from opts import parse_opts
    with mock.patch('utils.logs.drawing_command', no_drawing):
        main.run(parse_opts(argv), ctx)
