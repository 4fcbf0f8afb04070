"""Video clip loading on cache misses, against plain PyAV; clip cost against video
length; decoder threads of a loader worker (the video rows of bench/data_loading.py).

    python -m bench.data_loading --sections videos [--video_clips 120]

Generated 320x240 videos (textured moving content, as bench.data_loading's): H.264
.mp4 with a keyframe every 16 frames and MPEG-4 .avi (a keyframe every 12), 10 s
each, and one 10-minute video of each.  One process, one thread; every clip is 16
random consecutive frames from a different video than the last ones (a fresh open:
the cache misses of training over many videos), converted to RGB, no augmentation.
    plain PyAV: open, seek to the keyframe before the clip, decode to its last
        frame, convert its 16 frames (one decoder thread, one scaler context);
        "+ np.stack": and made one (T, C, H, W) tensor, as a loader must return it
    ours: VideoClipLoader with the run's stored frame indexes (FrameTable), and
        without them (the index demuxed at every open, as before the table)
Every clip is timed in every round (5), the paths in a rotated order, and each
clip's best round counts (other processes share the CPU).
"""
import os
import random
import tempfile
import time
from pathlib import Path

import numpy as np

from datasets.video import VideoClipLoader
from datasets.video_index import FrameTable

CLIP = 16
SHORT, LONG = 250, 15000  # frames: 10 s and 10 min at 25 fps
CODECS = {'mp4': ('libx264', {'preset': 'medium', 'crf': '23', 'g': '16'}),
          'avi': ('mpeg4', {'g': '12', 'b': '800k'})}


def write_video(path, n_frames, codec, options, seed, size=(240, 320), pix_fmt='yuv420p'):
    import av
    rng = np.random.default_rng(seed)
    h, w = size
    base = rng.integers(0, 255, (h // 16 + 1, w // 16 + 1, 3), dtype=np.uint8)
    base = np.kron(base, np.ones((16, 16, 1), dtype=np.uint8))[:h, :w].astype(np.int16)
    noise = rng.integers(-12, 12, (8, h, w, 3), dtype=np.int16)
    with av.open(str(path), 'w') as container:
        stream = container.add_stream(codec, rate=25, options=options)
        stream.width, stream.height, stream.pix_fmt = w, h, pix_fmt
        for f in range(n_frames):
            img = np.clip(np.roll(base, (f, 2 * f), axis=(0, 1)) + noise[f % 8], 0, 255)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(img.astype(np.uint8),
                                                                   format='rgb24')))
        container.mux(stream.encode())


def prepare(root: Path, n_videos: int) -> dict:
    """{(ext, 'short' | 'long'): [paths]}"""
    paths = {}
    for ext, (codec, options) in CODECS.items():
        short = [root / f'short_{v}.{ext}' for v in range(n_videos)]
        for v, path in enumerate(short):
            write_video(path, SHORT, codec, options, seed=v)
        long = root / f'long.{ext}'
        write_video(long, LONG, codec, options, seed=99)
        paths[ext, 'short'], paths[ext, 'long'] = short, [long]
    return paths


def plain_pyav(path, positions, scaler=[]):  # noqa: B006 - one scaler for all calls
    import av
    from av.video.reformatter import VideoReformatter

    from datasets.video_stream import video_stream
    if not scaler:
        scaler.append(VideoReformatter())
    with av.open(str(path)) as container:
        stream = video_stream(container)  # the stream the loaders read
        stream.codec_context.thread_count = 1
        step = 1 / (float(stream.average_rate) * stream.time_base)
        start = stream.start_time or 0
        first, last = (start + round(p * step) for p in (positions[0], positions[-1]))
        container.seek(first, stream=stream, backward=True)
        out = []
        for frame in container.decode(stream):
            if frame.pts >= first:
                out.append(scaler[0].reformat(frame, format='rgb24', threads=1).to_ndarray())
            if frame.pts >= last:
                break
    return out


def plain_stacked(path, positions):
    """plain PyAV, the frames made one (T, C, H, W) tensor as a loader returns them."""
    import torch
    return torch.from_numpy(np.stack(plain_pyav(path, positions))).permute(0, 3, 1, 2)


def loader_fn(table):
    loader = VideoClipLoader(threads=1, frame_table=table)

    def clip(path, positions):
        try:
            return loader(path, positions)
        finally:
            loader.close()  # a fresh open per clip, as over many videos
    return clip


def clip_starts(n_clips, n_frames, seed=0):
    rng = random.Random(seed)
    return [rng.randrange(n_frames - CLIP + 1) for _ in range(n_clips)]


def clip_rows(root: Path, paths: dict, n_clips: int, rounds: int = 5,
              clock=time.perf_counter) -> dict:
    """{(ext, length, path): ms per clip}: every clip is timed in every round, the
    paths in a rotated order each round, and a clip's best round counts (the mean of
    those minima is reported).  The stored table is filled first (a first epoch's job)."""
    table = FrameTable(root / 'frames')
    fill = VideoClipLoader(threads=1, frame_table=table)
    for video_paths in paths.values():
        for p in video_paths:
            fill(p, [0])
    fill.close()
    table.flush()
    fns = {'plain PyAV': plain_pyav, 'plain PyAV + np.stack': plain_stacked,
           'ours': loader_fn(FrameTable(root / 'frames')),
           'ours, index demuxed per open': loader_fn(None)}
    best = {}
    for (ext, length), video_paths in paths.items():
        n_frames = SHORT if length == 'short' else LONG
        starts = clip_starts(n_clips, n_frames)
        for fn in fns.values():
            fn(video_paths[0], list(range(CLIP)))  # warm-up
        for name in fns:
            best[ext, length, name] = [float('inf')] * n_clips
        for k in range(rounds):
            order = list(fns)[k % len(fns):] + list(fns)[:k % len(fns)]
            for i, s in enumerate(starts):
                path = video_paths[i % len(video_paths)]
                for name in order:
                    t = clock()
                    fns[name](path, list(range(s, s + CLIP)))
                    times = best[ext, length, name]
                    times[i] = min(times[i], clock() - t)
    return {key: sum(times) / len(times) * 1e3 for key, times in best.items()}


def worker_threads(paths, n_clips=40) -> tuple[int, int]:
    """Threads of a DataLoader worker before its first clip and after clips of many videos."""
    from torch.utils.data import DataLoader, Dataset

    class Clips(Dataset):
        def __init__(self):
            self.loader, self.first = VideoClipLoader(), None

        def __len__(self):
            return n_clips

        def __getitem__(self, i):  # ints, not tensors: torch's tensor sharing has threads
            if self.first is None:
                self.first = len(os.listdir('/proc/self/task'))
            self.loader(paths[i % len(paths)], list(range(CLIP)))
            return self.first, len(os.listdir('/proc/self/task'))

    counts = list(DataLoader(Clips(), batch_size=None, num_workers=1))
    return counts[0][0], counts[-1][1]


def anonymous_mb() -> float:
    """Anonymous memory of this process (its heap and the pages it copied from its
    parent); a memory-mapped file's pages are not in it, even on tmpfs, where they
    count as dirty."""
    with open('/proc/self/smaps_rollup') as f:
        for line in f:
            if line.startswith('Anonymous:'):
                return int(line.split()[1]) / 1024
    return float('nan')


def write_kinetics_table(folder: Path, n_videos: int) -> None:
    """A FrameTable segment of Kinetics size: 300 frames, 3 keyframes a video."""
    from datasets.frame_index import FrameIndex
    from datasets.video_index import _pack_indexes, _write_segment, path_hash
    pts = np.arange(300, dtype=np.int64) * 512
    keys = np.array([0, 100, 200], np.int32)
    index = FrameIndex(pts, keys, pts[keys], pts[keys], 300)
    entries = [(path_hash(f'/data/kinetics/train/{i:07d}.mp4'), 10**6 + i, i, index)
               for i in range(n_videos)]
    _write_segment(folder / 'frames_0.npy', _pack_indexes(entries))


def table_rows(root: Path, n_videos: int = 650_000, n_lookups: int = 20_000) -> None:
    """The FrameTable at Kinetics size: its file, and the memory a forked worker
    dirties looking videos up in it (the memory map's pages are shared, not copied).
    The table is written by another process, so that this one's heap holds no
    freed Python objects for the worker to reuse (and copy)."""
    import multiprocessing

    from datasets.video_index import _read_segment
    folder = root / 'kinetics_frames'
    folder.mkdir()
    writer = multiprocessing.get_context('spawn').Process(
        target=write_kinetics_table, args=(folder, n_videos))
    writer.start()
    writer.join()
    size = sum(f.stat().st_size for f in folder.iterdir()) / 1e6
    seg = _read_segment(folder / 'frames_0.npy')
    keys = np.stack([seg['hash'].astype(np.int64), seg['size'], seg['mtime']], 1)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a worker
        os.close(read)
        before = anonymous_mb()
        table = FrameTable(folder)
        rng = np.random.default_rng(0)
        t = time.perf_counter()
        for j in rng.integers(0, n_videos, n_lookups):
            h, size_, mtime = keys[j]
            assert table.lookup((int(h) % 2**64, int(size_), int(mtime))) is not None
        us = (time.perf_counter() - t) / n_lookups * 1e6
        os.write(write, f'{anonymous_mb() - before:.2f} {us:.1f}'.encode())
        os._exit(0)
    os.close(write)
    dirtied, us = map(float, os.read(read, 64).split())
    os.waitpid(pid, 0)
    os.close(read)
    print(f'frame table of {n_videos} videos: {size:.0f} MB on disk; a forked worker doing '
          f'{n_lookups} lookups ({us:.0f} us each) grew its anonymous memory by {dirtied:.1f} MB '
          f'(the mapped pages are shared)')


def print_video_rows(best: dict, threads: tuple[int, int], n_videos: int) -> None:
    print(f'\nvideo clips on cache misses: 16 random frames, 320x240, one thread; {n_videos} '
          f'videos of 10 s and one of 10 min per format (ms per clip, best of the rounds)')
    print('| format | path | 10 s video | 10 min video | 10 min / 10 s | plain PyAV / it '
          '(10 s, 10 min) | plain PyAV + stack / it (10 s, 10 min) |')
    print('|---|---|---:|---:|---:|---:|---:|')
    labels = {'mp4': 'H.264 .mp4, keyframe every 16', 'avi': 'MPEG-4 .avi, keyframe every 12'}
    paths = ('plain PyAV', 'plain PyAV + np.stack', 'ours', 'ours, index demuxed per open')
    for ext in CODECS:
        plain = [best[ext, n, 'plain PyAV'] for n in ('short', 'long')]
        stacked = [best[ext, n, 'plain PyAV + np.stack'] for n in ('short', 'long')]
        for name in paths:
            short, long = best[ext, 'short', name], best[ext, 'long', name]
            print(f'| {labels[ext]} | {name} | {short:.2f} | {long:.2f} | {long / short:.2f}x | '
                  f'{plain[0] / short:.0%}, {plain[1] / long:.0%} | '
                  f'{stacked[0] / short:.0%}, {stacked[1] / long:.0%} |')
    print(f'DataLoader worker threads: {threads[0]} before its first clip, {threads[1]} after '
          f'clips of {n_videos} videos (growth {threads[1] - threads[0]}; the result '
          f'queue of the worker has a thread of its own)')


def run(n_videos: int = 12, n_clips: int = 120, clock=time.perf_counter) -> None:
    """``clock``: time.perf_counter (wall) or time.process_time (this process's CPU
    time, for a machine other jobs share)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths = prepare(root, n_videos)
        best = clip_rows(root, paths, n_clips, clock=clock)
        threads = worker_threads(paths['mp4', 'short'])
        print_video_rows(best, threads, n_videos)
        table_rows(root)


if __name__ == '__main__':
    run()
