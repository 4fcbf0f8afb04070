"""bench/data_loading.py's formats section: clips/s of the predecessor's path and
ours on jpg, hdf5, .mp4 and .avi against the decode limit of each (rows a to g),
with the disk size of each format."""
import random

import torch
from PIL import Image
from torchvision.io import decode_jpeg
from torchvision.transforms import functional as TF

from bench import video_clips
from bench.loading_timing import best_of_rounds, planned_clip
from datasets.loader import Hdf5ClipLoader, JpgClipLoader
from datasets.spatial_transforms import build_train_transform, get_mean_std
from datasets.video import VideoClipLoader
from datasets.video_index import FrameTable


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
