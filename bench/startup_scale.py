"""Start-up at scale under DDP: the time from the process group's start to
every rank holding the training set, on a generated set of many tiny frame
folders (default 20,000 videos of 2 frames of 8x8), 4 gloo processes launched
by torchrun, fresh caches (the record index under data_index/, the frame
check's result) for each run.

    python -m bench.startup_scale                 # 20000 videos, 4 processes
    python -m bench.startup_scale --videos 2000 --nproc 2

Rows: 'every rank' is the start-up before it was shared (each rank reads the
annotation JSON and runs --check_frames itself: dataset._records without the
process group); 'once per node' is today's (local rank 0 builds the index and
checks, the others wait and read its cached index).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TAG = 'STARTUP '
MODES = {'every rank': 'every', 'once per node': 'once'}


def generate(root: Path, n_videos: int, n_frames: int = 2, n_classes: int = 10):
    """root/jpg/<class>/<video>/image_0000k.jpg (one 8x8 JPEG, written n_frames
    times per folder) and a ucf101-style annotation; kept when it exists."""
    annotation = root / f'annotation_{n_videos}.json'
    if annotation.exists():
        return root / 'jpg', annotation
    import numpy as np
    import simplejpeg
    jpeg = simplejpeg.encode_jpeg(np.full((8, 8, 3), 128, dtype=np.uint8))
    database = {}
    for i in range(n_videos):
        label = f'class{i % n_classes}'
        video_id = f'v{i:06d}'
        folder = root / 'jpg' / label / video_id
        folder.mkdir(parents=True, exist_ok=True)
        for p in range(n_frames):
            (folder / f'image_{p + 1:05d}.jpg').write_bytes(jpeg)
        database[video_id] = {'subset': 'training' if i % 10 else 'validation',
                              'annotations': {'label': label, 'segment': [1, n_frames + 1]}}
    labels = [f'class{c}' for c in range(n_classes)]
    annotation.write_text(json.dumps({'labels': labels, 'database': database}))
    return root / 'jpg', annotation


def child(args):
    """One rank: the time to build the training set, between two barriers."""
    import torch
    import torch.distributed as dist

    import dataset as data
    import main
    from utils.distributed import DistContext
    dist.init_process_group('gloo')
    ctx = DistContext(rank=dist.get_rank(), local_rank=int(os.environ['LOCAL_RANK']),
                      world_size=dist.get_world_size(), device=torch.device('cpu'),
                      distributed=True)
    opt = main.parse_opts(['--dataset', 'ucf101', '--video_path', args.video_path,
                           '--annotation_path', args.annotation_path, '--result_path',
                           args.result_path, '--n_classes', '10', '--no_val'])
    record, _ = main.prepare(opt, DistContext())
    dist.barrier()
    t0 = time.perf_counter()
    train_set, _ = data.get_training_data(opt, record, ctx if args.mode == 'once' else None)
    mine = time.perf_counter() - t0
    dist.barrier()
    total = time.perf_counter() - t0
    times = [None] * ctx.world_size
    dist.all_gather_object(times, mine)
    if ctx.rank == 0:
        print(TAG + json.dumps({'total': total, 'ranks': times, 'videos': len(train_set)}),
              flush=True)
    dist.destroy_process_group()


def run(mode, nproc, video_path, annotation, work):
    """(seconds to the last rank's training set, per-rank seconds, videos)."""
    result = Path(tempfile.mkdtemp(prefix=f'{mode}_', dir=work))
    env = dict(os.environ, XDG_CACHE_HOME=str(result / 'cache'), OMP_NUM_THREADS='1',
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get('PYTHONPATH', ''))
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone',
           f'--nproc_per_node={nproc}', '-m', 'bench.startup_scale', '--child', '--mode', mode,
           '--video_path', str(video_path), '--annotation_path', str(annotation),
           '--result_path', str(result / 'run')]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(TAG)]
    if proc.returncode != 0 or not lines:
        sys.exit(f'{mode} run failed (exit {proc.returncode}): {proc.stderr.strip()[-600:]}')
    out = json.loads(lines[-1][len(TAG):])
    return out['total'], out['ranks'], out['videos']


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--videos', type=int, default=20000)
    p.add_argument('--nproc', type=int, default=4)
    p.add_argument('--repeats', type=int, default=1)
    p.add_argument('--work', type=Path, default=Path(tempfile.gettempdir()) / 'startup_scale')
    p.add_argument('--child', action='store_true', help=argparse.SUPPRESS)
    p.add_argument('--mode', choices=sorted(MODES.values()), help=argparse.SUPPRESS)
    for name in ('video_path', 'annotation_path', 'result_path'):
        p.add_argument(f'--{name}', help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    video_path, annotation = generate(args.work, args.videos)
    print(f'{args.videos} frame folders under {video_path} ({time.perf_counter() - t0:.0f} s); '
          f'{args.nproc} gloo processes, --check_frames all, fresh caches each run')
    print('| start-up | training set on every rank (s) | per rank (s) |')
    print('|---|---|---|')
    for _ in range(args.repeats):
        for label, mode in MODES.items():
            total, ranks, n = run(mode, args.nproc, video_path, annotation, args.work)
            print(f'| {label} | {total:.2f} | {" ".join(f"{t:.2f}" for t in ranks)} |',
                  flush=True)
    print(f'({n} training videos)')
    return 0


if __name__ == '__main__':
    sys.exit(main())
