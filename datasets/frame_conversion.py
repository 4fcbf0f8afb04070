"""The RGB conversion of decoded video frames: every reader of video files and
live streams (datasets/video.py, whole_videos.py, live.py) turns a PyAV frame
into an upright RGB (H, W, 3) uint8 array here, equal to what ``ffmpeg -vf
[scale=...,]format=rgb24`` gives (tests/test_ffmpeg_conversion.py).

* :func:`frame_array` -- a frame at 1/factor of its size (the JPEG path's DCT
  reductions) or at a short side, with a :func:`new_scaler` kept per reader.
* :func:`to_array` -- a frame at a short side, with a chosen interpolation.
* :func:`scaled_size`, :func:`reduced_size`, :func:`upright_size` -- the sizes
  those give, for planning a crop before converting.

Rotated (phone) videos come out upright: the display matrix is applied
(:func:`quarter_turns`).
"""
from __future__ import annotations

import numpy as np

__all__ = ['frame_array', 'new_scaler', 'quarter_turns', 'reduced_size', 'scaled_size', 'to_array', 'upright_size']


def scaled_size(width: int, height: int, short_side: int | None) -> tuple[int, int]:
    """(width, height) with the short side made ``short_side`` and the aspect ratio
    kept (long side truncated as torchvision's resize does, so that an eval
    transform finds the frames at its size); also enlarges.  None or <= 0: unchanged."""
    if not short_side or short_side <= 0:
        return width, height
    if width <= height:
        return short_side, max(1, int(height * short_side / width))
    return max(1, int(width * short_side / height)), short_side


def quarter_turns(frame) -> int:
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


def _stored_size(width: int, height: int, turns: int, short_side: int | None) -> tuple[int, int]:
    """(width, height) to convert a stored ``width`` x ``height`` frame to, so that once
    turned upright its short side is ``short_side`` (None: unchanged)."""
    if turns % 2:  # the stored frame is sideways: scale it so that it is right once turned
        upright_w, upright_h = scaled_size(height, width, short_side)
        return upright_h, upright_w
    return scaled_size(width, height, short_side)


def to_array(frame, short_side: int | None, reformatter,
              interpolation: str = 'BILINEAR', turns: int | None = None) -> np.ndarray:
    """Upright RGB (H, W, 3) uint8 of ``frame``, short side resized to ``short_side``
    (scaled in the conversion: ``ffmpeg -vf scale=W:H:flags=<interpolation>,format=rgb24``);
    ``turns``: its quarter turns if known (reading the display matrix costs ~10 us)."""
    if turns is None:
        turns = quarter_turns(frame)
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
    turns = quarter_turns(frame)
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
        turns = quarter_turns(frame)
    if factor == 1:
        return to_array(frame, short_side, scaler, turns=turns)
    return _reduced_array(frame, factor, scaler, turns)
