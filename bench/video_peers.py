"""Video clips against the other decoders a PyTorch user would pick: TorchCodec
(CPU), decord2 (the maintained decord fork) and plain PyAV, on the same clips.

    python -m bench.video_peers [--clips 60] [--rounds 3] [--sources ...] [--tasks a b]
                                [--peers ...] [--workers 2 (0: no DataLoader pass)]

Peers are bench-only (requirements-dev.txt).  TorchCodec links the system's FFmpeg
shared libraries (Debian/Ubuntu: ``apt-get install ffmpeg``; conda: ``conda install
ffmpeg``); without them it does not load and is skipped, named with its error, as
is any peer not installed.  Ours needs only PyAV's wheel.

Sources, written with PyAV (bench/video_clips.py's textured moving frames), 10 s at
25 fps, 320x240 and 640x360: H.264 MP4 (CRF 23, B-frames) with a keyframe every 250
and every 12 frames, VP9 WebM, MPEG-4 AVI with B-frames (UCF-101's layout) and HEVC
10-bit MP4.  Every clip is 16 random consecutive frames; each peer opens a fresh
decoder per clip (a DataLoader worker opens one per item), one decoder thread.

Before anything is timed, every peer's frames of the first clips of every source
are compared with ours (torch.equal on uint8 (T, C, H, W)); a peer that returns
other frames is reported with the largest difference and not timed there.

Tasks:
    a  full-size uint8 (T, C, H, W) clips
    b  the training path as each user writes it: ours as VideoDataset does it
       (the crop planned from the frame size, decoding at the reduction it allows,
       RandomResizedCrop(112) of the planned box, flip: build_train_transform(112));
       peers: full-size frames, then torchvision v2 Resize(128), RandomCrop(112),
       RandomHorizontalFlip on uint8
Figures: clips/s of CPU time of this one process (time.process_time: less
sensitive to other jobs on the machine), rounds interleaved (the peers in a rotated
order each round), min and median of the rounds; and wall-clock clips/s of a
DataLoader with --workers workers (one pass per peer, after the CPU rounds).

--peers 'ours, decoding only' (bench-only, not a peer a user would pick): ours for
a clip minus the RGB conversion, crop and resize, the wanted frames decoded and
none converted.  It returns no frames, so it is not compared, and its rate is the
same in both tasks.  With it the tables add 'ceiling: ours decoding only / fastest
peer': a row whose ceiling is under its target (1.0 for a, 1.3 for b) cannot reach
it by any change to the conversion, crop or Python work, only by decoding fewer
packets or with a faster decoder.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

from bench.video_clips import CLIP, plain_stacked, write_video

N_FRAMES = 250  # 10 s at 25 fps
SIZES = {'320x240': (240, 320), '640x360': (360, 640)}
# name: (extension, encoder, options, pixel format)
SOURCES = {
    'H.264 GOP 250': ('mp4', 'libx264', {'preset': 'medium', 'crf': '23', 'g': '250',
                                         'bf': '3'}, 'yuv420p'),
    'H.264 GOP 12': ('mp4', 'libx264', {'preset': 'medium', 'crf': '23', 'g': '12',
                                        'bf': '3'}, 'yuv420p'),
    'VP9 WebM': ('webm', 'libvpx-vp9', {'crf': '32', 'b': '0', 'g': '125', 'deadline': 'good',
                                        'cpu-used': '4'}, 'yuv420p'),
    'MPEG-4 AVI B-frames': ('avi', 'mpeg4', {'g': '12', 'bf': '2', 'b': '800k'}, 'yuv420p'),
    'HEVC 10-bit': ('mp4', 'libx265', {'crf': '28', 'g': '250', 'bf': '3',
                                       'x265-params': 'log-level=error'}, 'yuv420p10le'),
}
TORCHCODEC_FFMPEG = ("TorchCodec needs FFmpeg's shared libraries (4 to 8): apt-get install "
                     "ffmpeg, or conda install ffmpeg")


# ------------------------------------------------------------------------ the peers

def ours_full():
    """Ours: VideoClipLoader, one thread, a fresh open per clip (its stored frame
    index: a run's FrameTable, filled by prepare())."""
    from datasets.video import VideoClipLoader
    loader = VideoClipLoader(threads=1, frame_table=_TABLE[0])

    def clip(path, positions):
        try:
            return loader(path, positions)
        finally:
            loader.close()
    return clip


def decoding_every_frame(ours):
    """``ours`` (a clip function of our loader) decoding every frame before the clip,
    as the loader did before it skipped the non-reference pictures of H.264/HEVC."""
    from datasets import video

    def clip(path, positions):
        skips, video._SKIPS_NONREF = video._SKIPS_NONREF, ()
        try:
            return ours(path, positions)
        finally:
            video._SKIPS_NONREF = skips
    return clip


def ours_every_frame():
    """--peers 'ours, every frame decoded' on full-size clips."""
    return decoding_every_frame(ours_full())


def ours_decoding_only():
    """--peers 'ours, decoding only': what ours does for a clip (a fresh open, the
    frames sought and decoded as VideoClip.decode pulls them) without converting
    any.  Returns the number of wanted frames pulled; ``clip.stats`` is its loader's
    (``'decoded'``: every frame decoded)."""
    from datasets.video import VideoClipLoader
    loader = VideoClipLoader(threads=1, frame_table=_TABLE[0])

    def clip(path, positions):
        try:
            encoded = loader.read(path, positions)
            encoded._peek()  # the first wanted frame (raises if none decodes)
            pulled = 1
            while encoded._next() is not None:
                pulled += 1
            return pulled
        finally:
            loader.close()
    clip.stats = loader.stats
    return clip


def torchcodec_full():
    from torchcodec._core import ops
    from torchcodec.decoders import VideoDecoder
    if not getattr(ops, '_FFMPEG_AVAILABLE', True):  # it imports, but cannot decode video
        raise OSError('libtorchcodec does not load: no FFmpeg shared libraries found')

    def clip(path, positions):
        decoder = VideoDecoder(str(path), device='cpu', num_ffmpeg_threads=1,
                               seek_mode='exact', dimension_order='NCHW')
        return decoder.get_frames_at(positions).data
    return clip


def decord_full():
    import decord

    def clip(path, positions):
        reader = decord.VideoReader(str(path), ctx=decord.cpu(0), num_threads=1)
        frames = torch.from_numpy(reader.get_batch(positions).asnumpy())
        return frames.permute(0, 3, 1, 2)
    return clip


def pyav_full():
    return plain_stacked


DECODING_ONLY = 'ours, decoding only'  # returns no frames: never compared
PEERS: dict[str, Callable[[], Callable]] = {
    'ours': ours_full, 'TorchCodec': torchcodec_full, 'decord2': decord_full,
    'plain PyAV': pyav_full, 'ours, every frame decoded': ours_every_frame,
    DECODING_ONLY: ours_decoding_only}
DEFAULT_PEERS = ['ours', 'TorchCodec', 'decord2', 'plain PyAV']
_TABLE: list = [None]  # the FrameTable ours reads (set by prepare)


def available_peers(names=None) -> tuple[dict, dict]:
    """({name: clip function}, {name: why skipped}) of the peers that load here."""
    names = DEFAULT_PEERS if names is None else names
    found, skipped = {}, {}
    for name in names:
        try:
            found[name] = PEERS[name]()
        except ImportError as e:
            skipped[name] = f'not installed ({e})'
        except (OSError, RuntimeError) as e:  # TorchCodec without FFmpeg's libraries
            why = str(e).strip().splitlines()[0][:160]
            skipped[name] = f'does not load ({why})' + (
                f': {TORCHCODEC_FFMPEG}' if name == 'TorchCodec' else '')
    return found, skipped


def training_path(full: Callable, ours: bool, name: str = 'ours') -> Callable:
    """Task (b) for a peer's clip function: ours as VideoDataset decodes and augments
    (planned crop, reduced-scale decoding, resized crop, flip); a peer's full-size
    frames through v2 Resize(128), RandomCrop(112), RandomHorizontalFlip."""
    from torchvision.transforms import v2
    if name == DECODING_ONLY:  # converts nothing: the same in both tasks
        return full
    if ours:
        from datasets.spatial_transforms import build_train_transform
        from datasets.video import VideoClipLoader
        transform = build_train_transform(112)
        loader = VideoClipLoader(threads=1, frame_table=_TABLE[0])

        def clip(path, positions):
            try:
                encoded = loader.read(path, positions)
                plan = transform.plan(encoded.frame_size)
                factor = plan.reduction(encoded.factors)
                return transform.augment(encoded.decode(factor), plan, factor)
            finally:
                loader.close()
        return decoding_every_frame(clip) if name == 'ours, every frame decoded' else clip
    steps = v2.Compose([v2.Resize(128, antialias=True), v2.RandomCrop(112),
                        v2.RandomHorizontalFlip()])
    return lambda path, positions: steps(full(path, positions))


# ------------------------------------------------------------------------ checking

def check_equal(fns: dict, reference: str, clips: list) -> dict:
    """{peer: None if its frames equal ``reference``'s on every (path, positions) of
    ``clips``, else what differs}: a peer that differs is reported, not timed.
    DECODING_ONLY returns no frames: it is left out."""
    want = [fns[reference](path, positions) for path, positions in clips]
    verdict = {}
    for name, fn in fns.items():
        if name in (reference, DECODING_ONLY):
            continue
        verdict[name] = None
        for (path, positions), ref in zip(clips, want):
            try:
                got = fn(path, positions)
            except Exception as e:  # noqa: BLE001 - a peer failing is its verdict
                verdict[name] = f'fails ({type(e).__name__}: {str(e)[:120]})'
                break
            if got.shape != ref.shape or got.dtype != ref.dtype:
                verdict[name] = (f'other frames: {tuple(got.shape)} {got.dtype} against '
                                 f'{tuple(ref.shape)} {ref.dtype} ({Path(path).name} '
                                 f'frames {positions[0]}-{positions[-1]})')
                break
            if not torch.equal(got, ref):
                diff = (got.int() - ref.int()).abs()
                verdict[name] = (f'other frames: up to {int(diff.max())} levels apart, '
                                 f'{float((diff > 0).float().mean()):.1%} of values '
                                 f'({Path(path).name} frames {positions[0]}-{positions[-1]})')
                break
    return verdict


# ------------------------------------------------------------------------ timing

def cpu_rounds(fns: dict, clips: list, rounds: int) -> dict:
    """{peer: [clips/s of process CPU time, one per round]}; the peers interleaved,
    in a rotated order each round."""
    names = list(fns)
    rates = {name: [] for name in names}
    for name in names:  # warm-up: imports, first allocations
        fns[name](*clips[0])
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            fn = fns[name]
            t = time.process_time()
            for path, positions in clips:
                fn(path, positions)
            rates[name].append(len(clips) / (time.process_time() - t))
    return rates


class _Clips(torch.utils.data.Dataset):
    def __init__(self, make: Callable, clips: list):
        self.make, self.clips, self.fn = make, clips, None

    def __len__(self):
        return len(self.clips)

    def __getitem__(self, i):
        if self.fn is None:  # built in the worker
            self.fn = self.make()
        return self.fn(*self.clips[i])


def loader_rate(make: Callable, clips: list, workers: int) -> float:
    """Wall-clock clips/s of a DataLoader with ``workers`` workers, from its first
    clip on (the workers' start left out)."""
    data = iter(torch.utils.data.DataLoader(_Clips(make, clips), batch_size=None,
                                            num_workers=workers))
    next(data)
    t = time.perf_counter()
    for _ in data:
        pass
    return (len(clips) - 1) / (time.perf_counter() - t)


# ------------------------------------------------------------------------ sources

def prepare(root: Path, sources, sizes, n_clips: int, seed: int = 0) -> dict:
    """{(source, size): [(path, positions)] * n_clips}: 4 videos per source, clips
    over them in turn; their frame indexes stored in a FrameTable for ours."""
    from datasets.video import VideoClipLoader
    from datasets.video_index import FrameTable
    rng = random.Random(seed)
    out = {}
    for source in sources:
        ext, codec, options, pix_fmt = SOURCES[source]
        for size in sizes:
            paths = []
            for v in range(4):
                path = root / f'{source.replace(" ", "_")}_{size}_{v}.{ext}'
                write_video(path, N_FRAMES, codec, dict(options), seed=v, size=SIZES[size],
                            pix_fmt=pix_fmt)
                paths.append(path)
            starts = [rng.randrange(N_FRAMES - CLIP + 1) for _ in range(n_clips)]
            out[source, size] = [(paths[i % 4], list(range(s, s + CLIP)))
                                 for i, s in enumerate(starts)]
    table = FrameTable(root / 'frames')
    fill = VideoClipLoader(threads=1, frame_table=table)
    for clips in out.values():
        for path in {p for p, _ in clips}:
            fill(path, [0])
    fill.close()
    table.flush()
    _TABLE[0] = FrameTable(root / 'frames')
    return out


# ------------------------------------------------------------------------ the run

def _fmt(rates: list) -> str:
    return f'{min(rates):.1f} / {statistics.median(rates):.1f}'


def _over(rates: dict, name: str, peers: list) -> str:
    """``name``'s median clips/s over the fastest peer's ('-' without either)."""
    return f'{statistics.median(rates[name]) / max(peers):.2f}x' if peers and name in rates else '-'


def run_task(task: str, found: dict, skipped: dict, clips_by_source: dict, rounds: int,
             workers: int) -> None:
    names = list(found)
    print(f'\n## task ({task}): ' + ('full-size uint8 (T, C, H, W) clips' if task == 'a' else
                                     'training path to uint8 (T, C, 112, 112)'))
    print('clips/s of CPU time, one process, min / median of the rounds'
          + (f'; DataLoader {workers} workers, wall clips/s' if workers else ''))
    target = 1.0 if task == 'a' else 1.3
    ceiling = DECODING_ONLY in names
    head = ' | '.join(names)
    print(f'| source | size | {head} | ours / fastest peer (median) |'
          + (' ceiling: ours decoding only / fastest peer |' if ceiling else '')
          + (' DataLoader: ' + ', '.join(names) + ' |' if workers else ''))
    print('|---|---|' + '---:|' * (len(names) + 1 + ceiling) + ('---|' if workers else ''))
    for (source, size), clips in clips_by_source.items():
        if task == 'a':
            fns = dict(found)
        else:
            fns = {name: training_path(fn, name.startswith('ours'), name) for name, fn in found.items()}
        # equality on full-size frames (task b's peers draw other crops than ours)
        verdict = check_equal(found, 'ours', clips[:3]) if 'ours' in found else {}
        timed = {n: fn for n, fn in fns.items() if verdict.get(n) is None}
        rates = cpu_rounds(timed, clips, rounds)
        cells = [_fmt(rates[n]) if n in rates else 'not timed' for n in names]
        peers = [statistics.median(rates[n]) for n in rates
                 if n not in ('plain PyAV',) and not n.startswith('ours')]
        ratio = _over(rates, 'ours', peers)
        if ceiling:
            ratio += f' | {_over(rates, DECODING_ONLY, peers)}'
        wall = ''
        if workers:
            makes = {n: (PEERS[n] if task == 'a' else
                         (lambda n=n: training_path(PEERS[n](), n.startswith('ours'), n)))
                     for n in timed}
            wall = ' ' + ', '.join(f'{loader_rate(makes[n], clips, workers):.0f}'
                                   if n in makes else '-' for n in names) + ' |'
        print(f'| {source} | {size} | ' + ' | '.join(cells) + f' | {ratio} |' + wall, flush=True)
        for name, why in verdict.items():
            if why is not None:
                print(f'  {name} on {source} {size}: {why}')
    if ceiling:
        print(f'  {DECODING_ONLY}: not compared (it returns no frames: ours minus the RGB '
              f'conversion, crop and resize); a ceiling under {target}x: the target needs '
              f'fewer packets decoded or a faster decoder')
    for name, why in skipped.items():
        print(f'  skipped {name}: {why}')


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--clips', type=int, default=60)
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--sources', nargs='+', default=list(SOURCES), choices=list(SOURCES))
    parser.add_argument('--sizes', nargs='+', default=list(SIZES), choices=list(SIZES))
    parser.add_argument('--tasks', nargs='+', default=['a', 'b'], choices=['a', 'b'])
    parser.add_argument('--peers', nargs='+', default=DEFAULT_PEERS, choices=list(PEERS))
    parser.add_argument('--workers', type=int, default=2,
                        help='DataLoader workers for the wall-clock column (0: none)')
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f'load average at start: {", ".join(f"{x:.1f}" for x in os.getloadavg())}; '
          f'{os.cpu_count()} cores')
    with tempfile.TemporaryDirectory() as tmp:
        clips = prepare(Path(tmp), args.sources, args.sizes, args.clips)
        found, skipped = available_peers(args.peers)  # after prepare: ours reads its table
        for task in args.tasks:
            run_task(task, found, skipped, clips, args.rounds, args.workers)
    print(f'load average at end: {", ".join(f"{x:.1f}" for x in os.getloadavg())}')


if __name__ == '__main__':
    main()
