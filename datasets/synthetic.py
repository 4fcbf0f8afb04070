"""Built-in synthetic motion data set: no download, the default for demos and tests.

Each video shows one object (disc or square, random bright colour and size)
on a random, darker, noisy, textured static background.  The class is visible only
through motion -- a single frame does not tell it: the start position, colour,
shape, size and speed are random, and the sizes of ``grow`` and ``shrink``
cover the same range.

Classes: the object moves left / right / up / down, or grows / shrinks.

The set is written once in the ordinary jpg layout
``<root>/jpg/<label>/<video_id>/image_00001.jpg ...`` (test videos under
``<root>/jpg/test/``) with an annotation file ``<root>/synthetic.json`` in the
UCF-101 format (1-based segments ``[1, n_frames + 1]``), so training on it
exercises the real annotation reader and loaders.

Training on it: do NOT use horizontal flips (``--no_hflip``): a flip turns
``move_left`` into ``move_right``.  A ResNet-10 (widen factor 0.5) with
``--sample_size 32 --sample_duration 8`` learns it in a few CPU minutes.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from torchvision.io import encode_jpeg

from datasets.formats import frame_file_name
from utils.atomic import write_atomic

__all__ = ['CLASSES', 'prepare_synthetic', 'render_video', 'video_seed',
           'ANNOTATION_NAME', 'STAMP_NAME']

CLASSES = ('move_left', 'move_right', 'move_up', 'move_down', 'grow', 'shrink')
FORMAT_VERSION = 2
ANNOTATION_NAME = 'synthetic.json'
STAMP_NAME = 'synthetic.stamp.json'
JPEG_QUALITY = 90
_SUBSET_CODES = {'training': 0, 'validation': 1, 'testing': 2}
_DIRECTIONS = {'move_left': (0.0, -1.0), 'move_right': (0.0, 1.0),
               'move_up': (-1.0, 0.0), 'move_down': (1.0, 0.0)}  # (dy, dx)


def video_seed(seed: int, subset: str, index: int) -> np.random.Generator:
    """The generator that renders video ``index`` of ``subset`` (independent per video)."""
    return np.random.default_rng([seed, _SUBSET_CODES[subset], index])


def _background(rng: np.random.Generator, n_frames: int, size: int):
    """Dark-to-mid, randomly tinted, smooth colour texture plus fine static texture,
    plus per-frame sensor noise: (T, S, S, 3) float, and the base colour."""
    base = rng.uniform(20, 100) + rng.uniform(-25, 25, size=3)
    coarse = rng.normal(0, 20, size=(1, 3, 6, 6))
    smooth = torch.nn.functional.interpolate(torch.from_numpy(coarse), size=(size, size),
                                             mode='bicubic', align_corners=True)
    smooth = smooth[0].permute(1, 2, 0).numpy()
    fine = rng.normal(0, 6, size=(size, size, 3))
    static = base + smooth + fine
    return static[None] + rng.normal(0, 4, size=(n_frames, size, size, 3)), base


def _object_colour(rng: np.random.Generator) -> np.ndarray:
    """A random bright colour: the object is always brighter than the background.

    The constant contrast polarity is what keeps the set learnable in a couple
    of CPU minutes: with random background *and* object colours, a small 3D
    ResNet memorised the 240 training videos by their colours long before it
    learnt the motion (validation stayed at chance)."""
    return rng.uniform(150, 255, size=3)


def render_video(rng: np.random.Generator, class_index: int, n_frames: int = 16,
                 frame_size: int = 40) -> tuple[np.ndarray, np.ndarray]:
    """Render one video of class ``CLASSES[class_index]``.

    Returns frames uint8 (T, H, W, 3) and the object mask bool (T, H, W).
    """
    t_count, s = n_frames, frame_size
    name = CLASSES[class_index]
    frames, _ = _background(rng, t_count, s)
    colour = _object_colour(rng)
    square = bool(rng.integers(2))
    t = np.arange(t_count, dtype=np.float64)
    steps = max(t_count - 1, 1)
    if name in _DIRECTIONS:
        r = rng.uniform(3.0, 7.0)
        max_travel = s - 2 * r - 2
        speed = min(rng.uniform(1.0, 1.8), max_travel / steps)
        travel = speed * steps
        dy, dx = _DIRECTIONS[name]
        lo, hi = r + 1, s - r - 1

        def start(d):
            if d > 0:
                return rng.uniform(lo, max(lo, hi - travel))
            if d < 0:
                return rng.uniform(min(lo + travel, hi), hi)
            return rng.uniform(lo, hi)
        cy0, cx0 = start(dy), start(dx)
        cy, cx = cy0 + dy * speed * t, cx0 + dx * speed * t
        radius = np.full(t_count, r)
    else:
        r_small = rng.uniform(2.5, 5.0)
        r_big = min(r_small + rng.uniform(3.5, 6.0), s / 2 - 2)
        r0, r1 = (r_small, r_big) if name == 'grow' else (r_big, r_small)
        radius = r0 + (r1 - r0) * t / steps
        cy = np.full(t_count, rng.uniform(r_big + 1, s - r_big - 1))
        cx = np.full(t_count, rng.uniform(r_big + 1, s - r_big - 1))
    yy = np.arange(s, dtype=np.float64)[None, :, None] - cy[:, None, None]
    xx = np.arange(s, dtype=np.float64)[None, None, :] - cx[:, None, None]
    dist = np.maximum(np.abs(yy), np.abs(xx)) if square else np.sqrt(yy ** 2 + xx ** 2)
    alpha = np.clip(radius[:, None, None] + 0.5 - dist, 0.0, 1.0)  # antialiased edge
    frames = frames * (1 - alpha[..., None]) + colour * alpha[..., None]
    frames = np.clip(np.rint(frames), 0, 255).astype(np.uint8)
    return frames, alpha > 0.5


def _write_video(folder: Path, frames: np.ndarray) -> None:
    folder.mkdir(parents=True)
    chw = torch.from_numpy(frames).permute(0, 3, 1, 2)
    encoded = encode_jpeg(list(chw), quality=JPEG_QUALITY)
    for i, data in enumerate(encoded):
        (folder / frame_file_name(i)).write_bytes(data.numpy().tobytes())


def _generate(out: Path, params: dict) -> None:
    seed, n_frames, size = params['seed'], params['n_frames'], params['frame_size']
    jpg = out / 'jpg'
    database = {}
    plan = [('training', params['n_train_per_class']), ('validation', params['n_val_per_class'])]
    for subset, per_class in plan:
        prefix = 'train' if subset == 'training' else 'val'
        for c, name in enumerate(CLASSES):
            for i in range(per_class):
                index = c * per_class + i
                frames, _ = render_video(video_seed(seed, subset, index), c, n_frames, size)
                video_id = f'{prefix}_{name}_{i:03d}'
                _write_video(jpg / name / video_id, frames)
                database[video_id] = {'subset': subset,
                                      'annotations': {'label': name,
                                                      'segment': [1, n_frames + 1]}}
    test_classes = np.random.default_rng([seed, 3]).integers(len(CLASSES), size=params['n_test'])
    for i, c in enumerate(test_classes):
        frames, _ = render_video(video_seed(seed, 'testing', i), int(c), n_frames, size)
        video_id = f'test_{i:03d}'
        _write_video(jpg / 'test' / video_id, frames)
        database[video_id] = {'subset': 'testing', 'annotations': {'segment': [1, n_frames + 1]}}
    annotation = {'labels': list(CLASSES), 'database': database}
    (out / ANNOTATION_NAME).write_text(json.dumps(annotation, indent=1, sort_keys=False))
    # the test videos' classes, for checking inference output by hand
    (out / 'test_labels.json').write_text(json.dumps(
        {f'test_{i:03d}': CLASSES[int(c)] for i, c in enumerate(test_classes)}, indent=1))


@contextmanager
def _locked(root: Path):
    with open(root / '.synthetic.lock', 'a+') as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _complete(root: Path, params: dict) -> bool:
    try:
        stamp = json.loads((root / STAMP_NAME).read_text())
    except (OSError, ValueError):
        return False
    return (stamp == params and (root / ANNOTATION_NAME).is_file()
            and (root / 'jpg').is_dir())


def synthetic_paths(root) -> tuple[str, str]:
    """(video_path, annotation_path) of the synthetic set under ``root``."""
    return str(Path(root) / 'jpg'), str(Path(root) / ANNOTATION_NAME)


def prepare_synthetic(root, *, seed: int = 0, n_train_per_class: int = 40,
                      n_val_per_class: int = 10, n_test: int = 12, n_frames: int = 16,
                      frame_size: int = 40) -> tuple[str, str]:
    """Generate the synthetic set under ``root`` once; returns (video_path, annotation_path).

    Deterministic from ``seed``.  If a complete set with the same parameters
    exists (stamp file ``synthetic.stamp.json``, written last) it returns at
    once.  Generation happens in a temporary folder that is renamed into
    place under a file lock, so an interrupted run is redone and concurrent
    callers (several ranks) do not collide.
    """
    root = Path(root)
    params = {'version': FORMAT_VERSION, 'seed': int(seed),
              'n_train_per_class': int(n_train_per_class),
              'n_val_per_class': int(n_val_per_class), 'n_test': int(n_test),
              'n_frames': int(n_frames), 'frame_size': int(frame_size), 'classes': list(CLASSES)}
    result = synthetic_paths(root)
    if _complete(root, params):
        return result
    if n_frames < 2 or frame_size < 24:
        raise ValueError('prepare_synthetic needs n_frames >= 2 and frame_size >= 24')
    if n_train_per_class < 1 or n_val_per_class < 1 or n_test < 0:
        raise ValueError('prepare_synthetic needs at least one training and one '
                         'validation video per class')
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root):
        if _complete(root, params):  # another process finished meanwhile
            return result
        for stale in root.glob('.tmp-synthetic-*'):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix='.tmp-synthetic-', dir=root))
        try:
            _generate(tmp, params)
            (root / STAMP_NAME).unlink(missing_ok=True)
            if (root / 'jpg').exists():
                shutil.rmtree(root / 'jpg')
            os.rename(tmp / 'jpg', root / 'jpg')
            os.replace(tmp / ANNOTATION_NAME, root / ANNOTATION_NAME)
            os.replace(tmp / 'test_labels.json', root / 'test_labels.json')
            write_atomic(root / STAMP_NAME, json.dumps(params, indent=1))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return result


if __name__ == '__main__':  # python -m datasets.synthetic [root]
    import sys
    t0 = time.perf_counter()
    paths = prepare_synthetic(sys.argv[1] if len(sys.argv) > 1 else 'data/synthetic')
    print(paths, f'{time.perf_counter() - t0:.2f} s')
