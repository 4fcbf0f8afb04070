"""Training-step throughput and peak memory of one model at one clip size, for
each speed/memory lever: fp32, amp, channels_last, compile, grad_checkpointing.

    python -m bench.train_throughput --model resnet-18 --sample_size 112 \
        --sample_duration 16 --batch_size 8 [--steps 10] [--configs fp32 amp ...]

A step is forward, cross-entropy, backward and an SGD step on random clips
(no data loading). Each configuration runs in a fresh process. Memory figures
are above the process's memory between steps (weights and optimizer state
excluded): 'step peak' is the highest point of a step (activations, gradients,
temporaries), 'kept for backward' the memory in use when the forward pass
ends (what activation checkpointing reduces). On a GPU they come from the CUDA
allocator; on CPU from the resident size, its high-water mark reset through
/proc/self/clear_refs, with glibc returning every large block on free
(MALLOC_MMAP_THRESHOLD_). 'compile'
reports its compilation (the warm-up steps) separately. amp is bf16 where supported, else fp16 with a GradScaler;
main.py ignores --amp on CPU, where it is measured here only for reference.
"""
import argparse
import gc
import multiprocessing as mp
import os
import resource
import time

import torch
import torch.nn.functional as F

from util_scripts.model_summary import build
from utils.grad_checkpoint import enable_grad_checkpointing
from utils.precision import amp_dtype

CONFIGS = ('fp32', 'amp', 'channels_last', 'compile', 'grad_checkpointing')


def current_rss_mb():
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def reset_peak_rss():
    with open('/proc/self/clear_refs', 'w') as f:
        f.write('5')  # resets VmHWM (Linux >= 4.0)


def peak_rss_mb():
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith('VmHWM:'):
                return int(line.split()[1]) / 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def memory_mb(device):
    """Memory in use now: the CUDA allocator's, or the process's resident size."""
    if device.type == 'cuda':
        return torch.cuda.memory_allocated(device) / 2**20
    return current_rss_mb()


def make_step(model, config, device):
    """One training step as a function of (clips, labels); returns the memory in
    use between forward and backward (what autograd keeps, plus the rest)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    dtype = amp_dtype(device)
    use_amp = config == 'amp'
    scaler = torch.amp.GradScaler(device.type, enabled=use_amp and dtype == torch.float16)

    def step(clips, labels):
        with torch.autocast(device.type, dtype=dtype, enabled=use_amp):
            loss = F.cross_entropy(model(clips).float(), labels)
        after_forward = memory_mb(device)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        return after_forward
    return step


def sync(device):
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def measure(config, args, device_name, queue):
    """Runs in its own process; puts (config, clips/s, peak MB, kept MB, warm-up s)."""
    torch.set_num_threads(args.threads)
    device = torch.device(device_name)
    torch.manual_seed(0)
    model = build(args.model, args.n_classes, 3)
    if config == 'grad_checkpointing':
        enable_grad_checkpointing(model)
    model = model.to(device).train()
    shape = (args.batch_size, 3, args.sample_duration, args.sample_size, args.sample_size)
    clips = torch.randn(shape, device=device)
    labels = torch.randint(args.n_classes, (args.batch_size,), device=device)
    if config == 'channels_last':
        model = model.to(memory_format=torch.channels_last_3d)
        clips = clips.contiguous(memory_format=torch.channels_last_3d)
    if config == 'compile':
        model = torch.compile(model)
    step = make_step(model, config, device)
    start = time.perf_counter()
    for _ in range(args.warmup):
        step(clips, labels)
    sync(device)
    warmup_s = time.perf_counter() - start
    gc.collect()
    baseline = memory_mb(device)
    if device.type == 'cuda':
        torch.cuda.reset_peak_memory_stats(device)
    else:
        reset_peak_rss()
    start = time.perf_counter()
    kept = max(step(clips, labels) for _ in range(args.steps)) - baseline
    sync(device)
    rate = args.steps * args.batch_size / (time.perf_counter() - start)
    if device.type == 'cuda':
        peak = torch.cuda.max_memory_allocated(device) / 2**20 - baseline
    else:
        peak = peak_rss_mb() - baseline
    queue.put((config, rate, peak, kept, warmup_s))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--model', default='resnet-18', help='<family>-<depth> or a torchvision name')
    p.add_argument('--sample_size', type=int, default=112)
    p.add_argument('--sample_duration', type=int, default=16)
    p.add_argument('--batch_size', type=int, default=8)
    p.add_argument('--n_classes', type=int, default=400)
    p.add_argument('--steps', type=int, default=10, help='timed steps per configuration')
    p.add_argument('--warmup', type=int, default=2, help='untimed steps first (compilation)')
    p.add_argument('--threads', type=int, default=torch.get_num_threads())
    p.add_argument('--configs', nargs='+', choices=CONFIGS, default=list(CONFIGS))
    p.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    args = p.parse_args(argv)
    os.environ.setdefault('MALLOC_MMAP_THRESHOLD_', str(1 << 20))  # read by each child's glibc
    spawn = mp.get_context('spawn')
    queue = spawn.Queue()
    print(f'{args.model}, batch {args.batch_size} x 3x{args.sample_duration}x{args.sample_size}x'
          f'{args.sample_size}, {args.device}, {args.threads} thread(s), {args.steps} timed steps')
    print('| configuration | clips/s | step peak (MB) | kept for backward (MB) | warm-up (s) |')
    print('|---|---:|---:|---:|---:|')
    for config in args.configs:
        proc = spawn.Process(target=measure, args=(config, args, args.device, queue))
        proc.start()
        proc.join()
        if proc.exitcode != 0:
            print(f'| {config} | failed (exit code {proc.exitcode}) | | | |')
            continue
        name, rate, peak, kept, warmup_s = queue.get()
        print(f'| {name} | {rate:.2f} | {peak:.0f} | {kept:.0f} | {warmup_s:.1f} |', flush=True)


if __name__ == '__main__':
    main()
