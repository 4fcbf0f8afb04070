"""Clip loading throughput: our whole-clip path against the predecessor's
frame-at-a-time path, on the same JPEG folders.

    python -m bench.data_loading [--frame_size 240 320] [--clips 60]

ours:        read the needed files once, decode the clip in one
             torchvision.io.decode_jpeg call, crop/flip/resize the uint8 clip
             at once (datasets/), normalize last.
predecessor: per frame: exists() check, PIL open + convert, RandomResizedCrop
             with the clip's box, flip, ToTensor, Normalize, then stack
             (3D-ResNets-PyTorch's loader and spatial transforms, re-created
             here with current torchvision).
One process, one thread, 16-frame clips cropped to 112x112 (training
augmentation); the figures are clips per second.
"""
import argparse
import random
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torchvision.transforms import functional as TF

from datasets.loader import JpgClipLoader
from datasets.spatial_transforms import build_train_transform, get_mean_std
from datasets.temporal_transforms import TemporalRandomCrop


def write_videos(root, n_videos, n_frames, size):
    """Textured frames (smooth colour blobs plus noise) compress like real video."""
    rng = np.random.default_rng(0)
    h, w = size
    for v in range(n_videos):
        folder = root / f'video_{v}'
        folder.mkdir(parents=True)
        base = rng.integers(0, 255, (h // 16 + 1, w // 16 + 1, 3), dtype=np.uint8)
        base = np.kron(base, np.ones((16, 16, 1), dtype=np.uint8))[:h, :w]
        for f in range(n_frames):
            noise = rng.integers(-20, 20, (h, w, 3))
            frame = np.clip(np.roll(base, f * 2, axis=1).astype(int) + noise, 0, 255)
            Image.fromarray(frame.astype(np.uint8)).save(folder / f'image_{f + 1:05d}.jpg',
                                                         quality=90)
    return [root / f'video_{v}' for v in range(n_videos)]


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


def measure(fn, videos, n_clips):
    fn(videos[0])  # warm-up
    start = time.perf_counter()
    for i in range(n_clips):
        clip = fn(videos[i % len(videos)])
    elapsed = time.perf_counter() - start
    assert clip.shape == (3, 16, 112, 112), clip.shape
    return n_clips / elapsed


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--frame_size', type=int, nargs=2, default=[240, 320], metavar=('H', 'W'))
    p.add_argument('--clips', type=int, default=60)
    p.add_argument('--n_frames', type=int, default=48)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    random.seed(0)
    mean, std = get_mean_std(1)
    temporal = TemporalRandomCrop(16)
    loader = JpgClipLoader()
    transform = build_train_transform(112, mean=mean, std=std)
    with tempfile.TemporaryDirectory() as tmp:
        videos = write_videos(Path(tmp), 4, args.n_frames, tuple(args.frame_size))
        ours = measure(lambda v: transform(loader(str(v), temporal(0, args.n_frames))),
                       videos, args.clips)
        theirs = measure(lambda v: predecessor_clip(v, temporal(0, args.n_frames), mean, std),
                         videos, args.clips)
    h, w = args.frame_size
    print(f'16-frame clips from {h}x{w} JPEG frames -> 3x16x112x112, one process, one thread')
    print('| path | clips/s |')
    print('|---|---:|')
    print(f'| predecessor (PIL, frame at a time) | {theirs:.1f} |')
    print(f'| ours (one decode_jpeg call, whole-clip uint8 transforms) | {ours:.1f} |')
    print(f'speed-up: {ours / theirs:.2f}x')


if __name__ == '__main__':
    main()
