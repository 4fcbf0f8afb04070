"""Clip loaders: read the needed frames of one video at once and decode them as a batch.

Every loader is called as ``loader(video, positions) -> uint8 tensor (T, C, H, W)``
with 0-based frame ``positions`` (they may repeat, e.g. loop padding: each
distinct frame is read and decoded once, then indexed).  A missing or corrupt
frame raises :class:`~datasets.annotation.DataError` naming the file and the
video; a clip is never silently shortened.
"""
from __future__ import annotations

import os
from collections import OrderedDict
from typing import Sequence

import torch

# Batched libjpeg-turbo decoding (deprecated in torchvision 0.29 in favour of TorchCodec).
from torchvision.io import ImageReadMode, decode_jpeg

from datasets.annotation import frame_file_name
from utils.errors import DataError

__all__ = ['JpgClipLoader', 'Hdf5ClipLoader', 'Hdf5FlowLoader', 'make_loader']

# What to do about the file, true wherever it is read (DataError: the caller
# says what else can be done, e.g. leave the video out).
_REEXTRACT = 're-extract the frames of this video (util_scripts generate_video_jpgs / generate_video_hdf5)'


def _unique(positions: Sequence[int]):
    """Sorted distinct positions and, when they differ from ``positions``, the
    index tensor that maps them back (None when ``positions`` is already
    strictly increasing)."""
    positions = list(positions)
    if not positions:
        raise DataError('empty list of frame positions requested')
    if all(a < b for a, b in zip(positions, positions[1:])):
        return positions, None
    uniq = sorted(set(positions))
    where = {p: i for i, p in enumerate(uniq)}
    return uniq, torch.tensor([where[p] for p in positions], dtype=torch.long)


def _decode(data: list[torch.Tensor], mode: ImageReadMode, names, video) -> torch.Tensor:
    """Decode a list of JPEG byte tensors in one call and stack them: (T, C, H, W)
    in channels-last memory."""
    try:
        frames = decode_jpeg(data, mode=mode)
    except RuntimeError:
        # find the culprit for the message
        for d, name in zip(data, names):
            try:
                decode_jpeg(d, mode=mode)
            except RuntimeError as e:
                raise DataError(f'frame {name} of video {video} is corrupt (cannot decode JPEG: '
                                f'{str(e).splitlines()[0]}): {_REEXTRACT}') from None
        raise
    try:
        # decode_jpeg returns (C, H, W) views of (H, W, C) memory: stacking those
        # as they lie is ~15x cheaper than a (C, H, W)-contiguous stack, and the
        # resulting channels-last clip resizes ~2.5x faster on uint8.
        return torch.stack([f.permute(1, 2, 0) for f in frames]).permute(0, 3, 1, 2)
    except RuntimeError:
        sizes = sorted({tuple(f.shape) for f in frames})
        raise DataError(f'frames of video {video} have different sizes {sizes}: '
                        f'{_REEXTRACT}') from None


class JpgClipLoader:
    """Frames ``<video_dir>/image_{p+1:05d}.jpg``; decodes RGB (or grayscale)."""

    def __init__(self, mode: ImageReadMode = ImageReadMode.RGB):
        self.mode = mode

    def __call__(self, video_dir, positions: Sequence[int]) -> torch.Tensor:
        video_dir = os.fspath(video_dir)
        uniq, index = _unique(positions)
        names = [frame_file_name(p) for p in uniq]
        data = []
        for name in names:
            path = os.path.join(video_dir, name)
            try:
                with open(path, 'rb') as f:
                    data.append(torch.frombuffer(bytearray(f.read()), dtype=torch.uint8))
            except OSError:
                if not os.path.isdir(video_dir):
                    raise DataError(f'video folder {video_dir} not found (needed frame {name}): '
                                    f'check --video_path, or {_REEXTRACT}') from None
                raise DataError(f'frame file {path} of video {video_dir} is missing or '
                                f'unreadable: {_REEXTRACT}') from None
            except ValueError:  # empty file: frombuffer refuses a zero-length buffer
                data.append(torch.empty(0, dtype=torch.uint8))
            if data[-1].numel() == 0:
                raise DataError(f'frame file {path} of video {video_dir} is empty: '
                                f'{_REEXTRACT}')
        clip = _decode(data, self.mode, [os.path.join(video_dir, n) for n in names], video_dir)
        return clip if index is None else clip[index]


class Hdf5ClipLoader:
    """``<video>.hdf5`` with dataset ``video``: element p = JPEG bytes of frame p.

    Keeps an LRU cache of open files (``max_open``) per process.  Files are
    opened lazily on first use, the cache is dropped when pickled (DataLoader
    workers) and when the process id changes (fork), so handles are never
    shared between processes.
    """
    keys: tuple[str, ...] = ('video',)
    mode = ImageReadMode.RGB

    def __init__(self, max_open: int = 64):
        self.max_open = max_open
        self._files: OrderedDict = OrderedDict()
        self._pid = None

    def __getstate__(self):
        state = self.__dict__.copy()
        state['_files'] = OrderedDict()
        state['_pid'] = None
        return state

    def close(self):
        for f in self._files.values():
            try:
                f.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
        self._files.clear()

    def _open(self, path: str):
        import h5py
        pid = os.getpid()
        if self._pid != pid:  # fresh process: never use a parent's handles
            self._files = OrderedDict()
            self._pid = pid
        f = self._files.get(path)
        if f is not None:
            self._files.move_to_end(path)
            return f
        try:
            f = h5py.File(path, 'r')
        except FileNotFoundError:
            raise DataError(f'hdf5 video {path} not found: check --video_path and '
                            f'--file_type, or {_REEXTRACT}') from None
        except OSError as e:
            raise DataError(f'hdf5 video {path} cannot be opened ({e}): {_REEXTRACT}') from None
        self._files[path] = f
        if len(self._files) > self.max_open:
            _, old = self._files.popitem(last=False)
            old.close()
        return f

    def _read(self, f, path: str, key: str, uniq: list[int]) -> list[torch.Tensor]:
        try:
            ds = f[key]
        except KeyError:
            raise DataError(f'hdf5 video {path} has no dataset {key!r}: {_REEXTRACT}') from None
        n = len(ds)
        if uniq[0] < 0 or uniq[-1] >= n:
            raise DataError(f'hdf5 video {path} has {n} frames but frame position {uniq[-1]} '
                            f'(0-based) was requested: {_REEXTRACT} or fix its segment')
        try:
            if uniq[-1] - uniq[0] + 1 == len(uniq):  # contiguous: one slice read
                elems = ds[uniq[0]:uniq[-1] + 1]
            else:  # one sorted fancy-index read
                elems = ds[uniq]
        except OSError as e:
            raise DataError(f'hdf5 video {path}: reading frames failed ({e}): '
                            f'{_REEXTRACT}') from None
        return [torch.from_numpy(e) for e in elems]

    def _load(self, path: str, uniq: list[int]) -> torch.Tensor:
        f = self._open(path)
        data = self._read(f, path, self.keys[0], uniq)
        return _decode(data, self.mode, [f'{path}[{self.keys[0]}][{p}]' for p in uniq], path)

    def __call__(self, video_path, positions: Sequence[int]) -> torch.Tensor:
        path = os.fspath(video_path)
        uniq, index = _unique(positions)
        clip = self._load(path, uniq)
        return clip if index is None else clip[index]


class Hdf5FlowLoader(Hdf5ClipLoader):
    """Optical flow in hdf5: datasets ``video_u`` and ``video_v`` (grayscale
    JPEGs) -> uint8 (T, 2, H, W)."""
    keys = ('video_u', 'video_v')
    mode = ImageReadMode.GRAY

    def _load(self, path: str, uniq: list[int]) -> torch.Tensor:
        f = self._open(path)
        planes = []
        for key in self.keys:
            data = self._read(f, path, key, uniq)
            planes.append(_decode(data, self.mode, [f'{path}[{key}][{p}]' for p in uniq], path))
        if planes[0].shape != planes[1].shape:
            raise DataError(f'hdf5 video {path}: video_u and video_v frames differ in size: '
                            f'{_REEXTRACT}')
        return torch.cat(planes, dim=1)


def make_loader(file_type: str = 'jpg', input_type: str = 'rgb', short_side: int | None = None):
    """jpg+rgb -> JpgClipLoader, hdf5+rgb -> Hdf5ClipLoader, hdf5+flow -> Hdf5FlowLoader,
    video+rgb -> datasets.video.VideoClipLoader (decoded frames resized by FFmpeg to
    ``short_side`` if given: for transforms that resize the short side first)."""
    if input_type == 'rgb':
        if file_type == 'jpg':
            return JpgClipLoader()
        if file_type == 'hdf5':
            return Hdf5ClipLoader()
        if file_type == 'video':
            from datasets.video import VideoClipLoader
            return VideoClipLoader(short_side=short_side)
    elif input_type == 'flow':
        if file_type == 'hdf5':
            return Hdf5FlowLoader()
        if file_type == 'jpg':
            raise DataError('--input_type flow needs --file_type hdf5 (datasets video_u and '
                            'video_v); flow is not read from jpg folders')
        if file_type == 'video':
            raise DataError('--input_type flow needs --file_type hdf5 (datasets video_u and '
                            'video_v); flow is not read from video files')
    raise DataError(f'unsupported --file_type {file_type!r} / --input_type {input_type!r}: '
                    f"use jpg, hdf5 or video, rgb or flow")
