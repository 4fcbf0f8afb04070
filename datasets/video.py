"""Reading frames straight from video files (.mp4, .avi, .webm, .mkv) with PyAV.

PyAV's wheel carries FFmpeg's libraries: no ``ffmpeg`` binary and no system
package is needed.  Frame *position* ``p`` is the ``p``-th frame (0-based) in
presentation order, the same numbering the preparation tools use when they
write ``image_{p+1:05d}.jpg``, so an annotation built from jpg folders also
works on the videos.

* :func:`read_video` -- a whole video, or given positions, as uint8 (T, C, H, W).
* :func:`iter_frames` -- every frame once, in order (optionally resampled to a
  frame rate and resized), for the preparation tools.
* :class:`VideoClipLoader` -- the ``--file_type video`` clip loader: seeks to
  the keyframe before a clip and decodes only up to its last frame.
* :func:`count_frames` -- frame count from the container header or by decoding.

Rotated (phone) videos come out upright: the display matrix is applied.
"""
from __future__ import annotations

import bisect
import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import torch

from datasets.annotation import DataError

__all__ = ['VIDEO_EXTENSIONS', 'VideoClipLoader', 'container_frames', 'count_frames',
           'iter_frames', 'read_video', 'scaled_size']

# Containers the loader looks for (in this order) at <video_path>/<label>/<video_id>.<ext>.
VIDEO_EXTENSIONS = ('.mp4', '.avi', '.webm', '.mkv')
# Containers whose header frame count is the number of coded frames (a sample table).
EXACT_COUNT_FORMATS = ('mov', 'mp4')
_REENCODE = 're-download or re-encode the video, or remove it from the annotation file'


def _av():
    import av  # imported lazily: jpg/hdf5 runs do not need PyAV
    return av


def _open(path: str):
    av = _av()
    try:
        container = av.open(path)
    except FileNotFoundError:
        raise DataError(f'video file {path} not found: check --video_path') from None
    except (av.FFmpegError, OSError, UnicodeDecodeError) as e:
        raise DataError(f'video file {path} cannot be opened ({e}): {_REENCODE}') from None
    if not container.streams.video:
        container.close()
        raise DataError(f'video file {path} has no video stream: {_REENCODE}')
    return container


def scaled_size(width: int, height: int, short_side: int | None) -> tuple[int, int]:
    """(width, height) with the short side made ``short_side`` and the aspect ratio
    kept (long side truncated as torchvision's resize does, so that an eval
    transform finds the frames at its size); also enlarges.  None or <= 0: unchanged."""
    if not short_side or short_side <= 0:
        return width, height
    if width <= height:
        return short_side, max(1, int(height * short_side / width))
    return max(1, int(width * short_side / height)), short_side


def _quarter_turns(frame) -> int:
    """Counterclockwise quarter turns that make the frame upright (display matrix)."""
    try:
        rotation = frame.rotation
    except (AttributeError, ValueError):
        return 0
    return round((rotation or 0) / 90) % 4


def _reformatter():
    """One per loader / video: FFmpeg's scaler context is kept between frames
    (``frame.to_ndarray(format=...)`` builds a new one per frame: ~10x slower)."""
    from av.video.reformatter import VideoReformatter
    return VideoReformatter()


def _to_array(frame, short_side: int | None, reformatter,
              interpolation: str = 'BILINEAR') -> np.ndarray:
    """Upright RGB (H, W, 3) uint8 of ``frame``, short side resized to ``short_side``."""
    turns = _quarter_turns(frame)
    w, h = frame.width, frame.height
    if turns % 2:  # the stored frame is sideways: scale it so that it is right once turned
        upright_w, upright_h = scaled_size(h, w, short_side)
        size = (upright_h, upright_w)
    else:
        size = scaled_size(w, h, short_side)
    array = reformatter.reformat(frame, format='rgb24', width=size[0], height=size[1],
                                 interpolation=interpolation).to_ndarray()
    return np.rot90(array, turns) if turns else array


def _stack(arrays: list[np.ndarray]) -> torch.Tensor:
    """(H, W, 3) arrays -> uint8 (T, C, H, W) in channels-last memory (as the jpg path)."""
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2)


def _set_threads(stream, threads: int) -> None:
    ctx = stream.codec_context
    if threads != 1:
        ctx.thread_type = 'AUTO'
        ctx.thread_count = threads  # 0: FFmpeg picks one per core


def _frame_rate(stream) -> float | None:
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    return float(rate) if rate else None


def iter_frames(path, fps: float | None = None, short_side: int | None = None,
                threads: int = 0, interpolation: str = 'BICUBIC') -> Iterator[np.ndarray]:
    """Every frame of the video once, in presentation order, as upright RGB
    (H, W, 3) uint8 arrays (variable frame rate: every decoded frame, none
    duplicated or dropped).  ``fps > 0`` resamples: output frame ``k`` shows the
    input frame on screen at time ``k / fps`` (frames dropped or repeated)."""
    path = os.fspath(path)
    av = _av()
    with _open(path) as container:
        stream = container.streams.video[0]
        _set_threads(stream, threads)
        frames = container.decode(stream)
        convert = _reformatter()
        try:
            if fps is None or fps <= 0:
                for frame in frames:
                    yield _to_array(frame, short_side, convert, interpolation)
            else:
                yield from _resample(frames, fps, short_side, convert, interpolation)
        except av.FFmpegError as e:
            raise DataError(f'video file {path}: decoding failed ({e}): {_REENCODE}') from None


def _resample(frames, fps: float, short_side, convert, interpolation) -> Iterator[np.ndarray]:
    """Output slot k (time k / fps from the first frame) takes the last frame that
    started at or before it; the last frame lasts the mean frame duration."""
    start = previous = None
    produced = n_in = 0
    for frame in frames:
        t = frame.time if frame.time is not None else n_in / fps
        if start is None:
            start = t
        if previous is not None:
            while produced / fps < t - start - 1e-9:
                yield previous[1]
                produced += 1
        previous = (t, _to_array(frame, short_side, convert, interpolation))
        n_in += 1
    if previous is not None:
        mean_duration = (previous[0] - start) / (n_in - 1) if n_in > 1 else 1.0 / fps
        end = previous[0] - start + mean_duration
        while produced / fps < end - 1e-9 or produced == 0:
            yield previous[1]
            produced += 1


@dataclass(frozen=True)
class _FrameIndex:
    """Presentation timestamps of every frame (sorted: index = position) and of
    the keyframes, from one demux pass (no decoding).  ``pts`` is None when the
    container gives packets without timestamps: then clips decode from the start."""
    pts: np.ndarray | None
    keyframes: list[int]
    n_frames: int


def _frame_index(container, stream) -> _FrameIndex:
    pts, keys = [], []
    has_all = True
    for packet in container.demux(stream):
        if packet.size == 0:  # flush packet or an empty (dropped-frame) AVI chunk
            continue
        if packet.pts is None:
            has_all = False
            pts.append(0)
            continue
        pts.append(packet.pts)
        if packet.is_keyframe:
            keys.append(packet.pts)
    container.seek(0, stream=stream)  # rewind for decoding (seek also flushes the decoder)
    if not has_all or len(set(pts)) != len(pts):
        return _FrameIndex(None, [], len(pts))
    keys.sort()
    return _FrameIndex(np.sort(np.asarray(pts, dtype=np.int64)), keys, len(pts))


def container_frames(path) -> int | None:
    """The frame count the container's header gives (None if it gives none);
    opens the file, decodes nothing.  Raises DataError if it is no video."""
    with _open(os.fspath(path)) as container:
        n = container.streams.video[0].frames
    return int(n) if n > 0 else None


def count_frames(path, exact: bool = False) -> tuple[int, str]:
    """(frame count, how it was measured: 'container' or 'decoded').

    MP4/MOV headers count the coded frames exactly; AVI indexes may list
    dropped (empty) frames and WebM/MKV give no count, so those (and
    ``exact=True``) are counted by decoding every frame."""
    path = os.fspath(path)
    av = _av()
    with _open(path) as container:
        stream = container.streams.video[0]
        formats = set(container.format.name.split(','))
        if not exact and stream.frames > 0 and formats & set(EXACT_COUNT_FORMATS):
            return int(stream.frames), 'container'
        _set_threads(stream, 0)
        n = 0
        try:
            for _ in container.decode(stream):
                n += 1
        except av.FFmpegError as e:
            raise DataError(f'video file {path}: decoding failed after {n} frames ({e}): '
                            f'{_REENCODE}') from None
        return n, 'decoded'


def _loop_pad(positions: list[int], n_frames: int) -> list[int]:
    """Positions past the video's real end replaced, cyclically, by the clip's
    positions that exist (as the temporal transforms pad a short video); a clip
    lying wholly past the end uses the video's last frames."""
    present = [p for p in positions if p < n_frames]
    if len(present) == len(positions):
        return positions
    if not present:
        present = list(range(max(0, n_frames - len(positions)), n_frames))
    missing = iter(range(len(positions)))
    return [p if p < n_frames else present[next(missing) % len(present)] for p in positions]


class VideoClipLoader:
    """``loader(video_file, positions) -> uint8 (T, C, H, W)``: the ``--file_type
    video`` loader.

    For each stretch of wanted positions it seeks to the keyframe at or before
    the first one and decodes forward only up to the last one; far-apart
    stretches (the clips of a validation video) are reached by seeking forward
    when a keyframe lies between them, so a video is decoded at most once per
    call.  Open containers and their frame indexes are kept per process in a
    small LRU cache (inference windows hit the same video again).  Only wanted
    frames are converted to RGB, resized by FFmpeg to ``short_side`` if given.
    ``threads``: decoder threads; None = one inside DataLoader workers (the
    workers are the parallelism), one per core in the main process.
    """

    def __init__(self, short_side: int | None = None, threads: int | None = None,
                 max_open: int = 8):
        self.short_side = short_side
        self.threads = threads
        self.max_open = max_open
        self._open: OrderedDict = OrderedDict()
        self._pid = None
        self.stats: dict = {}  # 'decoded': frames decoded so far in this process
        self._convert = None

    def __getstate__(self):
        state = self.__dict__.copy()
        state['_open'] = OrderedDict()
        state['_pid'] = None
        state['_convert'] = None
        return state

    def close(self):
        for container, _ in self._open.values():
            container.close()
        self._open.clear()

    def _threads(self) -> int:
        if self.threads is not None:
            return self.threads
        return 1 if torch.utils.data.get_worker_info() is not None else 0

    def _get(self, path: str):
        if self._pid != os.getpid():  # fresh process: never use a parent's handles
            self._open, self._pid, self._convert = OrderedDict(), os.getpid(), _reformatter()
        entry = self._open.get(path)
        if entry is not None:
            self._open.move_to_end(path)
            return entry
        container = _open(path)
        stream = container.streams.video[0]
        _set_threads(stream, self._threads())
        entry = (container, _frame_index(container, stream))
        self._open[path] = entry
        if len(self._open) > self.max_open:
            self._open.popitem(last=False)[1][0].close()
        return entry

    def __call__(self, video_file, positions: Sequence[int]) -> torch.Tensor:
        path = os.fspath(video_file)
        container, index = self._get(path)
        if index.n_frames == 0:
            raise DataError(f'video file {path} has no frames: {_REENCODE}')
        positions = _loop_pad([int(p) for p in positions], index.n_frames)
        uniq = sorted(set(positions))
        try:
            arrays = _decode_positions(container, index, uniq, (self.short_side, self._convert),
                                       self.stats)
        except _av().FFmpegError as e:
            self._open.pop(path, (container,))[0].close()
            raise DataError(f'video file {path}: decoding failed ({e}): {_REENCODE}') from None
        if len(arrays) < len(uniq):  # the decoder gave fewer frames than the index lists
            if not arrays:
                raise DataError(f'video file {path}: no frame could be decoded: {_REENCODE}')
            got = sorted(arrays)
            uniq_map = dict(zip(uniq, _loop_pad(uniq, got[-1] + 1)))
            arrays = {p: arrays.get(q, arrays[got[-1]]) for p, q in uniq_map.items()}
        where = {p: i for i, p in enumerate(uniq)}
        clip = _stack([arrays[p] for p in uniq])
        if len(uniq) == len(positions) and uniq == positions:
            return clip
        return clip[torch.tensor([where[p] for p in positions])]


def _decode_positions(container, index: _FrameIndex, uniq: list[int], convert: tuple,
                      stats: dict, seek: bool = True) -> dict[int, np.ndarray]:
    """{position: (H, W, 3) array} of the sorted distinct ``uniq`` positions;
    ``convert``: (short_side, reformatter); counts the frames decoded in
    ``stats['decoded']``."""
    stream = container.streams.video[0]
    if index.pts is None:  # no timestamps: count frames from the start
        return _decode_by_count(container, stream, uniq, convert)
    wanted = {int(index.pts[p]): p for p in uniq}
    out: dict[int, np.ndarray] = {}
    frames, cursor = None, None  # decode generator, pts of the last decoded frame
    for target in sorted(wanted):
        if wanted[target] in out:
            continue
        k = bisect.bisect_right(index.keyframes, target) - 1
        keyframe = index.keyframes[k] if k >= 0 and seek else int(index.pts[0])
        if frames is None or (seek and (cursor is None or keyframe > cursor)):
            container.seek(keyframe, stream=stream, backward=True, any_frame=False)
            frames, cursor = container.decode(stream), None
        for frame in frames:
            cursor = frame.pts
            stats['decoded'] = stats.get('decoded', 0) + 1
            p = wanted.get(frame.pts)
            if p is not None:
                out[p] = _to_array(frame, *convert)
            if frame.pts is None or frame.pts >= target:
                break
        else:
            frames = None
    if len(out) < len(uniq) and seek:
        # a seek landed after a wanted frame (a container with a poor index):
        # decode from the start instead
        return _decode_positions(container, index, uniq, convert, stats, seek=False)
    return out


def _decode_by_count(container, stream, uniq: list[int], convert) -> dict[int, np.ndarray]:
    container.seek(0, stream=stream)
    want = set(uniq)
    out = {}
    for i, frame in enumerate(container.decode(stream)):
        if i in want:
            out[i] = _to_array(frame, *convert)
        if i >= uniq[-1]:
            break
    return out


def read_video(path, positions: Sequence[int] | None = None, short_side: int | None = None,
               threads: int = 0) -> torch.Tensor:
    """The frames of a video file as an upright uint8 tensor (T, C, H, W) (RGB):
    every frame (``positions=None``) or the 0-based ``positions`` (any order,
    repeats allowed; positions past the end are loop-padded).  ``short_side``
    resizes keeping the aspect ratio.  Raises DataError naming the file."""
    path = os.fspath(path)
    if positions is None:
        arrays = list(iter_frames(path, short_side=short_side, threads=threads,
                                  interpolation='BILINEAR'))
        if not arrays:
            raise DataError(f'video file {path} has no frames: {_REENCODE}')
        return _stack(arrays)
    loader = VideoClipLoader(short_side=short_side, threads=threads, max_open=1)
    try:
        return loader(path, positions)
    finally:
        loader.close()
