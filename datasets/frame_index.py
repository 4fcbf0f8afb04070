"""One video's frame index (:class:`FrameIndex`), from one demux pass and nothing
decoded: the timestamps of its frames in display order and its keyframes, what a
frame-exact seek needs (datasets/video.py).  A file cut short keeps only its whole
GOPs (datasets/cut_videos.py decides whether it is cut).  The stored indexes of a
data set's videos are datasets/video_index.py's FrameTable.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

from datasets.cut_videos import looks_cut
from datasets.video_open import EXACT_COUNT_FORMATS, pyav

__all__ = ['FrameIndex', 'scan_frame_index']


@dataclass(frozen=True)
class FrameIndex:
    """What a frame-exact seek in one video needs, from one demux pass (no decoding).

    ``pts``: presentation timestamps of the frames in display order (position p
    has ``pts[p]``), or None when the container gives packets without (unique)
    timestamps: then frames are counted from the start.  ``key_pos``: the
    positions of the keyframes; ``key_seek``: the timestamp to seek to for each
    (what the demuxer seeks by: FFmpeg's AVI demuxer indexes decoding timestamps,
    the others presentation timestamps).  ``truncated``: the file's data ends
    before its own structure says (a cut download, cut_videos.looks_cut); its frames
    are kept only up to the last keyframe that is whole, and the positions past
    ``n_frames`` are reported as missing instead of loop-padded.  ``expected``: the frame count
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
    av = pyav()
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


def scan_frame_index(container, stream) -> FrameIndex:
    """The FrameIndex of an open video (demuxes every packet; leaves the demuxer at the end)."""
    scan = _scan_packets(container, stream)
    pts, dts, keys, shown = scan.pts, scan.dts, scan.keys, scan.shown
    timed = None not in pts and len(set(pts)) == len(pts)
    shown_pts = np.sort(np.asarray(pts, np.int64)[np.asarray(shown, bool)]) if timed else None
    cut = True if scan.broken else looks_cut(container, stream, scan, shown_pts)
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
