"""Intra-op threads against speed, with the machine idle and with busy processes
beside the run: the figures utils/threads.py's default is chosen from.

    python -m bench.threads [--busy 0 3] [--threads 1 2] [--seconds 6] [--demo]

Workloads, each in a fresh process per (threads, busy) cell so that no pool is
reused: 'demo step' (the synthetic demo's training step: ResNet-10 width 0.5,
batch 16 of 8x32x32), 'r18 step' (ResNet-18, batch 2 of 16x112x112, forward,
backward and SGD), 'live window' (the demo model scoring one window, as
predict.py --stream does). A busy process is a Python loop that never sleeps,
as another user's job. --demo also times the README's demo command as a whole
(a fresh data set is not generated: run the demo once first) with the default
threads and with --threads 1. Prints a Markdown table; docs/benchmarks.md keeps it.
"""
import argparse
import multiprocessing as mp
import os
import subprocess
import sys
import time

WORKLOADS = {
    # name: (depth, widen_factor, batch, frames, size, train)
    'demo step': (10, 0.5, 16, 8, 32, True),
    'r18 step': (18, 1.0, 2, 16, 112, True),
    'live window': (10, 0.5, 1, 8, 32, False),
}


def busy_loop():
    while True:
        pass


def measure(workload, threads, seconds, queue):
    import torch
    import torch.nn.functional as F

    from models import resnet
    torch.set_num_threads(threads)
    depth, widen, batch, frames, size, train = WORKLOADS[workload]
    torch.manual_seed(0)
    model = resnet.generate_model(depth, widen_factor=widen, n_classes=6)
    clips = torch.randn(batch, 3, frames, size, size)
    labels = torch.randint(6, (batch,))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step():
        if train:
            model.train()
            F.cross_entropy(model(clips), labels).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        else:
            model.eval()
            with torch.inference_mode():
                model(clips)
    step()  # warm-up
    times, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 3:
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    times.sort()
    queue.put((times[len(times) // 2], times[len(times) * 9 // 10]))


def cell(workload, threads, seconds):
    queue = mp.get_context('spawn').Queue()
    proc = mp.get_context('spawn').Process(target=measure, args=(workload, threads, seconds, queue))
    proc.start()
    result = queue.get()
    proc.join()
    return result


def demo_seconds(threads):
    """Wall seconds of the README's demo command (data set already generated)."""
    result = f'results/bench_threads_{threads}'
    cmd = [sys.executable, 'main.py', '--dataset', 'synthetic', '--result_path', result, '--overwrite',
           '--no_progress'] + (['--threads', str(threads)] if threads else [])
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=dict(os.environ, OMP_NUM_THREADS=''))
    return time.perf_counter() - start


def main(argv=None):
    from utils.threads import default_threads, usable_cpus
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--busy', type=int, nargs='+', default=[0, 3], help='busy processes beside the run')
    p.add_argument('--threads', type=int, nargs='+', default=None,
                   help='thread counts to time (default: 1 to the usable CPUs)')
    p.add_argument('--workloads', nargs='+', default=list(WORKLOADS), choices=list(WORKLOADS))
    p.add_argument('--seconds', type=float, default=6.0, help='timed seconds a cell')
    p.add_argument('--demo', action='store_true', help="also time the demo command, default and --threads 1")
    args = p.parse_args(argv)
    cpus = usable_cpus()
    counts = args.threads or list(range(1, cpus + 1))
    print(f'{cpus} usable CPUs; load average before: {os.getloadavg()[0]:.1f}; default threads: '
          f'{default_threads(1, 2, cpus)} (demo, 2 workers), {default_threads(1, 1, cpus)} (live), '
          f'{default_threads(1, 0, cpus)} (no workers)\n')
    print('| workload | busy processes | ' + ' | '.join(f'{t} thread{"s" * (t > 1)}: median (p90) ms'
                                                     for t in counts) + ' |')
    print('|---|---:|' + '---:|' * len(counts))
    for busy in args.busy:
        hogs = [mp.get_context('spawn').Process(target=busy_loop, daemon=True) for _ in range(busy)]
        for h in hogs:
            h.start()
        try:
            for workload in args.workloads:
                figures = [cell(workload, t, args.seconds) for t in counts]
                print(f'| {workload} | {busy} | ' + ' | '.join(f'{m * 1e3:.1f} ({p * 1e3:.1f})'
                                                            for m, p in figures) + ' |', flush=True)
            if args.demo:
                default, one = demo_seconds(0), demo_seconds(1)
                print(f'| demo command (s) | {busy} | default: {default:.1f} | --threads 1: {one:.1f} |',
                      flush=True)
        finally:
            for h in hogs:
                h.kill()
    return 0


if __name__ == '__main__':
    sys.exit(main())
