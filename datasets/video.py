"""Reading frames straight from video files (datasets.formats.VIDEO_EXTENSIONS) with PyAV.

PyAV's wheel carries FFmpeg's libraries: no ``ffmpeg`` binary and no system
package is needed.  Frame *position* ``p`` is the ``p``-th frame (0-based) in
presentation order, the same numbering the preparation tools use when they
write ``image_{p+1:05d}.jpg``, so an annotation built from jpg folders also
works on the videos.

* :func:`read_video` -- a whole video, or given positions, as uint8 (T, C, H, W).
* :func:`iter_frames` -- every frame once, in order (optionally resampled to a
  frame rate and resized), for the preparation tools.
* :class:`VideoClipLoader` -- the ``--file_type video`` clip loader: seeks to
  the keyframe before a clip and decodes only up to its last frame; its ``read``
  gives a :class:`VideoClip`, whose frames FFmpeg's scaler converts to RGB at the
  scale the clip's planned crop needs (1/2, 1/4, 1/8: the JPEG path's rule).
* :func:`count_frames` -- frame count from the container header or by decoding.
* :func:`check_video_frames` -- what the loader would find wrong in a video (cut
  short, no frames), from the file's own index or one demux pass (--check_frames all).

Rotated (phone) videos come out upright: the display matrix is applied.
Of several video streams, every reader takes the one FFmpeg picks, never a cover
picture (datasets.video_stream.video_stream).
"""
from __future__ import annotations

import bisect
import itertools
import os
import weakref
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np
import torch

from datasets import container_ends as ends
from datasets.open_files import OpenFiles
from datasets.spatial_transforms import DCT_FACTORS
from datasets.video_stream import only_pictures, video_stream
from utils.errors import DataError

__all__ = ['FrameIndex', 'VideoClip', 'VideoClipLoader', 'check_video_frames', 'container_frames',
           'count_frames', 'frame_array', 'iter_frames', 'new_scaler', 'read_video', 'reduced_size',
           'scaled_size', 'scan_frame_index', 'upright_size']

# Containers whose header frame count is the number of coded frames (a sample table).
EXACT_COUNT_FORMATS = ('mov', 'mp4')
_REENCODE = 're-download or re-encode the video'  # true wherever it is read (DataError)


def _av():
    import av  # imported lazily: jpg/hdf5 runs do not need PyAV
    return av


def _open(path: str, store=None):
    """The container of the video file at ``path``, or with a ShardStore
    (datasets/storage.py) of its payload REL ``path`` (one ranged read)."""
    av = _av()
    if store is not None:
        return _open_member(av, path, store)
    try:
        container = av.open(path)
    except FileNotFoundError:
        raise DataError(f'video file {path} not found: check --video_path') from None
    except (av.FFmpegError, OSError, UnicodeDecodeError) as e:
        raise _open_error(path, path, e, '') from None
    return _with_video(container, path)


def _open_error(name: str, source, error, then: str) -> DataError:
    """Why the video ``name`` (bytes: ``source``, what it was opened from) cannot be
    opened: an MP4 without its index is cut short (container_ends.mp4_index_cut)."""
    if ends.mp4_index_cut(source):
        return DataError(f'video file {name} is cut short (a truncated download?): its index '
                         f'(the moov box, written last) is missing, no frame can be read: '
                         f'{_REENCODE}{then}')
    return DataError(f'video file {name} cannot be opened ({error}): {_REENCODE}{then}')


def _open_member(av, rel: str, store):
    payload = store.open_member(rel)
    try:
        container = av.open(payload)
    except (av.FFmpegError, OSError, UnicodeDecodeError) as e:
        error = _open_error(store.where(rel), payload, e, ', then util_scripts.make_shards again')
        payload.close()
        raise error from None
    return _with_video(container, store.where(rel))


def _source(container):
    """What a container reads (for container_ends): the file object it was opened
    from (a shard member, a cached payload), else its path."""
    return container.file.file if container.file is not None else container.name


def _with_video(container, name: str):
    """The container, if it has a video stream to read (video_stream: FFmpeg's pick,
    never a cover picture); else closed, and a DataError naming the file."""
    if video_stream(container) is None:
        pictures = only_pictures(container)
        container.close()
        if pictures:
            raise DataError(f'video file {name} holds no moving video, only a still picture '
                            f'(a cover): leave it out of the data set, or re-download the video')
        raise DataError(f'video file {name} has no video stream: {_REENCODE}')
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


# Frames are converted as the ffmpeg command line converts them, by libavfilter's
# scale filter with the flags fftools gives the scalers it inserts (bicubic, also
# the filter's default).  PyAV's reformatter defaults to bilinear and follows a
# frame's chroma location and interlacing, which the scale filter does not (its
# in_chroma_loc and interl=0): it was up to 156 levels from ffmpeg on 10-bit,
# odd-sized, top-left-sited or interlaced 4:2:0.  It is kept where it is exact.
_FFMPEG_FLAGS = 'BICUBIC'
# 8-bit 4:2:0 and 4:2:2 that swscale converts with its table converter at an even
# height: no chroma filter, so neither flags nor chroma location change a byte.
_TABLE_CONVERTED = ('yuv420p', 'yuvj420p', 'yuv422p', 'yuvj422p')


def _reformat_is_ffmpegs(frame) -> bool:
    """Whether the reformatter converts ``frame`` at its size to ffmpeg's bytes
    (tests/test_ffmpeg_conversion.py): progressive, and table-converted or without
    subsampled chroma.  Measured against a filter graph on H.264 frames, one thread:
    35 against 38 us a 320x240 frame, 479 against 572 at 1280x720."""
    fmt = frame.format
    if frame.interlaced_frame or fmt.has_palette:
        return False
    if fmt.name in _TABLE_CONVERTED:
        return frame.height % 2 == 0
    return fmt.chroma_width(2) == 2 and fmt.chroma_height(2) == 2


def _filter_graph(frame, chain: str, threads: int):
    """libavfilter's buffer -> ``chain`` -> buffersink for frames like ``frame``, its
    source told their colour matrix and range as fftools tells it."""
    import av
    graph = av.filter.Graph()
    graph.threads = threads
    last = graph.add('buffer', video_size=f'{frame.width}x{frame.height}',
                     pix_fmt=frame.format.name, time_base='1/1000', pixel_aspect='1/1',
                     colorspace=str(int(frame.colorspace)), range=str(int(frame.color_range)))
    for part in chain.split(','):
        name, _, args = part.partition('=')
        node = graph.add(name, args or None)
        last.link_to(node)
        last = node
    sink = graph.add('buffersink')
    last.link_to(sink)
    graph.configure()
    return graph


class _Scaler:
    """One per loader / video: FFmpeg's scaler context and filter graphs are kept
    between frames (``frame.to_ndarray(format=...)`` builds a new context per frame:
    ~10x slower).  Frames come out as ``ffmpeg -vf ...,format=rgb24`` gives them.
    ``threads``: the scaler's threads (0, PyAV's default: one per core)."""

    def __init__(self, threads: int = 0):
        from av.video.reformatter import VideoReformatter
        self.reformatter, self.threads = VideoReformatter(), threads
        self._graphs = {}  # (chain, the frames' format, size and colour) -> graph

    def rgb(self, frame) -> np.ndarray:
        """``frame`` in RGB at its size, as ``ffmpeg -vf format=rgb24``."""
        if _reformat_is_ffmpegs(frame):
            return self.reformatter.reformat(frame, format='rgb24', interpolation=_FFMPEG_FLAGS,
                                             threads=self.threads).to_ndarray()
        return self.filtered(frame, 'format=rgb24')

    def filtered(self, frame, chain: str) -> np.ndarray:
        """``frame`` through the filters ``chain`` (ending in format=rgb24)."""
        key = (chain, frame.format.name, frame.width, frame.height, int(frame.colorspace),
               int(frame.color_range))
        graph = self._graphs.get(key)
        if graph is None:
            if len(self._graphs) >= 8:  # frames that keep changing: keep the recent ones
                self._graphs.clear()
            graph = self._graphs[key] = _filter_graph(frame, chain, self.threads)
        graph.push(frame)
        return graph.pull().to_ndarray()


def _reformatter(threads: int = 0) -> _Scaler:
    return _Scaler(threads)


def _stored_size(width: int, height: int, turns: int, short_side: int | None) -> tuple[int, int]:
    """(width, height) to convert a stored ``width`` x ``height`` frame to, so that once
    turned upright its short side is ``short_side`` (None: unchanged)."""
    if turns % 2:  # the stored frame is sideways: scale it so that it is right once turned
        upright_w, upright_h = scaled_size(height, width, short_side)
        return upright_h, upright_w
    return scaled_size(width, height, short_side)


def _to_array(frame, short_side: int | None, reformatter,
              interpolation: str = 'BILINEAR', turns: int | None = None) -> np.ndarray:
    """Upright RGB (H, W, 3) uint8 of ``frame``, short side resized to ``short_side``
    (scaled in the conversion: ``ffmpeg -vf scale=W:H:flags=<interpolation>,format=rgb24``);
    ``turns``: its quarter turns if known (reading the display matrix costs ~10 us)."""
    if turns is None:
        turns = _quarter_turns(frame)
    w, h = frame.width, frame.height
    size = _stored_size(w, h, turns, short_side)
    if size == (w, h):
        array = reformatter.rgb(frame)
    else:
        array = reformatter.filtered(
            frame, f'scale={size[0]}:{size[1]}:flags={interpolation.lower()},format=rgb24')
    return np.rot90(array, turns) if turns else array


# Decoders' formats FFmpeg scales well in place (planar YUV, NV12, gray); others
# (paletted, packed RGB) are scaled in the conversion to RGB.
_SCALED_IN_PLACE = ('yuv', 'yuvj', 'nv', 'gray')


def _reduced_format(name: str, factor: int) -> str | None:
    """The pixel format to reduce a frame of format ``name`` in: its own (None) at
    1/2; at 1/4 and 1/8 4:4:4, so that the colour keeps the output's resolution
    (reduced in 4:2:0 it would be at half of it: 3.1 levels from full-size
    conversion + resize to 56 instead of 1.9, tests/test_video_scaling.py)."""
    if factor < 4 or name.startswith('gray'):
        return None
    return 'yuvj444p' if name.startswith('yuvj') else 'yuv444p'


def reduced_size(height: int, width: int, factor: int) -> tuple[int, int]:
    """(height, width) at 1/factor: each side rounded up, as libjpeg's DCT scaling
    (so that ClipPlan.box_at places a crop box alike for JPEG and video frames)."""
    return -(-height // factor), -(-width // factor)


def _reduced_array(frame, factor: int, scaler: _Scaler, turns: int) -> np.ndarray:
    """Upright RGB (H, W, 3) uint8 of ``frame`` at 1/factor of its size (sides rounded
    up): scaled in YUV by pixel averaging (see _reduced_format), then converted to
    RGB as full-size frames are: ``ffmpeg -vf scale=W:H:flags=area,format=F,format=rgb24``.
    Scaling straight to rgb24 takes swscale's generic path: measured on 320x240 H.264
    frames at 1/2, about 3x the time of both steps here (197 against 68 us a frame),
    and its colours differ from the full-size conversion's by about a level."""
    height, width = reduced_size(frame.height, frame.width, factor)
    name = frame.format.name
    chain = f'scale={width}:{height}:flags=area'
    if name.startswith(_SCALED_IN_PLACE):
        chain += f',format={_reduced_format(name, factor) or name}'
    array = scaler.filtered(frame, chain + ',format=rgb24')
    return np.rot90(array, turns) if turns else array


def upright_size(frame, short_side: int | None = None) -> tuple[int, int]:
    """(height, width) of a decoded frame once turned upright (display matrix),
    its short side made ``short_side`` if given: what a crop is planned from."""
    turns = _quarter_turns(frame)
    w, h = _stored_size(frame.width, frame.height, turns, short_side)
    return (w, h) if turns % 2 else (h, w)


def new_scaler(threads: int = 0) -> _Scaler:
    """A scaler for :func:`frame_array` (keep one per reader: its contexts are reused)."""
    return _Scaler(threads)


def frame_array(frame, factor: int, scaler: _Scaler, short_side: int | None = None,
                turns: int | None = None) -> np.ndarray:
    """Upright RGB (H, W, 3) uint8 of a decoded frame at 1/factor of its size
    (factor 1: at ``short_side`` if given): the one conversion of the frames of
    video files (VideoClip.decode) and of live streams (datasets/live.py), so
    that both give a model the same input."""
    if turns is None:
        turns = _quarter_turns(frame)
    if factor == 1:
        return _to_array(frame, short_side, scaler, turns=turns)
    return _reduced_array(frame, factor, scaler, turns)


def _stack(arrays: list[np.ndarray]) -> torch.Tensor:
    """(H, W, 3) arrays -> uint8 (T, C, H, W) in channels-last memory (as the jpg path)."""
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2)


def _set_threads(stream, threads: int) -> None:
    """``threads`` decoder threads (0: FFmpeg picks one per core).  1 is set too:
    left alone, PyAV's default (0) starts a pool of threads per open container
    (a DataLoader worker had 19 more threads after clips of 12 videos)."""
    ctx = stream.codec_context
    ctx.thread_count = threads
    if threads != 1:
        ctx.thread_type = 'AUTO'


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
        stream = video_stream(container)
        _set_threads(stream, threads)
        frames = container.decode(stream)
        convert = _reformatter(threads)
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


# ----------------------------------------------------------------------------- frame index

@dataclass(frozen=True)
class FrameIndex:
    """What a frame-exact seek in one video needs, from one demux pass (no decoding).

    ``pts``: presentation timestamps of the frames in display order (position p
    has ``pts[p]``), or None when the container gives packets without (unique)
    timestamps: then frames are counted from the start.  ``key_pos``: the
    positions of the keyframes; ``key_seek``: the timestamp to seek to for each
    (what the demuxer seeks by: FFmpeg's AVI demuxer indexes decoding timestamps,
    the others presentation timestamps).  ``truncated``: the file's data ends
    before its own structure says (a cut download, _looks_cut); its frames are kept
    only up to the last keyframe that is whole, and the positions past ``n_frames``
    are reported as missing instead of loop-padded.  ``expected``: the frame count
    of the file's sample table (MP4/MOV), if any.  ``open_end``: whether the file was
    cut cannot be told (a live writer's Matroska/WebM that states no size or duration
    and ends between two elements): every frame is kept, and positions past
    ``n_frames`` are reported instead of loop-padded (the end may be a cut's).
    ``key_pts``: the keyframes' own timestamps (sorted, as ``key_pos``)."""
    pts: np.ndarray | None
    key_pos: np.ndarray
    key_pts: np.ndarray
    key_seek: np.ndarray
    n_frames: int
    truncated: bool = False
    expected: int | None = None
    open_end: bool = False
    # for lookups without numpy calls per frame: the keyframes as lists, and
    # (first pts, step) when the timestamps lie on a grid (a constant frame rate)
    _keys: list = field(init=False, repr=False, compare=False)
    _key_pts: list = field(init=False, repr=False, compare=False)
    _grid: tuple | None = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        set_ = object.__setattr__
        set_(self, '_keys', np.asarray(self.key_pos).tolist())
        set_(self, '_key_pts', np.asarray(self.key_pts).tolist())
        grid = None
        if self.pts is not None and len(self.pts):
            steps = np.diff(self.pts)
            step = int(steps[0]) if len(steps) else 1
            if step > 0 and (steps == step).all():
                grid = (int(self.pts[0]), step)
        set_(self, '_grid', grid)

    def position(self, pts) -> int:
        """Position of the frame with timestamp ``pts``; -1 if no frame has it."""
        if pts is None or self.pts is None:
            return -1
        if self._grid is not None:
            p, off = divmod(pts - self._grid[0], self._grid[1])
            return p if off == 0 and 0 <= p < self.n_frames else -1
        p = int(np.searchsorted(self.pts, pts))
        return p if p < len(self.pts) and self.pts[p] == pts else -1

    def keyframe_at(self, pts) -> int:
        """Index of the keyframe whose timestamp is ``pts``; -1 if none is."""
        if pts is None:
            return -1
        k = bisect.bisect_left(self._key_pts, pts)
        return k if k < len(self._key_pts) and self._key_pts[k] == pts else -1

    def keyframe_before(self, position: int) -> int:
        """Index (in key_pos) of the last keyframe at or before ``position``; -1 if none."""
        return bisect.bisect_right(self._keys, position) - 1


@dataclass
class _Scan:
    """The video packets of one demux pass, in decode order, up to a break: their
    timestamps, keyframe and shown flags; ``empty``: packets without data (not in
    those lists; a sample table counts them); ``slots``: where the last packet ends in
    time base units (AVI: chunks, the empty ones of dropped frames included, whose
    timestamps the packets skip); ``broken``: the data broke off (a corrupt, cut
    packet or a read error)."""
    pts: list = field(default_factory=list)
    dts: list = field(default_factory=list)
    keys: list = field(default_factory=list)
    shown: list = field(default_factory=list)
    empty: int = 0
    slots: int = 0
    broken: bool = False


def _scan_packets(container, stream) -> _Scan:
    av = _av()
    scan = _Scan()
    pts, dts, keys, shown = scan.pts, scan.dts, scan.keys, scan.shown
    slots = 0
    try:
        for packet in container.demux(stream):
            if packet.is_corrupt:
                scan.broken = True
                break
            if packet.size == 0:  # an empty sample, or the flush packet at the end
                scan.empty += packet.dts is not None
                continue
            pts.append(packet.pts)
            dts.append(packet.dts)
            keys.append(packet.is_keyframe)
            shown.append(not packet.is_discard)
            if packet.dts is not None:
                slots = max(slots, packet.dts + max(packet.duration or 0, 1))
    except av.FFmpegError:
        scan.broken = True
    scan.slots = slots
    return scan


def _header_duration(container) -> float | None:
    """The duration in seconds a FLV or ASF header states, None if it states none
    (other formats' durations are estimated from the file's end or bit rate, which
    says nothing about a cut)."""
    if set(container.format.name.split(',')) & {'flv', 'asf'} and container.duration:
        return container.duration / 1e6
    return None


def _looks_cut(container, stream, scan: _Scan, sorted_pts: np.ndarray | None) -> bool | None:
    """Whether the file's data ends before its own structure says its video does,
    decided by what is there (a variable frame rate's gaps and a last frame shown long
    change no count), read from what the container reads (a path, a shard member):
    AVI, fewer chunk slots than the header counts (the empty chunks FFmpeg writes for
    dropped frames included); MP4/MOV, fewer packets than the sample table lists;
    Matroska/WebM, a file ending inside a Cluster (container_ends.matroska_cut; None
    when a live writer's file, stating no size, ends between two of its elements and
    its Info states no duration: whether it was cut cannot be told); ASF, a file
    shorter than its Data Object; FLV, shorter than its metadata's file size (without
    one: a shorter duration than the header's); Ogg, no whole last page."""
    formats = set(container.format.name.split(','))
    source = _source(container)
    if 'avi' in formats:
        return stream.frames > 0 and scan.slots < stream.frames
    if formats & {'matroska', 'webm'}:
        cut = ends.matroska_cut(source)
        if cut is not None:
            return cut
        duration = ends.matroska_duration(source)
        return None if duration is None else _short_of(duration, stream, sorted_pts)
    if stream.frames > 0:
        return len(scan.pts) + scan.empty < stream.frames
    if 'ogg' in formats:
        return ends.ogg_unfinished(source)
    if formats & {'asf', 'flv'}:
        head, file_size = ends.read_head(source)
        stated = ends.asf_data_end(head) if 'asf' in formats else ends.flv_file_size(head)
        if stated is not None:
            return file_size < stated
    duration = _header_duration(container)
    return duration is not None and _short_of(duration, stream, sorted_pts)


def _short_of(duration: float, stream, sorted_pts: np.ndarray | None) -> bool:
    """Whether the video's frames end well before the ``duration`` its header states."""
    if sorted_pts is None or len(sorted_pts) < 2 or stream.time_base is None:
        return False
    tb = float(stream.time_base)
    step = float(np.median(np.diff(sorted_pts))) * tb
    end = float(sorted_pts[-1]) * tb + step - (float(stream.start_time or 0) * tb)
    # audio may outlast the video a little in a header's duration
    return end < duration - 1.5 * step - 0.02 * duration


def _whole_by_its_index(container, stream) -> bool:
    """Whether the file's own index shows, without a demux pass, that the scan would
    find it whole (the common case, at the cost of an open): MP4/MOV, every sample of
    the table ends within the file; AVI, every idx1 entry does and they reach the
    header's chunk count; Matroska/WebM, container_ends.matroska_cut says not cut.
    False: only the scan tells.  The file is what the container reads (a path, a
    shard member)."""
    formats = set(container.format.name.split(','))
    if formats & {'matroska', 'webm'}:
        return ends.matroska_cut(_source(container)) is False
    table = bool(formats & set(EXACT_COUNT_FORMATS))
    if not (table or 'avi' in formats) or stream.frames <= 0:
        return False
    entries = stream.index_entries
    end = slots = 0
    for entry in entries:
        end = max(end, entry.pos + entry.size)
        slots = max(slots, entry.timestamp + 1)
    inside = 0 < end <= (ends.source_size(_source(container)) or 0)
    return inside and (len(entries) == stream.frames if table else slots >= stream.frames)


def scan_frame_index(container, stream) -> FrameIndex:
    """The FrameIndex of an open video (demuxes every packet; leaves the demuxer at the end)."""
    scan = _scan_packets(container, stream)
    pts, dts, keys, shown = scan.pts, scan.dts, scan.keys, scan.shown
    timed = None not in pts and len(set(pts)) == len(pts)
    shown_pts = np.sort(np.asarray(pts, np.int64)[np.asarray(shown, bool)]) if timed else None
    cut = True if scan.broken else _looks_cut(container, stream, scan, shown_pts)
    truncated, open_end = cut is True, cut is None
    if truncated:
        # Whole GOPs only: frames before the last keyframe (in decode order) are all
        # there; of the last GOP some may be missing, and which cannot be told.
        last_key = max((i for i, k in enumerate(keys) if k), default=0)
        pts, dts, keys, shown = pts[:last_key], dts[:last_key], keys[:last_key], shown[:last_key]
    # the frames the header promises: only a sample table counts frames (an AVI header
    # counts chunks, the empty ones of dropped frames too)
    exact = set(container.format.name.split(',')) & set(EXACT_COUNT_FORMATS)
    expected = int(stream.frames) if stream.frames > 0 and exact else None
    if not timed:
        none = np.zeros(0, np.int64)
        return FrameIndex(None, none.astype(np.int32), none, none, sum(shown), truncated, expected,
                          open_end)
    return _timed_index(pts, dts, keys, shown, container.format.name == 'avi', truncated,
                        expected, open_end)


def _timed_index(pts, dts, keys, shown, by_dts: bool, truncated: bool,
                 expected: int | None, open_end: bool = False) -> FrameIndex:
    """Positions are the ranks of the shown packets' timestamps; packets an edit list
    discards (an MP4 cut by stream copy) are decoded but not shown, so they have none.
    A keyframe's position is that of the first shown frame at or after it."""
    pts_array = np.asarray(pts, np.int64)
    frame_pts = np.sort(pts_array[np.asarray(shown, bool)])
    key_at = np.flatnonzero(np.asarray(keys, bool))
    key_at = key_at[np.argsort(pts_array[key_at], kind='stable')]
    seek = [dts[i] if by_dts and dts[i] is not None else pts[i] for i in key_at]
    return FrameIndex(frame_pts, np.searchsorted(frame_pts, pts_array[key_at]).astype(np.int32),
                      pts_array[key_at], np.asarray(seek, np.int64).reshape(-1), len(frame_pts),
                      truncated, expected, open_end)


def container_frames(path) -> int | None:
    """The frame count the container's header gives (None if it gives none);
    opens the file, decodes nothing.  Raises DataError if it is no video."""
    with _open(os.fspath(path)) as container:
        n = video_stream(container).frames
    return int(n) if n > 0 else None


def count_frames(path, exact: bool = False) -> tuple[int, str]:
    """(frame count, how it was measured: 'container' or 'decoded').

    MP4/MOV sample tables list the coded frames exactly (those an edit list hides
    are not counted: they are never shown); AVI indexes may list dropped (empty)
    frames and WebM/MKV give no count, so those (and ``exact=True``) are counted
    by decoding every frame."""
    path = os.fspath(path)
    av = _av()
    with _open(path) as container:
        stream = video_stream(container)
        formats = set(container.format.name.split(','))
        if not exact and stream.frames > 0 and formats & set(EXACT_COUNT_FORMATS):
            entries = stream.index_entries
            if len(entries) == stream.frames:
                return sum(not e.is_discard for e in entries), 'container'
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


# ----------------------------------------------------------------------------- clip loading

class _OpenVideo:
    """An open container, its video stream and FrameIndex (scanned on open unless given)."""

    def __init__(self, path: str, threads: int, index: FrameIndex | None = None, store=None):
        self.path, self.threads, self.store = path, threads, store
        self.reader = None  # a weak reference to the VideoClip decoding from it (loader.read)
        self._open_container()
        if index is None:
            index = scan_frame_index(self.container, self.stream)
        self.index = index

    def _open_container(self):
        self.container = _open(self.path, self.store)
        self.stream = video_stream(self.container)
        _set_threads(self.stream, self.threads)

    def reopen(self):
        """Back to the true start of the file (a seek there is not always possible)."""
        self.container.close()
        self._open_container()

    def close(self):
        self.container.close()


def _first_keyframe_packet(packets):
    for packet in packets:
        if packet.size and packet.is_keyframe and not packet.is_corrupt:
            return packet
    return None


def _land(video: _OpenVideo, k: int, attempts: int = 3):
    """Seek so that decoding starts at keyframe ``k`` or before it: -> (the keyframe
    packet decoding starts from or None, the demuxer's packet iterator).  A seek that
    lands after keyframe k (a demuxer that seeks by other timestamps than the index
    holds) steps back one keyframe, and so does one whose first packet is not a
    keyframe of the index (MPEG program streams: after a seek the parser gives a
    picture the timestamp of the one before); at last the file is reopened at its
    true start."""
    index, av = video.index, _av()
    while k >= 0 and attempts > 0:
        attempts -= 1
        try:
            video.container.seek(int(index.key_seek[k]), stream=video.stream, backward=True)
            packets = video.container.demux(video.stream)
            landed = _first_keyframe_packet(packets)
        except av.FFmpegError:
            landed = None
        if landed is not None and 0 <= index.keyframe_at(landed.pts) <= k:
            return landed, packets
        k -= 1
    video.reopen()
    packets = video.container.demux(video.stream)
    return _first_keyframe_packet(packets), packets


# Decoders that skip a non-reference picture whole when told (skip_frame NONREF: no
# other picture is predicted from it, so the rest decode to the same bytes) and whose
# packets each hold one picture; H.264/HEVC B-pyramids leave about half the frames
# of a GOP unreferenced.  (MPEG-4 part 2 is left out: packed B-frames, DivX's AVIs.)
_SKIPS_NONREF = ('h264', 'hevc')


def _trusted_frames(video: _OpenVideo, k: int,
                    wanted: set | None = None) -> Iterator[tuple[int, object]]:
    """(position, frame) of the frames decoded from keyframe ``k`` (or one before it),
    in display order.  Frames shown before the keyframe decoding started from (the
    leading pictures of an open GOP: their references were not decoded), frames of
    corrupt packets and frames whose timestamp the index does not hold are left out.
    ``wanted``: the positions asked for; a non-reference picture at any other
    position is not decoded where the codec allows it (_SKIPS_NONREF): the frames
    before a clip in a long GOP cost about a fifth less to reach."""
    landed, packets = _land(video, k)
    if landed is None:
        return
    start, position = landed.pts, video.index.position
    ctx = video.stream.codec_context
    skipping = wanted is not None and ctx.name in _SKIPS_NONREF
    skip = False
    try:
        for packet in itertools.chain([landed], packets):
            if packet.is_corrupt:  # cut off by the file's end: not decoded (its data is partial)
                continue
            # a packet without a timestamp (a second field) keeps its frame's setting
            if skipping and packet.pts is not None and skip != (position(packet.pts) not in wanted):
                skip = not skip
                ctx.skip_frame = 'NONREF' if skip else 'DEFAULT'
            for frame in packet.decode():
                pts = frame.pts
                if pts is None or pts < start or frame.is_corrupt:
                    continue
                p = position(pts)
                if p >= 0:
                    yield p, frame
    finally:
        if skip:  # the context decodes every frame for the next reader
            ctx.skip_frame = 'DEFAULT'


def _counted_frames(video: _OpenVideo, k: int) -> Iterator[tuple[int, object]]:
    """Without timestamps: every frame from the true start, numbered in output order."""
    video.reopen()
    for p, frame in enumerate(video.container.decode(video.stream)):
        if not frame.is_corrupt:
            yield p, frame


# A forward seek drops the frames the decoder holds back for reordering (2-4) and
# costs a demuxer seek: frames up to this many are skipped by decoding them instead.
SKIP_BY_DECODING = 4


def _worth_seeking(index: FrameIndex, k: int, p: int, target: int) -> bool:
    """Whether to seek forward from position ``p`` (decoding started at keyframe ``k``)
    to reach ``target``: a later keyframe lies at or before it and far enough ahead."""
    k_target = index.keyframe_before(target)
    return k_target > max(k, index.keyframe_before(p)) and \
        index._keys[k_target] - p > SKIP_BY_DECODING + 1


def _wanted_frames(video: _OpenVideo, uniq: list[int], stats: dict) -> Iterator[tuple[int, object]]:
    """(position, frame) of the sorted distinct ``uniq`` positions that decode, in
    order (a position left out did not).  Each stretch of positions is decoded from
    the keyframe before it; a later stretch past another keyframe is reached by
    seeking forward (when that skips more than SKIP_BY_DECODING frames).  Counts
    the frames decoded in ``stats['decoded']``."""
    index = video.index
    timed = index.pts is not None
    wanted = set(uniq)
    i, n, decoded = 0, len(uniq), 0
    try:
        while i < n:
            k = index.keyframe_before(uniq[i])
            frames = _trusted_frames(video, k, wanted) if timed else _counted_frames(video, k)
            for p, frame in frames:
                decoded += 1
                while i < n and uniq[i] < p:  # not given by the decoder: missing
                    i += 1
                if i < n and uniq[i] == p:
                    i += 1
                    yield p, frame
                if i == n or (index.pts is not None and _worth_seeking(index, k, p, uniq[i])):
                    break
            else:
                break  # the end of the stream: the rest are missing
    finally:
        stats['decoded'] = stats.get('decoded', 0) + decoded


def _missing_error(path: str, index: FrameIndex, missing: list[int]) -> DataError:
    shown = ', '.join(map(str, missing[:8])) + (f' and {len(missing) - 8} more'
                                                 if len(missing) > 8 else '')
    if index.truncated:
        total = f' of {index.expected}' if index.expected else ''
        return DataError(f'video file {path} is cut short (a truncated download?): it holds '
                         f'{index.n_frames} whole frames{total}; frames {shown} (0-based) '
                         f'are missing: {_REENCODE}')
    if index.open_end:
        return DataError(f'video file {path} may be cut short: it states no length (a live '
                         f'recording\'s Matroska/WebM) and ends after {index.n_frames} frames; frames '
                         f'{shown} (0-based) are past that end and are not loop-padded: remux or '
                         f're-encode the video (its length is then stated), or annotate only '
                         f'{index.n_frames} frames')
    return DataError(f'video file {path}: frames {shown} (0-based) of {index.n_frames} could '
                     f'not be decoded: {_REENCODE}')


def _index_error(path: str, index: FrameIndex, positions) -> DataError | None:
    """The error reading ``positions`` raises before any decoding (a video without
    frames; positions past the end of one cut short, or of one whose end cannot be told
    from a cut, which are not loop-padded), None if none."""
    if index.n_frames == 0:
        if index.truncated or index.open_end:
            return _missing_error(path, index, sorted(set(positions)))
        return DataError(f'video file {path} has no frames: {_REENCODE}')
    if index.truncated or index.open_end:
        past = sorted({p for p in positions if p >= index.n_frames})
        if past:
            return _missing_error(path, index, past)
    return None


def check_video_frames(path, needed: int, store=None) -> str | None:
    """What the clip loader would find wrong reading frames 0 to ``needed`` - 1 of a
    video, by the loader's own rule: the file cannot be opened, has no frames, or is
    cut short before ``needed`` (past the end of a whole file clips are loop-padded:
    not wrong).  A file whose own index shows it whole costs an open; any other is
    indexed as the loader indexes it (one demux pass, nothing decoded).  None if
    nothing is wrong."""
    path = os.fspath(path)
    try:
        with _open(path, store) as container:
            stream = video_stream(container)
            if _whole_by_its_index(container, stream):
                return None  # a whole file: clips past its end are loop-padded
            index = scan_frame_index(container, stream)
    except DataError as e:
        return str(e)
    error = _index_error(path, index, range(needed))
    return None if error is None else str(error)


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
    video`` loader.  Every frame it returns is the frame asked for (position p is
    the p-th frame in presentation order), or it raises a DataError naming the
    video (tests/test_video_exact.py: a corpus of every container and codec).

    For each stretch of wanted positions it seeks to the keyframe at or before
    the first one, checks where the seek landed (stepping back when it landed
    after it) and decodes forward only up to the last one; far-apart stretches
    (the clips of a validation video) are reached by seeking forward when a
    keyframe lies between them, so a video is decoded at most once per call.
    Frames are matched to positions by their timestamps.  Positions past the
    video's end are loop-padded as a short video's are, except in a video cut
    short (then: DataError).  Only wanted frames are converted to RGB, resized by
    FFmpeg to ``short_side`` if given.  ``read`` splits a call in two, as the JPEG
    loaders' do: the frames are sought and the first decoded (its size is the
    clip's ``frame_size``), then ``decode(factor)`` converts them at 1/factor of
    that size, for a crop planned from it (:class:`VideoClip`).

    The frame index comes from ``frame_table`` (a stored
    :class:`datasets.video_index.FrameTable`: an open costs no demux pass) or, for
    a video it does not hold or that changed since, from demuxing the file on
    open.  Open containers are kept per process in a small LRU cache (inference
    windows hit the same video again).  ``threads``: decoder (and scaler) threads;
    None = one inside DataLoader workers (the workers are the parallelism),
    FFmpeg's choice (one per core) in the main process.
    """

    def __init__(self, short_side: int | None = None, threads: int | None = None,
                 max_open: int = 8, frame_table=None, store=None):
        self.short_side = short_side
        self.threads = threads
        self.frame_table = frame_table
        self.store = store  # a ShardStore: paths are REL keys of its shards (datasets/storage.py)
        self._open = OpenFiles(max_open)  # also this process's scaler (its local)
        self.stats: dict = {}  # 'decoded': frames decoded so far in this process

    def close(self):
        self._open.close()

    def _threads(self) -> int:
        if self.threads is not None:
            return self.threads
        return 1 if torch.utils.data.get_worker_info() is not None else 0

    def _open_video(self, path: str) -> _OpenVideo:
        index, key = self.frame_table.get(path) if self.frame_table is not None else (None, None)
        video = _OpenVideo(path, self._threads(), index, self.store)
        if index is None and key is not None:
            self.frame_table.add(key, video.index)
        opened = 'scanned' if index is None else 'stored'
        self.stats[opened] = self.stats.get(opened, 0) + 1
        return video

    def _get(self, path: str) -> _OpenVideo:
        return self._open.get(path, self._open_video)

    @property
    def _convert(self):
        """This process's scaler (FFmpeg's, with the loader's thread count)."""
        return self._open.local(lambda: _reformatter(self._threads()))

    def read(self, video_file, positions: Sequence[int]) -> VideoClip:
        """The clip's frames sought but not converted (a :class:`VideoClip`): the data
        set plans the crop from its ``frame_size``, then ``decode(factor)``."""
        path = os.fspath(video_file)
        video = self._get(path)
        index = video.index
        positions = [int(p) for p in positions]
        error = _index_error(path, index, positions)
        if error is not None:
            raise error
        return VideoClip(self, path, video, _loop_pad(positions, index.n_frames))

    def __call__(self, video_file, positions: Sequence[int]) -> torch.Tensor:
        return self.read(video_file, positions).decode()

    def _failed(self, path: str, video: _OpenVideo, error) -> DataError:
        self._open.discard(path)  # its demuxer and decoder state are unknown now
        return DataError(f'video file {path}: decoding failed ({error}): {_REENCODE}')


class VideoClip:
    """A clip of an open video, its frames decoded as they are converted.

    ``frame_size``: the upright (height, width) of the clip's frames (the first
    wanted frame's, decoded to read it; the loader's ``short_side`` applied), which
    the data set plans the crop from.  ``decode(factor)`` -> uint8 (T, C, H, W)
    (channels-last memory) in the requested order: every frame converted to RGB at
    1/factor of that size (``factors``: the reductions of the JPEG path,
    datasets/spatial_transforms.DCT_FACTORS; sides rounded up as libjpeg's) in
    FFmpeg's scaler, so that the crop and resize run on the reduced frames.  A clip
    decodes from its video's demuxer: decode it before the loader reads the next."""

    def __init__(self, loader: VideoClipLoader, path: str, video: _OpenVideo,
                 positions: list[int]):
        self.loader, self.path, self.video, self.positions = loader, path, video, positions
        self.factors = DCT_FACTORS if loader.short_side is None else ()  # short_side: final
        self._uniq = sorted(set(positions))
        self._frames = _wanted_frames(video, self._uniq, loader.stats)
        self._first = None
        # the demuxer is this clip's until the video's next read; held weakly, so a
        # clip is freed, with its decoder's frames, as soon as its caller drops it (a
        # cycle would keep each clip's frames until the collector ran, and the next
        # clips would allocate afresh what freeing would have reused)
        video.reader = weakref.ref(self)

    def _next(self):
        if self.video.reader() is not self:
            raise RuntimeError(f'a clip of {self.path} decoded after another read of the same '
                               f'video: decode each clip before reading the next')
        try:
            return next(self._frames, None)
        except _av().FFmpegError as e:
            raise self.loader._failed(self.path, self.video, e) from None

    def _peek(self):
        if self._first is None:
            self._first = self._next()
            if self._first is None:
                raise _missing_error(self.path, self.video.index, self._uniq)
        return self._first

    @property
    def frame_size(self) -> tuple[int, int]:
        return upright_size(self._peek()[1], self.loader.short_side)

    def decode(self, factor: int = 1) -> torch.Tensor:
        if factor != 1 and factor not in self.factors:
            raise ValueError(f'this clip converts at 1/1 or 1/{self.factors} of its size, '
                             f'not 1/{factor}')
        first = self._peek()
        turns, scaler = _quarter_turns(first[1]), self.loader._convert
        slots = {p: i for i, p in enumerate(self._uniq)}
        clip, filled, item = None, [], first
        while item is not None:
            p, frame = item
            array = frame_array(frame, factor, scaler, self.loader.short_side, turns)
            if clip is None:
                clip = np.empty((len(self._uniq), *array.shape), dtype=np.uint8)
            elif array.shape != clip.shape[1:]:
                raise DataError(f'video file {self.path}: its frames change size within the '
                                f'clip ({"x".join(map(str, clip.shape[1:3]))} and '
                                f'{"x".join(map(str, array.shape[:2]))}): {_REENCODE} at one size')
            # copied into the clip while the converted frame is still in the cache, and
            # freed: not a list of converted frames kept for one stack at the end
            clip[slots[p]] = array
            filled.append(p)
            item = self._next()
        if len(filled) < len(self._uniq):
            done = set(filled)
            raise _missing_error(self.path, self.video.index,
                                 [p for p in self._uniq if p not in done])
        out = torch.from_numpy(clip).permute(0, 3, 1, 2)
        if self._uniq == self.positions:
            return out
        return out[torch.tensor([slots[p] for p in self.positions])]


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
