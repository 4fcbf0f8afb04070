"""Training clips/s from videos as downloaded (a keyframe every 250 frames) and
the same videos after util_scripts.reencode_videos (a keyframe every 16), and
what the re-encoding costs in disk size and time.

    python -m bench.reencode [--videos 8] [--n_frames 250] [--clips 48] [--rounds 5]
                             [--gop 16] [--clock wall|cpu]

Sources: camera-like frames (bench/loading_frames.py's photo frames, 320x240, 25
fps) written as H.264 .mp4 with x264's defaults (crf 23, preset medium, a
keyframe every 250 frames, as a download's); re-encoded with reencode_video
(--gop, crf 23, preset medium; the short side, 240, is kept). One process, one
thread; each clip is 16 random consecutive frames of a random video read by
main.py's training path for --file_type video (VideoClipDataset over
VideoClipLoader, random resized crop to 112 + flip, normalized), the same clips
for both; each round runs every clip on both sets, the order alternating, and a
clip's median over the rounds counts.  Decoded frames per clip come from the
loader's own count.
"""
import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from datasets.annotation import VideoRecord
from datasets.spatial_transforms import build_train_transform, get_mean_std
from datasets.video import VideoClipLoader
from datasets.videodataset import VideoClipDataset

CLIP = 16
CLOCKS = {'wall': time.perf_counter, 'cpu': time.process_time}


def write_sources(root: Path, n_videos: int, n_frames: int) -> list[Path]:
    import av

    from bench.loading_frames import photo_frames
    paths = []
    for v in range(n_videos):
        path = root / 'source' / f'video_{v}.mp4'
        path.parent.mkdir(parents=True, exist_ok=True)
        with av.open(str(path), 'w') as container:
            stream = container.add_stream('libx264', rate=25, options={'crf': '23', 'preset': 'medium'})
            stream.width, stream.height, stream.pix_fmt = 320, 240, 'yuv420p'
            for img in photo_frames(v, n_frames, (240, 320)):
                container.mux(stream.encode(av.VideoFrame.from_ndarray(img, format='rgb24')))
            container.mux(stream.encode())
        paths.append(path)
    return paths


def keyframe_interval(paths) -> float:
    """Frames a keyframe, over all the videos."""
    import av
    frames = keys = 0
    for path in paths:
        with av.open(str(path)) as container:
            packets = [p for p in container.demux(video=0) if p.size]
        frames, keys = frames + len(packets), keys + sum(p.is_keyframe for p in packets)
    return frames / max(1, keys)


def training_set(paths, n_frames):
    mean, std = get_mean_std(1)
    records = [VideoRecord(video_id=p.stem, path=str(p), first_frame=0, n_frames=n_frames, label=0,
                           segment=(0, n_frames)) for p in paths]
    return VideoClipDataset(records, VideoClipLoader(threads=1), None,
                            build_train_transform(112, mean=mean, std=std))


def clip_rows(sets: dict, n_clips: int, n_frames: int, rounds: int, clock) -> dict:
    """{set: (clips/s, decoded frames a clip)} over the same clips."""
    rng = random.Random(0)
    clips = [(rng.randrange(len(next(iter(sets.values())).records)), rng.randrange(n_frames - CLIP + 1))
             for _ in range(n_clips)]
    times = {name: [[] for _ in clips] for name in sets}
    decoded = {name: 0 for name in sets}
    names = list(sets)
    for k in range(rounds):
        for i, (video, start) in enumerate(clips):
            for name in (names if (i + k) % 2 == 0 else names[::-1]):
                dataset = sets[name]
                dataset.temporal_transform = lambda positions, s=start: list(range(s, s + CLIP))
                dataset.loader.close()  # a fresh open: training over many videos
                before = dataset.loader.stats.get('decoded', 0)
                torch.manual_seed(i)
                t0 = clock()
                dataset[video]
                times[name][i].append(clock() - t0)
                if k == 0:
                    decoded[name] += dataset.loader.stats.get('decoded', 0) - before
    return {name: (len(clips) / sum(statistics.median(t) for t in per_clip), decoded[name] / len(clips))
            for name, per_clip in times.items()}


def main(argv=None):
    from util_scripts.reencode_videos import reencode_video
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--videos', type=int, default=8)
    p.add_argument('--n_frames', type=int, default=250)
    p.add_argument('--clips', type=int, default=48)
    p.add_argument('--rounds', type=int, default=5)
    p.add_argument('--gop', type=int, default=16)
    p.add_argument('--clock', choices=list(CLOCKS), default='wall')
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    clock = CLOCKS[args.clock]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        sources = write_sources(root, args.videos, args.n_frames)
        outputs = [root / 'reencoded' / s.name for s in sources]
        start = time.perf_counter()
        for src, dst in zip(sources, outputs):
            reencode_video(src, dst, gop=args.gop, short_side=320)
        seconds = time.perf_counter() - start
        size = {name: sum(f.stat().st_size for f in files) / 1e6
                for name, files in (('source', sources), ('reencoded', outputs))}
        sets = {'source': training_set(sources, args.n_frames),
                'reencoded': training_set(outputs, args.n_frames)}
        rows = clip_rows(sets, args.clips, args.n_frames, args.rounds, clock)
        gops = {'source': keyframe_interval(sources), 'reencoded': keyframe_interval(outputs)}
    minutes = args.videos * args.n_frames / 25 / 60
    print(f'\n{args.videos} videos of {args.n_frames} photo frames (320x240, 25 fps), training clips '
          f'(16 frames -> 3x16x112x112), one process, one thread ({args.clock} clock)')
    print('| videos | frames a keyframe | decoded frames a clip | clips/s | vs source | MB | MB a minute | vs source |')
    print('|---|---:|---:|---:|---:|---:|---:|---:|')
    for name in ('source', 'reencoded'):
        rate, frames = rows[name]
        print(f'| {name} | {gops[name]:.0f} | {frames:.1f} | {rate:.1f} | '
              f'{rate / rows["source"][0]:.2f}x | {size[name]:.2f} | {size[name] / minutes:.2f} | '
              f'{size[name] / size["source"]:.2f}x |')
    print(f'\nre-encoding took {seconds:.1f} s for {minutes * 60:.0f} s of video '
          f'({seconds / (minutes * 60):.2f} s a second of video, one process)')


if __name__ == '__main__':
    main()
