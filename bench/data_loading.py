"""Which data format to train from: clip loading throughput, disk size, decode limits,
loader throughput with N workers, and the annotation index at Kinetics scale.

    python -m bench.data_loading [--frames noise photo] [--videos 8] [--n_frames 160]
                                 [--clips 60] [--quality 95] [--workers 1 2]
                                 [--index_entries 650000]
                                 [--sections formats jpeg steps layout workers index videos]
                                 [--clock wall|cpu] [--video_clips 120]

frames (--frames; both given: every frame section for each): noise, generated
  UCF-like videos (320x240, blocks of colour plus per-pixel noise moving; JPEG
  quality 95, 43 kB a frame), or photo, camera-like ones: a 320x240 window panning
  and slowly zooming across scikit-image's bundled photographs (a bench-only
  dependency: pip install -r requirements-dev.txt), JPEG quality 90 with 4:2:0
  chroma as cameras write (20.5 kB a frame).
formats: the generated videos written as H.264 .mp4 and MPEG-4 .avi with PyAV,
  jpg folders (noise: the .mp4 extracted with util_scripts.generate_video_jpgs,
  --size -1, --quality; photo: the frames encoded with simplejpeg, no second lossy
  pass) packed into hdf5 with util_scripts.generate_video_hdf5.  One process, one thread; each clip is 16
  random consecutive frames of a random video (video files opened afresh per
  clip, as in training over many videos), random resized crop to 112 + flip
  (training augmentation) -> float (3, 16, 112, 112).  Every row loads the same
  clips (the same frames and random crops), each in 5 interleaved rounds, and each
  clip's fastest round counts (other processes share the CPU).
    (a) the predecessor's path: per frame exists() + PIL open/convert, PIL
        crop/resize/flip, ToTensor, Normalize, stack (3D-ResNets-PyTorch)
    (b) ours on jpg, (c) ours on hdf5, (d) ours on .mp4, (e) ours on .avi (the
        crop planned first and the frames decoded at the scale it needs)
    (f) limit for (b)/(c): read the 16 JPEG files and decode them, nothing else
    (g) limit for (d)/(e): open the video, seek to the keyframe before the clip,
        decode to its last frame, convert the 16 frames to RGB, nothing else
  and, beyond the rows asked for, H.264 with a keyframe every 16 frames.
jpeg: the same jpg and hdf5 frames, today's path (torchvision decode_jpeg of the
  full frames + full-size augmentation, the code before simplejpeg, kept here
  only) against ours (simplejpeg, the crop planned first and the frames decoded
  at the scale it needs), for the training transform (random resized crop to
  112 + flip) and the evaluation one (short side to 112 + center crop), with
  the full-frame decode limits of both decoders, each with the worker's output as
  on CPU runs (normalized to float) and on GPU runs (uint8, normalized on the device);
  each clip's best of 5 interleaved rounds.
  Then the same for video files (.mp4 with a keyframe every 16, .avi): today's
  conversion to RGB (full size for training, short side 112 for evaluation)
  against ours (converted at the scale the planned crop needs, FFmpeg's scaler).
  And simplejpeg's decode time per frame at 1/1, 1/2, 1/4, 1/8: what DCT scaling
  can save on these frames.
steps: ours on the jpg frames (training and evaluation, float and uint8 output)
  against the sum of its unavoidable steps: read + decode at the scale the plan
  allows, + the resized crop, + the layout the model needs (the normalizer's or
  contiguous_clip's pass alone); and against full-size decoding alone and with the
  same crop (issue 25's targets: training at most 1.15x decode + crop, evaluation
  at least 1.6x faster than full decode + crop).
layout: where a clip's time goes after decoding, on decoded clips of the frames:
  the resized crop on uint8 against float, channels-last against channels-first;
  the flip and the layout (float (C, T, H, W) normalized, or contiguous uint8) by
  each candidate, today's and the rejected ones (a fused lookup table, numpy's
  transposing copy before the float conversion).
workers: a DataLoader (batch 8) over the training data set with 1, 2 worker
  processes feeding a model that does nothing: whether loading or compute
  bounds training.
videos: bench/video_clips.py (.mp4 and .avi clips on cache misses against plain
  PyAV, clip cost on a 10-minute video against a 10-second one, a loader worker's
  decoder threads).
index: a generated Kinetics-700-sized annotation (585k training + 65k
  validation entries): start-up time of the list of VideoRecords against the
  cached RecordTable, and the memory a forked worker dirties reading every entry.
"""
import argparse
import functools
import gc
import json
import math
import os
import random
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchvision import tv_tensors
from torchvision.io import decode_jpeg
from torchvision.transforms import functional as TF
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF_v2

from bench import video_clips
from datasets.annotation import load_annotations
from datasets.loader import Hdf5ClipLoader, JpgClipLoader
from datasets.spatial_transforms import (
    FlipToContiguous,
    KeepUint8,
    build_eval_transform,
    build_train_transform,
    contiguous_clip,
    get_mean_std,
)
from datasets.temporal_transforms import TemporalRandomCrop
from datasets.video import VideoClipLoader
from datasets.video_index import FrameTable, load_record_table
from datasets.videodataset import VideoClipDataset

CLIP = 16
OUTPUTS = ('float', 'uint8')  # what a worker hands over: normalized (CPU runs) or uint8 (GPU)
FORMATS = {'mp4': ('libx264', {'preset': 'medium', 'crf': '23'}),  # x264 default GOP (250)
           'avi': ('mpeg4', {'g': '12', 'b': '800k'}),  # FFmpeg's MPEG-4 default GOP
           'mp4_g16': ('libx264', {'preset': 'medium', 'crf': '23', 'g': '16'})}


def frames_of(v, n_frames, size, rng):
    """Textured frames (smooth colour blobs, a moving pattern, noise): compress like video."""
    h, w = size
    base = rng.integers(0, 255, (h // 16 + 1, w // 16 + 1, 3), dtype=np.uint8)
    base = np.kron(base, np.ones((16, 16, 1), dtype=np.uint8))[:h, :w].astype(np.int16)
    for f in range(n_frames):
        noise = rng.integers(-12, 12, (h, w, 3), dtype=np.int16)
        yield np.clip(np.roll(base, (f, 2 * f), axis=(0, 1)) + noise, 0, 255).astype(np.uint8)


@functools.lru_cache(maxsize=1)
def photographs():
    """scikit-image's bundled colour photographs (in its wheel, no download), at least
    400x300 each: room for the 1.25x window of photo_frames."""
    try:
        from skimage import data
    except ImportError:
        raise SystemExit('--frames photo needs scikit-image (a bench-only dependency): '
                         'pip install -r requirements-dev.txt') from None
    return (data.astronaut(), data.coffee(), data.chelsea(), data.rocket(), data.stereo_motorcycle()[0])


def photo_frames(v, n_frames, size):
    """Camera-like frames: a window of the frames' aspect pans across photograph
    v % 5 while zooming slowly (1.25x the frame size to 1x, or back for odd v),
    resampled bilinearly to ``size`` (sub-pixel steps: smooth motion).  Deterministic."""
    h, w = size
    photo = Image.fromarray(photographs()[v % len(photographs())])
    width, height = photo.size
    for f in range(n_frames):
        t = f / max(1, n_frames - 1)
        zoom = 1.25 - 0.25 * t if v % 2 == 0 else 1 + 0.25 * t
        box_w, box_h = w * zoom, h * zoom
        left = (width - box_w) * (0.5 + 0.5 * math.sin(math.pi * t + v))
        top = (height - box_h) * (0.5 + 0.5 * math.sin(0.7 * math.pi * t + 2 * v))
        yield np.asarray(photo.resize((w, h), Image.BILINEAR, box=(left, top, left + box_w, top + box_h)))


FRAMES = ('noise', 'photo')
QUALITY = {'noise': 95, 'photo': 90}  # generate_video_jpgs's default; a camera's, as in issue 25
FRAME_NAMES = {'noise': 'blocks of colour plus per-pixel noise',
               'photo': "scikit-image's photographs, panned and zoomed"}


def video_frames(frames, n_videos, n_frames, size):
    """Each video's frames (an iterator per video, in order) of kind ``frames``."""
    rng = np.random.default_rng(0)  # noise: one stream across the videos, as before
    for v in range(n_videos):
        yield (frames_of(v, n_frames, size, rng) if frames == 'noise'
               else photo_frames(v, n_frames, size))


def write_video_files(root, n_videos, n_frames, size, frames='noise', on_frame=None):
    """The videos of FORMATS; ``on_frame(v, f, rgb)`` also sees every frame."""
    import av
    for v, images in enumerate(video_frames(frames, n_videos, n_frames, size)):
        containers = {}
        for ext, (codec, options) in FORMATS.items():
            container = av.open(str(root / ext / 'cls' / f'video_{v}.{ext[:3]}'), 'w')
            stream = container.add_stream(codec, rate=25, options=options)
            stream.width, stream.height, stream.pix_fmt = size[1], size[0], 'yuv420p'
            containers[ext] = (container, stream)
        for f, img in enumerate(images):
            if on_frame:
                on_frame(v, f, img)
            frame = av.VideoFrame.from_ndarray(img, format='rgb24')
            for container, stream in containers.values():
                container.mux(stream.encode(frame))
        for container, stream in containers.values():
            container.mux(stream.encode())
            container.close()


def encode_photo_jpeg(img, quality):
    """A camera's JPEG: 4:2:0 chroma, as FFmpeg's and generate_video_jpgs's encoders write."""
    import simplejpeg
    return simplejpeg.encode_jpeg(np.ascontiguousarray(img), quality=quality, colorsubsampling='420')


def prepare(root, n_videos, n_frames, size, quality=95, frames='noise'):
    """mp4/avi written with PyAV; jpg (JPEG ``quality``) made from the mp4 by our tools
    (noise frames) or from the frames themselves with simplejpeg (photo frames: no
    second lossy pass), hdf5 from the jpg folders by our tools."""
    from util_scripts import generate_video_hdf5, generate_video_jpgs
    for ext in FORMATS:
        (root / ext / 'cls').mkdir(parents=True)
    on_frame = None
    if frames == 'photo':
        def on_frame(v, f, img):
            folder = root / 'jpg' / 'cls' / f'video_{v}'
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f'image_{f + 1:05d}.jpg').write_bytes(encode_photo_jpeg(img, quality))
    write_video_files(root, n_videos, n_frames, size, frames, on_frame)
    if frames == 'noise':
        generate_video_jpgs.main([str(root / 'mp4'), str(root / 'jpg'), 'ucf101', '--size', '-1',
                                  '--n_jobs', '2', '--quality', str(quality)])
    generate_video_hdf5.main([str(root / 'jpg'), str(root / 'hdf5'), 'ucf101', '--n_jobs', '2'])
    paths = {'jpg': [root / 'jpg' / 'cls' / f'video_{v}' for v in range(n_videos)],
             'hdf5': [root / 'hdf5' / 'cls' / f'video_{v}.hdf5' for v in range(n_videos)]}
    for ext in FORMATS:
        paths[ext] = [root / ext / 'cls' / f'video_{v}.{ext[:3]}' for v in range(n_videos)]
    return paths


def disk_mb(path) -> float:
    return sum(f.stat().st_size for f in Path(path).rglob('*') if f.is_file()) / 1e6


def predecessor_clip(folder, positions, mean, std, size=112):
    frames = []
    for p in positions:
        path = folder / f'image_{p + 1:05d}.jpg'
        if path.exists():
            with path.open('rb') as f:
                frames.append(Image.open(f).convert('RGB'))
    w, h = frames[0].size
    scale, ratio = random.uniform(0.25, 1.0), random.uniform(0.75, 1 / 0.75)
    cw = min(w, int(round((w * h * scale * ratio) ** 0.5)))
    ch = min(h, int(round((w * h * scale / ratio) ** 0.5)))
    top, left = random.randint(0, h - ch), random.randint(0, w - cw)
    flip = random.random() < 0.5
    out = []
    for img in frames:
        img = TF.resized_crop(img, top, left, ch, cw, [size, size])
        if flip:
            img = TF.hflip(img)
        out.append(TF.normalize(TF.to_tensor(img), mean, std))
    return torch.stack(out, 0).permute(1, 0, 2, 3)


def jpeg_limit(folder, positions):
    data = []
    for p in positions:
        with open(folder / f'image_{p + 1:05d}.jpg', 'rb') as f:
            data.append(torch.frombuffer(bytearray(f.read()), dtype=torch.uint8))
    return decode_jpeg(data)


def video_limit(path, positions):
    """FFmpeg's own seek (to the keyframe before the clip) and decode, RGB conversion
    with a reused scaler context (the cheapest conversion PyAV offers), one thread."""
    return video_clips.plain_pyav(path, positions)


# --clock cpu: this process's CPU time (all its threads) instead of the wall clock,
# for a machine that other jobs share (their load stretches wall time, far less CPU time)
CLOCKS = {'wall': time.perf_counter, 'cpu': time.process_time}
clock = CLOCKS['wall']


def timed_clips(n_clips, n_videos, n_frames, seed=0):
    """The clips every row loads: (video index, positions, seed of its random crop)."""
    rng = random.Random(seed)
    starts = TemporalRandomCrop(CLIP, rng=rng)
    return [(rng.randrange(n_videos), starts(0, n_frames), seed * 100_003 + i)
            for i in range(n_clips)]


def format_rows(paths, n_clips, n_frames, rounds=5):
    """{row: clips/s} for rows a..g (the limits per video format)."""
    mean, std = get_mean_std(1)
    transform = build_train_transform(112, mean=mean, std=std)
    jpg, hdf5 = JpgClipLoader(), Hdf5ClipLoader()
    video = VideoClipLoader(threads=1, frame_table=FrameTable(None))  # indexes kept, as in training

    def video_only(path, positions):
        try:
            return video(path, positions)
        finally:
            video.close()  # a fresh open per clip, as over many videos

    def ours_video(path, positions):
        try:
            return planned_clip(video, transform, path, positions)
        finally:
            video.close()

    runs = {
        'a': (lambda p, pos: predecessor_clip(p, pos, mean, std), 'jpg'),
        'b': (lambda p, pos: planned_clip(jpg, transform, p, pos), 'jpg'),
        'c': (lambda p, pos: planned_clip(hdf5, transform, p, pos), 'hdf5'),
        'd': (ours_video, 'mp4'),
        'e': (ours_video, 'avi'),
        'd16': (ours_video, 'mp4_g16'),
        'f': (jpeg_limit, 'jpg'),
        'g_mp4': (video_limit, 'mp4'),
        'g_avi': (video_limit, 'avi'),
        'g_mp4_g16': (video_limit, 'mp4_g16'),
        # the loaders alone (no augmentation): their overhead over the limits
        'b_load': (lambda p, pos: jpg(str(p), pos), 'jpg'),
        'c_load': (lambda p, pos: hdf5(str(p), pos), 'hdf5'),
        'd_load': (video_only, 'mp4'),
        'e_load': (video_only, 'avi'),
        'd16_load': (video_only, 'mp4_g16'),
    }
    return best_of_rounds(runs, paths, n_clips, n_frames, rounds)


def print_format_table(rates, sizes, n_videos, n_frames):
    print(f'\n{n_videos} videos of {n_frames} frames, 320x240; 16-frame clips -> '
          f'3x16x112x112, one process, one thread (clips/s)')
    print('| row | path | clips/s | vs (a) | vs its limit | loader alone: clips/s, vs limit '
          '| disk (MB) |')
    print('|---|---|---:|---:|---:|---:|---:|')
    rows = [('a', 'predecessor: PIL, frame at a time (jpg)', None, 'jpg'),
            ('b', 'ours, jpg', 'f', 'jpg'), ('c', 'ours, hdf5', 'f', 'hdf5'),
            ('d', 'ours, H.264 .mp4', 'g_mp4', 'mp4'), ('e', 'ours, MPEG-4 .avi', 'g_avi', 'avi'),
            ('f', 'limit: read + decode 16 JPEGs', None, 'jpg'),
            ('g_mp4', 'limit: seek + decode 16 frames, .mp4', None, 'mp4'),
            ('g_avi', 'limit: seek + decode 16 frames, .avi', None, 'avi'),
            ('d16', 'extra: ours, H.264 .mp4 with a keyframe every 16 frames', 'g_mp4_g16',
             'mp4_g16'),
            ('g_mp4_g16', 'extra: limit for it', None, 'mp4_g16')]
    for row, name, limit, fmt in rows:
        vs_limit = f'{rates[row] / rates[limit]:.0%}' if limit else ''
        alone = rates.get(f'{row}_load')
        alone = f'{alone:.1f}, {alone / rates[limit]:.0%}' if alone else ''
        label = row if row in 'abcdef' else ('g' if row.startswith('g') else '')
        print(f'| {f"({label})" if label else ""} | {name} | {rates[row]:.1f} | '
              f'{rates[row] / rates["a"]:.2f}x | {vs_limit} | {alone} | {sizes[fmt]:.1f} |')


def planned_clip(loader, transform, path, positions, finish=None):
    """What VideoClipDataset does with a JPEG loader: read the bytes, plan the crop
    from the header's frame size, decode at the plan's reduction, augment, then
    ``finish`` (default: the transform's own, normalizing to float)."""
    encoded = loader.read(str(path), positions)
    plan = transform.plan(encoded.frame_size)
    factor = plan.reduction(encoded.factors)
    return (finish or transform.finish)(transform.augment(encoded.decode(factor), plan, factor))


def todays_decode(data):
    """The data path before simplejpeg: torchvision's batched decode_jpeg of the
    clip's frames at full size, stacked channels-last (datasets/loader.py until then)."""
    frames = decode_jpeg([torch.from_numpy(d) if isinstance(d, np.ndarray)  # hdf5 elements
                          else torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in data])
    return torch.stack([f.permute(1, 2, 0) for f in frames]).permute(0, 3, 1, 2)


def todays_finish(mean, std, output):
    """The last step before contiguous_clip (datasets/spatial_transforms.py until
    then): 'float', NormalizeToInput's permuting float copy of the channels-last
    clip; 'uint8' (normalized on the device), KeepUint8's ``Tensor.contiguous``."""
    gain = torch.tensor([1 / 255 / s for s in std]).view(3, 1, 1, 1)
    bias = torch.tensor([m / s for m, s in zip(mean, std)]).view(3, 1, 1, 1)
    if output == 'uint8':
        return lambda clip: clip.as_subclass(torch.Tensor).contiguous()
    return lambda clip: clip.as_subclass(torch.Tensor).movedim(-3, -4).to(
        torch.float32, memory_format=torch.contiguous_format).mul_(gain).sub_(bias)


def todays_transforms(size, mean, std, output='float'):
    """The v2 pipelines before the crop was planned: full-size clips in, the
    crop/resize as the pipeline's first step, today's finish (``output``: 'float'
    normalized in the worker, 'uint8' for normalization on the device)."""
    finish = todays_finish(mean, std, output)
    train = v2.Compose([v2.RandomResizedCrop(size, scale=(0.25, 1.0), ratio=(0.75, 1 / 0.75),
                                             antialias=True), v2.RandomHorizontalFlip(0.5)])
    val = v2.Compose([v2.Resize(size, antialias=True), v2.CenterCrop(size)])
    return {name: (lambda clip, t=t: finish(t(tv_tensors.Video(clip))))
            for name, t in (('train', train), ('val', val))}


def best_of_rounds(runs, paths, n_clips, n_frames, rounds, block=4):
    """{row: clips/s} of runs {row: (clip function, format)}: every row loads the same
    ``n_clips`` clips (the same frames, the same random crop: the seed is set per
    clip), in blocks of ``block`` clips: each round loads a block with every row in
    turn (the rows in an order rotated from block to block), and a clip's fastest
    round counts.  A row's block follows one untimed clip of that row (the clip
    before the block), so a row is timed in its own steady state, as a loader worker
    runs, not in the allocator and cache state the previous row left; and the rows
    of a block run within a fraction of a second of each other, so the machine's
    changing speed (other tenants' memory traffic: the same copy takes 0.43 ms in
    one minute, 0.75 ms in another) is left out of every row alike."""
    clips = timed_clips(n_clips, len(next(iter(paths.values()))), n_frames)
    rows = list(runs)
    best = {row: [float('inf')] * len(clips) for row in rows}

    def load(row, i):
        fn, fmt = runs[row]
        video, positions, seed = clips[i]
        torch.manual_seed(seed)
        start = clock()
        fn(paths[fmt][video], positions)
        return clock() - start
    starts = range(0, len(clips), block)
    for k in range(rounds):
        for b, first in enumerate(starts):
            shift = (b + k * 7) % len(rows)
            for row in rows[shift:] + rows[:shift]:
                load(row, first - 1)  # untimed: this row's steady state
                for i in range(first, min(first + block, len(clips))):
                    best[row][i] = min(best[row][i], load(row, i))
    return {row: len(clips) / sum(times) for row, times in best.items()}


def jpeg_rows(paths, n_clips, n_frames, rounds=5):
    """{row: clips/s}: today's JPEG path (torchvision decode at full size + full-size
    augmentation) against ours (simplejpeg, decoded at the plan's scale), for
    training and evaluation transforms, jpg and hdf5, and the full-frame decode limits."""
    mean, std = get_mean_std(1)
    ours = {'train': build_train_transform(112, mean=mean, std=std),
            'val': build_eval_transform(112, mean=mean, std=std)}
    finish = {'float': None, 'uint8': KeepUint8(ours['val'].finish)}
    jpg, hdf5 = JpgClipLoader(), Hdf5ClipLoader()

    def bytes_of(loader, path, positions):
        return loader.read(str(path), positions).planes[0]

    def sj_full(loader, path, positions):
        return loader.read(str(path), positions).decode(1)
    runs = {}
    for fmt, loader in (('jpg', jpg), ('hdf5', hdf5)):
        for output in OUTPUTS:
            today = todays_transforms(112, mean, std, output)
            for kind in ('train', 'val'):
                runs[f'{fmt}_{kind}_{output}_today'] = (
                    lambda p, pos, ld=loader, t=today[kind]: t(todays_decode(bytes_of(ld, p, pos))),
                    fmt)
                runs[f'{fmt}_{kind}_{output}_ours'] = (
                    lambda p, pos, ld=loader, t=ours[kind], f=finish[output]: planned_clip(
                        ld, t, p, pos, f), fmt)
        runs[f'{fmt}_limit_tv'] = (lambda p, pos, ld=loader: todays_decode(bytes_of(ld, p, pos)),
                                   fmt)
        runs[f'{fmt}_limit_sj'] = (lambda p, pos, ld=loader: sj_full(ld, p, pos), fmt)
    return best_of_rounds(runs, paths, n_clips, n_frames, rounds)


def video_scale_rows(paths, n_clips, n_frames, rounds=5):
    """{row: clips/s}: video files (a fresh open per clip, the stored frame index),
    today's path (training: every frame converted to RGB at full size, then the
    full-size augmentation; evaluation: converted at the short side 112 by FFmpeg's
    scaler, the eval loader's short_side) against ours (the crop planned from the
    first frame's size, the frames converted at the plan's reduction), and the limit
    (plain PyAV: open, seek, decode, convert the 16 frames at full size)."""
    mean, std = get_mean_std(1)
    transforms = {'train': build_train_transform(112, mean=mean, std=std),
                  'val': build_eval_transform(112, mean=mean, std=std)}
    today = todays_finish(mean, std, 'float')
    table = FrameTable(None)
    loaders = {'today_train': VideoClipLoader(threads=1, frame_table=table),
               'today_val': VideoClipLoader(short_side=112, threads=1, frame_table=table),
               'ours': VideoClipLoader(threads=1, frame_table=table)}

    def fresh(name, fn):
        def clip(path, positions):
            try:
                return fn(loaders[name], path, positions)
            finally:
                loaders[name].close()  # a fresh open per clip, as over many videos
        return clip
    runs = {}
    for fmt in ('mp4_g16', 'avi'):
        for kind, t in transforms.items():
            runs[f'{fmt}_{kind}_today'] = (fresh(f'today_{kind}', lambda ld, p, pos, t=t: today(
                t.augment(ld(str(p), pos)))), fmt)
            runs[f'{fmt}_{kind}_ours'] = (fresh('ours', lambda ld, p, pos, t=t: planned_clip(
                ld, t, p, pos)), fmt)
        runs[f'{fmt}_limit'] = (video_limit, fmt)
    return best_of_rounds(runs, paths, n_clips, n_frames, rounds)


def print_video_scale_table(rates, n_videos, n_frames):
    print(f'\nvideo files, {n_videos} videos of {n_frames} frames, 320x240, a fresh open per '
          f'clip; 16-frame clips -> 3x16x112x112, one process, one thread (clips/s). today: '
          f'frames converted to RGB at full size (training) or at short side 112 (evaluation); '
          f'ours: converted at the scale the crop needs. limit: plain PyAV open + seek + '
          f'decode + convert the 16 full frames')
    print('| format | transform | today | ours | ours / today | ours / limit |')
    print('|---|---|---:|---:|---:|---:|')
    names = {'mp4_g16': 'H.264 .mp4, keyframe every 16', 'avi': 'MPEG-4 .avi'}
    for fmt in ('mp4_g16', 'avi'):
        limit = rates[f'{fmt}_limit']
        for kind in ('train', 'val'):
            a, b = rates[f'{fmt}_{kind}_today'], rates[f'{fmt}_{kind}_ours']
            print(f'| {names[fmt]} | {kind} | {a:.1f} | {b:.1f} | {b / a:.2f}x | '
                  f'{b / limit:.2f}x |')
        print(f'| {names[fmt]} | limit | {limit:.1f} | | | |')


def dct_scaling_costs(folder, n_frames: int = 48, rounds: int = 5) -> None:
    """simplejpeg's decode time per frame at 1/1, 1/2, 1/4, 1/8 (best of the rounds):
    how much DCT scaling can save on these frames (entropy decoding is not scaled)."""
    import simplejpeg
    data = [(folder / f'image_{p + 1:05d}.jpg').read_bytes() for p in range(n_frames)]
    height, width = simplejpeg.decode_jpeg_header(data[0])[:2]
    scales = {f: {} if f == 1 else dict(min_factor=f, min_height=-(-height // f),
                                         min_width=-(-width // f)) for f in (1, 2, 4, 8)}
    best = {f: [float('inf')] * len(data) for f in scales}
    for _ in range(rounds):  # each frame's fastest round, the factors interleaved
        for f, scale in scales.items():
            for i, d in enumerate(data):
                start = clock()
                simplejpeg.decode_jpeg(d, **scale)
                best[f][i] = min(best[f][i], clock() - start)
    cost = {f: sum(times) / len(times) * 1e3 for f, times in best.items()}
    print(f'\nsimplejpeg decode of a {width}x{height} frame (ms, vs full size): ' +
          ', '.join(f'1/{f} {ms:.3f} ({ms / cost[1]:.0%})' for f, ms in cost.items()))


def resized_crop(transform, clip, plan, factor, size=112):
    """The clip's geometric step alone: the plan's box resized (the short side for
    evaluation, then the center crop: a view)."""
    out = transform.geometry(clip, plan, factor)
    return TF_v2.center_crop(out, [size, size])


def step_rows(paths, n_clips, n_frames, rounds=5):
    """{row: clips/s} on the jpg frames, training and evaluation transforms: ours
    (normalized to float, or uint8 for the device) against its unavoidable steps:
    read + decode at the plan's scale ('scaled'), + the resized crop ('scaled_crop'),
    + the layout the model needs ('scaled_crop_float': the normalizer alone,
    'scaled_crop_uint8': contiguous_clip alone; no flip, no v2 pipeline), and
    full-size decoding ('full', the same for both) + the same crop ('full_crop');
    and ours with the v2 flip, as before issue 25 ('train_before_*')."""
    mean, std = get_mean_std(1)
    transforms = {'train': build_train_transform(112, mean=mean, std=std),
                  'val': build_eval_transform(112, mean=mean, std=std)}
    layouts = {'float': transforms['val'].finish, 'uint8': contiguous_clip}
    loader = JpgClipLoader()

    def steps(transform, crop=False, layout=None, full=False):
        def clip(path, positions):
            encoded = loader.read(str(path), positions)
            plan = transform.plan(encoded.frame_size)
            factor = 1 if full else plan.reduction(encoded.factors)
            out = encoded.decode(factor)
            if crop:
                out = resized_crop(transform, out, plan, factor)
            return layout(out) if layout else out
        return clip
    before = build_train_transform(112, mean=mean, std=std)  # the v2 flip (until issue 25)
    before.augment_transform.transforms[-1] = v2.RandomHorizontalFlip(0.5)
    runs = {'full': (steps(transforms['val'], full=True), 'jpg'),
            'train_before_float': (lambda p, pos: planned_clip(loader, before, p, pos), 'jpg'),
            'train_before_uint8': (lambda p, pos: planned_clip(
                loader, before, p, pos, KeepUint8(before.finish)), 'jpg')}
    for kind, t in transforms.items():
        runs[f'{kind}_ours_float'] = (lambda p, pos, t=t: planned_clip(loader, t, p, pos), 'jpg')
        runs[f'{kind}_ours_uint8'] = (lambda p, pos, t=t: planned_clip(
            loader, t, p, pos, KeepUint8(t.finish)), 'jpg')
        runs[f'{kind}_scaled'] = (steps(t), 'jpg')
        runs[f'{kind}_scaled_crop'] = (steps(t, crop=True), 'jpg')
        for output, layout in layouts.items():
            runs[f'{kind}_scaled_crop_{output}'] = (steps(t, crop=True, layout=layout), 'jpg')
        runs[f'{kind}_full_crop'] = (steps(t, crop=True, full=True), 'jpg')
    return best_of_rounds(runs, paths, n_clips, n_frames, rounds)


def print_step_table(rates, frames, quality, frame_kb):
    """ms a clip, from step_rows's clips/s, and the ratios of issue 25's targets."""
    ms = {row: 1e3 / rate for row, rate in rates.items()}
    print(f'\nsteps of a clip, jpg frames ({frames}, JPEG quality {quality}, {frame_kb:.1f} kB a frame), '
          f'16-frame clips -> 3x16x112x112, one process, one thread (ms a clip). decode: read + '
          f'decode the 16 frames at the scale the plan allows (training: mostly 1/1; evaluation: '
          f'1/2); crop: the resized crop alone; layout: the normalizer (float) or contiguous_clip '
          f'(uint8) alone; full decode: read + decode at 1/1')
    print('| transform | output | ours | before (v2 flip) | decode | decode + crop '
          '| decode + crop + layout | ours / (decode + crop) | ours / (decode + crop + layout) '
          '| full decode + crop | (full decode + crop) / ours | full decode / ours |')
    print('|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|')
    for kind in ('train', 'val'):
        for output in OUTPUTS:
            ours, crop = ms[f'{kind}_ours_{output}'], ms[f'{kind}_scaled_crop']
            layout, full_crop = ms[f'{kind}_scaled_crop_{output}'], ms[f'{kind}_full_crop']
            before = f'{ms[f"{kind}_before_{output}"]:.2f}' if kind == 'train' else ''
            print(f'| {kind} | {output} | {ours:.2f} | {before} | {ms[f"{kind}_scaled"]:.2f} '
                  f'| {crop:.2f} | {layout:.2f} | {ours / crop:.2f}x | {ours / layout:.2f}x '
                  f'| {full_crop:.2f} | {full_crop / ours:.2f}x | {ms["full"] / ours:.2f}x |')
    print(f'| full decode alone | | | | {ms["full"]:.2f} | | | | | | | |')


def decoded_clips(frames, quality, n_clips):
    """``n_clips`` 16-frame clips (the first frames of as many videos of ``frames``),
    JPEG-encoded (4:2:0, ``quality``) and decoded by the loader's decoder at 1/1 and
    1/2: [(encoded, full, half)], the frames uint8 (T, C, H, W) in channels-last memory."""
    from datasets.loader import EncodedClip
    out = []
    for v, images in enumerate(video_frames(frames, n_clips, CLIP, (240, 320))):
        data = [encode_photo_jpeg(img, quality) for img in images]
        encoded = EncodedClip([data], [[f'frame {i}' for i in range(CLIP)]], f'video {v}')
        out.append((encoded, encoded.decode(1), encoded.decode(2)))
    return out


def _lookup_normalizer(normalizer):
    """The normalizer as one pass: uint8 -> its channel's float from a 256-entry table
    of the normalizer's own float32 ops per value."""
    table = (torch.arange(256, dtype=torch.float32) * normalizer._gain.view(3, 1)
             - normalizer._bias.view(3, 1)).numpy()

    def lookup(clip):
        values = clip.numpy()
        out = np.empty((values.shape[1], values.shape[0], *values.shape[2:]), np.float32)
        for c in range(values.shape[1]):
            np.take(table[c], values[:, c], out=out[c])
        return torch.from_numpy(out)
    return lookup


def _after_decoding_variants(i, clip, train, val) -> dict:
    """{(step, variant): what to time} for clip i of decoded_clips, with its seeded training box."""
    encoded, full, half = clip
    normalizer = train.finish
    lookup = _lookup_normalizer(normalizer)
    v2_flip, our_flip = v2.RandomHorizontalFlip(1.0), FlipToContiguous(1.0)
    torch.manual_seed(i)
    plan = train.plan(full.shape[-2:])
    factor = plan.reduction()
    box, size = plan.box_at(factor), list(plan.size)
    decoded = full if factor == 1 else half
    first = decoded.contiguous()
    crop = TF_v2.resized_crop(decoded, *box, size, antialias=True)
    val_plan = val.plan(full.shape[-2:])
    variants = {
        ('decode 16 frames', '1/1'): lambda e=encoded: e.decode(1),
        ('decode 16 frames', '1/2'): lambda e=encoded: e.decode(2),
        ('resized crop (training box)', 'uint8, channels-last (ours)'):
            lambda d=decoded, b=box, s=size: TF_v2.resized_crop(d, *b, s, antialias=True),
        ('resized crop (training box)', 'uint8, channels-first'):
            lambda d=first, b=box, s=size: TF_v2.resized_crop(d, *b, s, antialias=True),
        ('resized crop (training box)', 'float, channels-last (conversion included)'):
            lambda d=decoded, b=box, s=size: TF_v2.resized_crop(d.float(), *b, s, antialias=True),
        ('resized crop (training box)', 'float, channels-first (conversion included)'):
            lambda d=first, b=box, s=size: TF_v2.resized_crop(d.float(), *b, s, antialias=True),
        ('resized crop (evaluation, from 1/2)', 'uint8, channels-last (ours)'):
            lambda d=half, p=val_plan: resized_crop(val, d, p, 2),
        ('flip + layout float', 'before: v2.RandomHorizontalFlip, NormalizeToInput'):
            lambda c=crop: normalizer(v2_flip(tv_tensors.Video(c))),
        ('flip + layout float', 'ours: FlipToContiguous, NormalizeToInput'):
            lambda c=crop: normalizer(our_flip(tv_tensors.Video(c))),
        ('flip + layout uint8', 'before: v2.RandomHorizontalFlip, contiguous_clip'):
            lambda c=crop: contiguous_clip(v2_flip(tv_tensors.Video(c))),
        ('flip + layout uint8', 'ours: FlipToContiguous, contiguous_clip'):
            lambda c=crop: contiguous_clip(our_flip(tv_tensors.Video(c))),
        ('flip alone', 'Tensor.flip'): lambda c=crop: c.flip(-1),
        ('layout float (no flip)', "ours: NormalizeToInput (torch's permuting float copy, multiply, "
                                   "subtract)"): lambda c=crop: normalizer(c),
        ('layout float (no flip)', 'numpy transposing uint8 copy, then float, multiply, subtract'):
            lambda c=crop: normalizer(contiguous_clip(c.movedim(-3, -4)).movedim(-4, -3)),
        ('layout float (no flip)', 'fused: 256-entry lookup table (numpy take)'): lambda c=crop: lookup(c),
        ('layout uint8 (no flip)', 'Tensor.contiguous'): lambda c=crop: c.contiguous(),
        ('layout uint8 (no flip)', 'ours: contiguous_clip'): lambda c=crop: contiguous_clip(c),
    }
    assert torch.equal(lookup(crop), normalizer(crop))  # the same values
    return variants


def after_decoding_costs(frames, quality, n_clips=8, rounds=30) -> None:
    """Where a clip's time goes after decoding (ms a clip: each clip's best of
    ``rounds``, the mean over ``n_clips`` clips of ``frames``, each with its seeded
    training box): the resized crop on uint8 against float, channels-last against
    channels-first memory; the flip; the layout the model needs (float (C, T, H, W)
    normalized, or uint8 (T, C, H, W) contiguous) by each candidate; the decode itself."""
    mean, std = get_mean_std(1)
    train, val = build_train_transform(112, mean=mean, std=std), build_eval_transform(112, mean=mean, std=std)
    clips = decoded_clips(frames, quality, n_clips)
    cases = {i: _after_decoding_variants(i, clip, train, val) for i, clip in enumerate(clips)}
    best = {key: [float('inf')] * len(clips) for key in cases[0]}
    for _ in range(rounds):  # the variants interleaved, each clip's fastest round
        for i in cases:
            for key, fn in cases[i].items():
                start = clock()
                fn()
                best[key][i] = min(best[key][i], clock() - start)
    print(f'\nafter decoding, {frames} frames (JPEG quality {quality}), {CLIP}x3x240x320 -> '
          f'{CLIP}x3x112x112, one thread (ms a clip, mean of {len(clips)} clips, each its best of '
          f'{rounds} rounds)')
    print('| step | variant | ms |')
    print('|---|---|---:|')
    for (step, variant), times in best.items():
        print(f'| {step} | {variant} | {sum(times) / len(times) * 1e3:.3f} |')


def print_jpeg_table(rates, n_videos, n_frames, quality, frame_kb):
    print(f'\nJPEG frames (jpg folders, hdf5), {n_videos} videos of {n_frames} frames, 320x240, '
          f'JPEG quality {quality} ({frame_kb:.1f} kB a frame); 16-frame clips -> '
          f'3x16x112x112, one process, one thread (clips/s). today: '
          f'torchvision decode_jpeg at full size + full-size augmentation; ours: simplejpeg '
          f'at the scale the crop needs. train: random resized crop + flip; val: short side '
          f'to 112 + center crop. limits: read + decode the 16 full frames')
    print('output: float = normalized in the worker (CPU runs); uint8 = normalized on the '
          'device (GPU runs, --normalize_on_device auto)')
    print('| format | transform | output | today | ours | ours / today '
          '| ours / limit (torchvision) | ours / limit (simplejpeg) |')
    print('|---|---|---|---:|---:|---:|---:|---:|')
    for fmt in ('jpg', 'hdf5'):
        tv, sj = rates[f'{fmt}_limit_tv'], rates[f'{fmt}_limit_sj']
        for kind in ('train', 'val'):
            for output in OUTPUTS:
                a, b = rates[f'{fmt}_{kind}_{output}_today'], rates[f'{fmt}_{kind}_{output}_ours']
                print(f'| {fmt} | {kind} | {output} | {a:.1f} | {b:.1f} | {b / a:.2f}x '
                      f'| {b / tv:.2f}x | {b / sj:.2f}x |')
        print(f'| {fmt} | limit: decode 16 full frames | | {tv:.1f} (torchvision) | {sj:.1f} '
              f'(simplejpeg) | {sj / tv:.2f}x | | |')


def worker_rows(root, workers, n_batches, batch=8):
    """clips/s of a DataLoader with each worker count, per format, model doing nothing."""
    mean, std = get_mean_std(1)
    transform = build_train_transform(112, mean=mean, std=std)
    loaders = {'jpg': JpgClipLoader(), 'hdf5': Hdf5ClipLoader(), 'mp4': VideoClipLoader()}
    results = {}
    for fmt, loader in loaders.items():
        annotation, video_path = write_bench_annotation(root, fmt)
        records, _ = load_annotations(annotation, 'training', video_path, 'ucf101',
                                      file_type='video' if fmt == 'mp4' else fmt)
        repeat = (n_batches + 2) * batch // len(records) + 1
        dataset = VideoClipDataset(records * repeat, loader, TemporalRandomCrop(CLIP), transform)
        for n in workers:
            data = DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=n,
                              prefetch_factor=4 if n else None)
            it = iter(data)
            next(it)  # start-up (worker fork, first batch) not counted
            start = time.perf_counter()
            count = 0
            for _ in range(n_batches):
                count += len(next(it)[0])
            results[fmt, n] = count / (time.perf_counter() - start)
            del it
    return results


def write_bench_annotation(root, fmt):
    videos = sorted((root / fmt / 'cls').iterdir())
    n = {'jpg': lambda p: len(list(p.iterdir()))}.get(fmt, lambda p: None)
    database = {}
    for v in videos:
        count = n(v)
        entry = {'subset': 'training', 'annotations': {'label': 'cls'}}
        if count:
            entry['annotations']['segment'] = [1, count + 1]
        database[v.name.split('.')[0]] = entry
    path = root / f'{fmt}.json'
    path.write_text(json.dumps({'labels': ['cls'], 'database': database}))
    return path, root / fmt


def private_dirty_mb() -> float:
    with open('/proc/self/smaps_rollup') as f:
        for line in f:
            if line.startswith('Private_Dirty:'):
                return int(line.split()[1]) / 1024
    return float('nan')


def dirtied_by_worker(records) -> float:
    """MB of copy-on-write memory a forked worker dirties reading every record."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker: read every entry as a data set's __getitem__ would
        os.close(read)
        before = private_dirty_mb()
        for i in range(len(records)):
            r = records[i]
            r.path, r.n_frames, r.label  # noqa: B018 - reading is the point
        os.write(write, f'{private_dirty_mb() - before:.3f}'.encode())
        os._exit(0)
    os.close(write)
    result = float(os.read(read, 64))
    os.waitpid(pid, 0)
    os.close(read)
    return result


def write_kinetics_like(path, n_train, n_val, n_classes=700):
    rng = random.Random(0)
    labels = [f'class {i:03d} doing something' for i in range(n_classes)]
    alphabet = 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_'
    database = {}
    for i in range(n_train + n_val):
        start = rng.randrange(600)
        video_id = ''.join(rng.choices(alphabet, k=11)) + f'_{start:06d}_{start + 10:06d}'
        database[video_id] = {'subset': 'training' if i < n_train else 'validation',
                              'annotations': {'label': labels[i % n_classes],
                                              'segment': [1, rng.randrange(200, 301)]}}
    with open(path, 'w') as f:
        json.dump({'labels': labels, 'database': database}, f)


def index_rows(root, n_entries):
    """Start-up time and per-worker dirtied memory: VideoRecord list vs RecordTable."""
    annotation = root / 'kinetics_like.json'
    n_train = n_entries * 9 // 10
    write_kinetics_like(annotation, n_train, n_entries - n_train)
    args = (annotation, 'training', '/data/kinetics/jpg', 'kinetics')
    rows = []
    start = time.perf_counter()
    records, _ = load_annotations(*args)
    rows.append(('list of VideoRecord (load_annotations)', time.perf_counter() - start,
                 dirtied_by_worker(records), len(records)))
    del records
    gc.collect()
    for label in ('RecordTable, first start (builds the cache)', 'RecordTable, cached start'):
        start = time.perf_counter()
        table, _, _ = load_record_table(*args, cache_dir=root / 'results')
        rows.append((label, time.perf_counter() - start, dirtied_by_worker(table), len(table)))
        del table
        gc.collect()
    size = annotation.stat().st_size / 1e6
    print(f'\nannotation index: {n_entries} entries ({size:.0f} MB JSON), training subset')
    print('| index | start-up (s) | dirtied per worker (MB) | records |')
    print('|---|---:|---:|---:|')
    for label, seconds, dirtied, n in rows:
        print(f'| {label} | {seconds:.2f} | {dirtied:.1f} | {n} |')


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--videos', type=int, default=8)
    p.add_argument('--n_frames', type=int, default=160)
    p.add_argument('--clips', type=int, default=60, help='clips per row (each timed in 5 rounds)')
    p.add_argument('--frames', nargs='+', choices=FRAMES, default=['noise'],
                   help='the frames of the generated videos: noise (blocks of colour plus per-pixel '
                        'noise), photo (scikit-image\'s photographs panned and zoomed: camera-like; '
                        'pip install -r requirements-dev.txt); both: every section for each')
    p.add_argument('--quality', type=int, default=None,
                   help='JPEG quality of the jpg/hdf5 frames (default: 95 for noise, '
                        'generate_video_jpgs\'s default; 90 for photo)')
    p.add_argument('--workers', type=int, nargs='+', default=[1, 2])
    p.add_argument('--batches', type=int, default=8, help='batches per worker count')
    p.add_argument('--index_entries', type=int, default=650_000)
    sections = ['formats', 'jpeg', 'steps', 'layout', 'workers', 'index', 'videos']
    p.add_argument('--sections', nargs='+', default=sections, choices=sections)
    p.add_argument('--video_clips', type=int, default=120,
                   help='clips per video row (bench/video_clips.py)')
    p.add_argument('--clock', choices=list(CLOCKS), default='wall',
                   help='time the clips by the wall clock or by this process\'s CPU time '
                        '(a shared machine; the workers section is always wall time)')
    args = p.parse_args(argv)
    global clock
    clock = CLOCKS[args.clock]
    torch.set_num_threads(1)
    for frames in dict.fromkeys(args.frames):
        quality = args.quality or QUALITY[frames]
        print(f'\n## frames: {frames} ({FRAME_NAMES[frames]}), JPEG quality {quality}')
        with tempfile.TemporaryDirectory() as tmp:
            frame_sections(Path(tmp), args, frames, quality)
    with tempfile.TemporaryDirectory() as tmp:  # independent of the frames
        if 'index' in args.sections:
            index_rows(Path(tmp), args.index_entries)
        if 'videos' in args.sections:  # bench/video_clips.py's own (noise) frames
            video_clips.run(n_clips=args.video_clips, clock=clock)


def frame_sections(root, args, frames, quality):
    """The sections that time the generated videos of ``frames``."""
    if {'formats', 'jpeg', 'steps', 'workers'} & set(args.sections):
        paths = prepare(root, args.videos, args.n_frames, (240, 320), quality, frames)
        frame_kb = disk_mb(root / 'jpg') * 1e3 / (args.videos * args.n_frames)
    if 'formats' in args.sections:
        rates = format_rows(paths, args.clips, args.n_frames)
        sizes = {fmt: disk_mb(root / fmt) for fmt in ('jpg', 'hdf5', *FORMATS)}
        print_format_table(rates, sizes, args.videos, args.n_frames)
    if 'jpeg' in args.sections:
        print_jpeg_table(jpeg_rows(paths, args.clips, args.n_frames), args.videos,
                         args.n_frames, quality, frame_kb)
        print_video_scale_table(video_scale_rows(paths, args.clips, args.n_frames),
                                args.videos, args.n_frames)
        dct_scaling_costs(paths['jpg'][0], min(48, args.n_frames))
    if 'steps' in args.sections:
        print_step_table(step_rows(paths, args.clips, args.n_frames), frames, quality, frame_kb)
    if 'layout' in args.sections:
        after_decoding_costs(frames, quality)
    if 'workers' in args.sections:
        rates = worker_rows(root, args.workers, args.batches)
        print('\nDataLoader (batch 8, random 16-frame clips, crop to 112) feeding a model '
              'that does nothing: clips/s')
        print('| format | ' + ' | '.join(f'{n} worker(s)' for n in args.workers) + ' |')
        print('|---|' + '---:|' * len(args.workers))
        for fmt in ('jpg', 'hdf5', 'mp4'):
            cells = ' | '.join(f'{rates[fmt, n]:.1f}' for n in args.workers)
            print(f'| {fmt} | {cells} |')


if __name__ == '__main__':
    main()
