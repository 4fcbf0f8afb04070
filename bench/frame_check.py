"""Cost of the up-front frame check (--check_frames) at data-set scale.

    python -m bench.frame_check [--n_videos 20000] [--n_frames 50] [--threads 16]

Generates n_videos jpg folders of n_frames files each (empty files: last and
all only look at names) and one bad video, then times check_videos in each
mode over all of them, and a second start answered by the cache. decode reads
and decodes real JPEGs, so it is timed on --decode_videos folders of
--decode_frames 240x320 frames and scaled. Figures: seconds per 100k videos.
The folders are fresh in the page cache; on a cold network file system the
listing costs more (it is one round trip per video, overlapped by the pool).
"""
import argparse
import tempfile
import time
from pathlib import Path

import torch
from torchvision.io import encode_jpeg

from datasets.annotation import VideoRecord
from datasets.frame_check import check_videos
from utils.errors import DataError


def write_videos(root, n_videos, n_frames, size):
    """Real JPEGs (smooth blocks plus noise, so they compress like video frames)."""
    gen = torch.Generator().manual_seed(0)
    h, w = size
    folders = []
    for v in range(n_videos):
        folder = root / f'video_{v}'
        folder.mkdir(parents=True)
        base = torch.randint(0, 255, (3, h // 16, w // 16), generator=gen, dtype=torch.uint8)
        base = base.repeat_interleave(16, 1).repeat_interleave(16, 2).int()
        for f in range(n_frames):
            noise = torch.randint(-20, 20, (3, h, w), generator=gen)
            frame = (base.roll(2 * f, 2) + noise).clamp(0, 255).to(torch.uint8)
            (folder / f'image_{f + 1:05d}.jpg').write_bytes(encode_jpeg(frame, quality=90).numpy())
        folders.append(folder)
    return folders


def make_folders(root, n_videos, n_frames):
    names = [f'image_{p + 1:05d}.jpg' for p in range(n_frames)]
    records = []
    for v in range(n_videos):
        folder = root / f'{v // 1000:03d}' / f'video_{v:06d}'
        folder.mkdir(parents=True)
        for name in names:
            (folder / name).touch()
        records.append(VideoRecord(f'video_{v:06d}', str(folder), 0, n_frames, 0,
                                   (1, n_frames + 1)))
    return records


def timed_check(records, mode, threads, cache_dir=None):
    t0 = time.perf_counter()
    try:
        check_videos(records, 'jpg', mode=mode, n_threads=threads, cache_dir=cache_dir)
        found = 'none'
    except DataError as e:
        found = str(e).splitlines()[0]
    return time.perf_counter() - t0, found


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--n_videos', type=int, default=20000)
    p.add_argument('--n_frames', type=int, default=50)
    p.add_argument('--threads', type=int, default=16)
    p.add_argument('--decode_videos', type=int, default=40)
    p.add_argument('--decode_frames', type=int, default=50)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        records = make_folders(root / 'v', args.n_videos, args.n_frames)
        bad = Path(records[len(records) // 2].path) / f'image_{args.n_frames // 2:05d}.jpg'
        bad.unlink()  # a hole inside one video: only all and decode see it
        print(f'{args.n_videos} folders x {args.n_frames} frames written in '
              f'{time.perf_counter() - t0:.1f}s; threads {args.threads}')
        per = 100_000 / args.n_videos
        for mode in ('last', 'all', 'last', 'all'):  # the first pass also warms the dentries
            seconds, found = timed_check(records, mode, args.threads)
            print(f'{mode:>6}: {seconds:6.2f}s = {seconds * per:6.1f}s per 100k videos '
                  f'| found: {found}')
        bad.touch()
        seconds, _ = timed_check(records, 'all', args.threads, root / 'cache')
        again, _ = timed_check(records, 'all', args.threads, root / 'cache')
        print(f'   all, clean, writes cache: {seconds:6.2f}s; second start (cached): '
              f'{again:.3f}s = {again * per:.2f}s per 100k videos')
        videos = write_videos(root / 'd', args.decode_videos, args.decode_frames, (240, 320))
        dec = [VideoRecord(v.name, str(v), 0, args.decode_frames, 0, (1, args.decode_frames + 1))
               for v in videos]
        seconds, found = timed_check(dec, 'decode', args.threads)
        n = args.decode_videos * args.decode_frames
        print(f'decode: {seconds:6.2f}s for {n} frames of 240x320 = {seconds / n * 1e3:.2f} ms '
              f'per frame = {seconds / n * 300 * 100_000 / 3600:.1f} h per 100k videos of 300 '
              f'frames | found: {found}')


if __name__ == '__main__':
    main()
