"""Clip loaders: read the needed frames of one video at once and decode them as a batch.

Every loader is called as ``loader(video, positions) -> uint8 tensor (T, C, H, W)``
with 0-based frame ``positions`` (they may repeat, e.g. loop padding: each
distinct frame is read and decoded once, then indexed).  A missing or corrupt
frame raises :class:`~utils.errors.DataError` naming the file and the
video; a clip is never silently shortened.

The JPEG loaders (jpg folders, hdf5) also split a call in two:
``loader.read(video, positions)`` reads the bytes and returns an
:class:`EncodedClip`, whose ``frame_size`` comes from the first frame's header;
``encoded.decode(factor)`` then decodes every frame at 1/factor of its size
(1, 2, 4 or 8: libjpeg-turbo scales in the DCT domain, through simplejpeg), so
a data set can let the spatial transform choose its crop before anything is
decoded (datasets/videodataset.py).  At factor 1 the frames are bit-identical
to ``torchvision.io.decode_jpeg``'s (tests/test_datasets.py).

With ``--decode_device cuda`` (a loader made with ``defer_decoding=True``) the
workers decode nothing: an item is a :class:`DeferredClip` (the frames' bytes
packed in one uint8 tensor, :class:`PackedFrames`, and the crop the spatial
transform planned), a batch a :class:`DeferredBatch`, which the main process
decodes on the device (datasets/device_batches.py, datasets/device_jpeg.py).
"""
from __future__ import annotations

import os
from typing import NamedTuple, Sequence

import numpy as np
import simplejpeg
import torch

from datasets.formats import HDF5_FLOW_KEYS, HDF5_RGB_KEYS, frame_file_name
from datasets.open_files import OpenFiles
from datasets.spatial_transforms import DCT_FACTORS, host_empty
from datasets.video import VideoClipLoader
from utils.errors import DataError

__all__ = ['JpgClipLoader', 'Hdf5ClipLoader', 'Hdf5FlowLoader', 'EncodedClip', 'make_loader',
           'decode_frames', 'PackedFrames', 'DeferredClip', 'DeferredBatch']

# What to do about the file, true wherever it is read (DataError: the caller
# says what else can be done, e.g. leave the video out).
_REEXTRACT = 're-extract the frames of this video (util_scripts generate_video_jpgs / generate_video_hdf5)'
_CHANNELS = {'RGB': 3, 'GRAY': 1}
SHARD_MEMBERS_OPEN = 8  # hdf5 payloads of shards kept in memory per process


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


def _corrupt(name: str, video: str, error: Exception) -> DataError:
    return DataError(f'frame {name} of video {video} is corrupt (cannot decode JPEG: '
                     f'{str(error).splitlines()[0] if str(error) else type(error).__name__}): '
                     f'{_REEXTRACT}')


def _header_size(data, name: str, video: str) -> tuple[int, int]:
    """(height, width) from a JPEG header (no decoding)."""
    try:
        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError as e:
        raise _corrupt(name, video, e) from None
    return height, width


def _scaled(size: tuple[int, int], factor: int) -> tuple[int, int]:
    """libjpeg's output size at 1/factor: each side rounded up."""
    return -(-size[0] // factor), -(-size[1] // factor)


def _size_error(video: str, name: str, first: tuple[int, int], data) -> DataError:
    got = _header_size(data, name, video)
    return DataError(f'frames of video {video} have different sizes: {name} is '
                     f'{got[0]}x{got[1]}, the first frame {first[0]}x{first[1]}: {_REEXTRACT}')


def _cmyk_converted(frame, colorspace: str, scale: dict) -> np.ndarray:
    """A CMYK (or YCCK) JPEG decoded to CMYK and converted as torchvision's
    decoder does (simplejpeg's own CMYK -> RGB differs by up to 2 levels):
    R = K - round(K * (255 - C) / 255) in integers (all within uint16), and
    gray = (19595 R + 38470 G + 7471 B + 32768) >> 16."""
    cmyk = simplejpeg.decode_jpeg(frame, colorspace='CMYK', **scale).astype(np.uint16)
    k = cmyk[..., 3:]
    v = k * (255 - cmyk[..., :3]) + 128
    rgb = k - (((v >> 8) + v) >> 8)  # never below 0: round(K * x / 255) <= K
    if colorspace == 'RGB':
        return rgb.astype(np.uint8)
    gray = (rgb.astype(np.uint32) * np.array([19595, 38470, 7471], np.uint32)).sum(-1, keepdims=True)
    return ((gray + 32768) >> 16).astype(np.uint8)


def decode_frames(data: Sequence, names: Sequence[str], video: str, colorspace: str = 'RGB',
                  factor: int = 1, size: tuple[int, int] | None = None) -> torch.Tensor:
    """JPEG byte strings -> uint8 (T, H, W, C) at 1/factor of the frames' ``size``
    (read from the first header if None), each frame decoded straight into its
    slot of the clip (libjpeg-turbo's accurate DCT and fancy upsampling, as
    torchvision's decoder: identical frames; CMYK frames are converted with
    torchvision's formulas).  Corrupt frames and frames of another size raise
    DataError naming the frame."""
    size = size or _header_size(data[0], names[0], video)
    height, width = _scaled(size, factor)
    out = host_empty((len(data), height, width, _CHANNELS[colorspace]))
    slots = out.numpy()
    # min_factor keeps simplejpeg to exactly 1/factor (it would also pick 7/8, 3/4, ...)
    scale = {} if factor == 1 else dict(min_factor=factor, min_height=height, min_width=width)
    for slot, frame, name in zip(slots, data, names):
        try:
            if simplejpeg.decode_jpeg_header(frame)[2] in ('CMYK', 'YCCK'):  # 3 us a frame
                got = _cmyk_converted(frame, colorspace, scale)
                if got.shape == slot.shape:
                    slot[...] = got
            else:
                got = simplejpeg.decode_jpeg(frame, colorspace=colorspace, buffer=slot, **scale)
        except ValueError as e:  # corrupt, or larger than the first frame (buffer too small)
            if 'buffer is too small' in str(e):
                raise _size_error(video, name, size, frame) from None
            raise _corrupt(name, video, e) from None
        if got.shape != slot.shape:
            raise _size_error(video, name, size, frame)
    return out


class EncodedClip:
    """The JPEG bytes of a clip's distinct frames, read but not decoded.

    ``planes``: one list of frames per plane (RGB: one; flow: u and v, each
    grayscale), ``names`` the same shape (for messages).  ``frame_size`` is the
    first frame's (height, width) from its header; :meth:`decode` decodes every
    plane at 1/factor and stacks them along the channels -> uint8 (T, C, h, w)
    in channels-last memory (indexed back to the requested positions)."""

    factors = DCT_FACTORS

    def __init__(self, planes, names, video: str, colorspace: str = 'RGB', index=None):
        self.planes, self.names, self.video = planes, names, video
        self.colorspace, self.index = colorspace, index
        self._size = None

    @property
    def frame_size(self) -> tuple[int, int]:
        if self._size is None:
            self._size = _header_size(self.planes[0][0], self.names[0][0], self.video)
        return self._size

    def decode(self, factor: int = 1) -> torch.Tensor:
        if factor != 1 and factor not in self.factors:
            raise ValueError(f'JPEG frames decode at 1/1, 1/2, 1/4 or 1/8, not 1/{factor}')
        size = self.frame_size
        planes = [decode_frames(data, names, self.video, self.colorspace, factor, size)
                  for data, names in zip(self.planes, self.names)]
        frames = planes[0] if len(planes) == 1 else torch.cat(planes, dim=-1)
        # (T, H, W, C) memory seen as (T, C, H, W): channels-last, which the uint8
        # resize takes ~2.5x faster than a (C, H, W)-contiguous clip
        clip = frames.permute(0, 3, 1, 2)
        return clip if self.index is None else clip[self.index]

    def pack(self) -> PackedFrames:
        """The bytes in one uint8 tensor (through the workers' shared memory as one
        buffer, not one pickled string per frame); one plane only (RGB)."""
        if len(self.planes) != 1:
            raise ValueError('only single-plane (RGB) clips are packed for device decoding')
        data = self.planes[0]
        ends = np.cumsum([len(frame) for frame in data])
        packed = np.frombuffer(b''.join(data), dtype=np.uint8)
        return PackedFrames(torch.from_numpy(packed.copy()), ends.tolist(), self.names[0],
                            self.video, self.colorspace, self.frame_size)


class PackedFrames(NamedTuple):
    """A clip's distinct JPEG frames, read in a worker and not decoded:
    ``data`` all their bytes (uint8, 1-D), frame i is ``data[ends[i - 1]:ends[i]]``;
    ``frame_size`` (height, width) from the first frame's header."""
    data: torch.Tensor
    ends: list
    names: list
    video: str
    colorspace: str
    frame_size: tuple

    def frames(self) -> list[torch.Tensor]:
        """Each frame's bytes (views of ``data``)."""
        starts = [0] + self.ends[:-1]
        return [self.data[a:b] for a, b in zip(starts, self.ends)]

    def unpack(self) -> EncodedClip:
        clip = EncodedClip([[f.numpy().tobytes() for f in self.frames()]], [self.names],
                           self.video, self.colorspace)
        clip._size = tuple(self.frame_size)
        return clip


class DeferredClip(NamedTuple):
    """What a worker hands over for an item when the main process decodes:
    the frames of ``union`` (sorted distinct positions) as ``frames``, the
    spatial transform's ``plan`` for them, the ``clips`` (lists of positions) to
    cut out, whether the item holds several (``multi``), ``rng_state``: the
    worker's CPU generator state right after the plan was drawn, from which the
    item's other random augmentation steps continue (None: the transform draws
    none), and ``record``: the index of the item's video in its data set (for
    --on_bad_video skip's report of a frame that fails to decode)."""
    frames: PackedFrames
    plan: object
    union: list
    clips: list
    multi: bool
    rng_state: bytes | None
    record: int


class DeferredBatch(list):
    """A batch of DeferredClips (the first field of a batch that the loader's
    ToDevice decodes on the device)."""


class JpgClipLoader:
    """Frames ``<video_dir>/image_{p+1:05d}.jpg``; decodes RGB (or ``colorspace='GRAY'``)."""

    defer_decoding = False  # True: the data set hands over DeferredClips

    def __init__(self, colorspace: str = 'RGB'):
        if colorspace not in _CHANNELS:
            raise ValueError(f'colorspace must be one of {sorted(_CHANNELS)}, got {colorspace!r}')
        self.colorspace = colorspace

    def read(self, video_dir, positions: Sequence[int]) -> EncodedClip:
        video_dir = os.fspath(video_dir)
        uniq, index = _unique(positions)
        paths = [os.path.join(video_dir, frame_file_name(p)) for p in uniq]
        data = []
        for path in paths:
            try:
                with open(path, 'rb', buffering=0) as f:  # one read, no buffer object
                    data.append(f.read())
            except OSError:
                if not os.path.isdir(video_dir):
                    raise DataError(f'video folder {video_dir} not found (needed frame '
                                    f'{os.path.basename(path)}): check --video_path, or '
                                    f'{_REEXTRACT}') from None
                raise DataError(f'frame file {path} of video {video_dir} is missing or '
                                f'unreadable: {_REEXTRACT}') from None
            if not data[-1]:
                raise DataError(f'frame file {path} of video {video_dir} is empty: '
                                f'{_REEXTRACT}')
        return EncodedClip([data], [paths], video_dir, self.colorspace, index)

    def __call__(self, video_dir, positions: Sequence[int]) -> torch.Tensor:
        return self.read(video_dir, positions).decode()


def _open_hdf5(path: str, store=None):
    """The hdf5 file at ``path``, or with a ShardStore (datasets/storage.py) the
    payload of REL ``path`` read into memory (one ranged read)."""
    import h5py
    if store is not None:
        try:
            return h5py.File(store.open_member(path), 'r')
        except OSError as e:
            raise DataError(f'hdf5 video {store.where(path)} cannot be opened ({e}): {_REEXTRACT}, '
                            f'then util_scripts.make_shards again') from None
    try:
        return h5py.File(path, 'r')
    except FileNotFoundError:
        raise DataError(f'hdf5 video {path} not found: check --video_path and '
                        f'--file_type, or {_REEXTRACT}') from None
    except OSError as e:
        raise DataError(f'hdf5 video {path} cannot be opened ({e}): {_REEXTRACT}') from None


class Hdf5ClipLoader:
    """``<video>.hdf5`` with dataset ``video``: element p = JPEG bytes of frame p.

    Keeps the files it opened per process (``max_open`` at most, the least
    recently used closed first: datasets/open_files.py); files are opened
    lazily on first use and never shared between processes.  With ``store`` (a
    ShardStore) paths are REL keys of its shards, each file read into memory
    whole (fewer of them kept).
    """
    keys: tuple[str, ...] = HDF5_RGB_KEYS
    colorspace = 'RGB'
    defer_decoding = False  # True: the data set hands over DeferredClips

    def __init__(self, max_open: int = 64, store=None):
        self.store = store
        self._files = OpenFiles(max_open if store is None else min(max_open, SHARD_MEMBERS_OPEN))

    def close(self):
        self._files.close()

    def _open(self, path: str):
        return self._files.get(path, lambda p: _open_hdf5(p, self.store))

    def _read(self, f, path: str, key: str, uniq: list[int]) -> list[np.ndarray]:
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
                return list(ds[uniq[0]:uniq[-1] + 1])
            return list(ds[uniq])  # one sorted fancy-index read
        except OSError as e:
            raise DataError(f'hdf5 video {path}: reading frames failed ({e}): '
                            f'{_REEXTRACT}') from None

    def read(self, video_path, positions: Sequence[int]) -> EncodedClip:
        path = os.fspath(video_path)
        uniq, index = _unique(positions)
        f = self._open(path)
        planes = [self._read(f, path, key, uniq) for key in self.keys]
        names = [[f'{path}[{key}][{p}]' for p in uniq] for key in self.keys]
        return EncodedClip(planes, names, path, self.colorspace, index)

    def __call__(self, video_path, positions: Sequence[int]) -> torch.Tensor:
        return self.read(video_path, positions).decode()


class Hdf5FlowLoader(Hdf5ClipLoader):
    """Optical flow in hdf5: datasets ``video_u`` and ``video_v`` (grayscale
    JPEGs) -> uint8 (T, 2, H, W)."""
    keys = HDF5_FLOW_KEYS
    colorspace = 'GRAY'


def make_loader(file_type: str = 'jpg', input_type: str = 'rgb', short_side: int | None = None,
                defer_decoding: bool = False, store=None):
    """jpg+rgb -> JpgClipLoader, hdf5+rgb -> Hdf5ClipLoader, hdf5+flow -> Hdf5FlowLoader,
    video+rgb -> datasets.video.VideoClipLoader (decoded frames resized by FFmpeg to
    ``short_side`` if given: for transforms that resize the short side first).
    ``defer_decoding``: the JPEG RGB loaders' data sets hand over DeferredClips.
    ``store``: a ShardStore the hdf5 and video payloads are read from (make_shards
    packs jpg folders as hdf5)."""
    if defer_decoding and (input_type != 'rgb' or file_type not in ('jpg', 'hdf5')):
        raise ValueError('only jpg and hdf5 RGB frames are decoded on the device')
    if store is not None and file_type == 'jpg':
        raise ValueError('shards hold hdf5 or video payloads (make_shards packs jpg folders as hdf5)')
    if input_type == 'rgb':
        if file_type in ('jpg', 'hdf5'):
            loader = JpgClipLoader() if file_type == 'jpg' else Hdf5ClipLoader(store=store)
            loader.defer_decoding = defer_decoding
            return loader
        if file_type == 'video':
            return VideoClipLoader(short_side=short_side, store=store)
    elif input_type == 'flow':
        if file_type == 'hdf5':
            return Hdf5FlowLoader(store=store)
        where = {'jpg': 'jpg folders', 'video': 'video files'}.get(file_type)
        if where is not None:  # main.py's options and predict.py's inputs alike
            raise DataError(f'optical flow (--input_type flow) is read from hdf5 files '
                            f'(datasets video_u and video_v, --file_type hdf5), not from {where}')
    raise DataError(f'unsupported --file_type {file_type!r} / --input_type {input_type!r}: '
                    f"use jpg, hdf5 or video, rgb or flow")
