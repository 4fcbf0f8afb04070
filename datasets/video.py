"""Reading clips straight from video files (datasets.formats.VIDEO_EXTENSIONS) with PyAV.

PyAV's wheel carries FFmpeg's libraries: no ``ffmpeg`` binary and no system
package is needed.  Frame *position* ``p`` is the ``p``-th frame (0-based) in
presentation order, the same numbering the preparation tools use when they
write ``image_{p+1:05d}.jpg``, so an annotation built from jpg folders also
works on the videos.

* :func:`read_video` -- a whole video, or given positions, as uint8 (T, C, H, W).
* :class:`VideoClipLoader` -- the ``--file_type video`` clip loader: seeks to
  the keyframe before a clip and decodes only up to its last frame; its ``read``
  gives a :class:`VideoClip`, whose frames FFmpeg's scaler converts to RGB at the
  scale the clip's planned crop needs (1/2, 1/4, 1/8: the JPEG path's rule).

The rest of the video readers: opening a file (datasets/video_open.py), the RGB
conversion (frame_conversion.py), a video's frame index (frame_index.py), the
rules for a file cut short (cut_videos.py, on container_ends.py's facts), and
reading a video whole: every frame, its count, its check (whole_videos.py).
Of several video streams, every reader takes the one FFmpeg picks, never a cover
picture (datasets.video_stream.video_stream).
"""
from __future__ import annotations

import itertools
import os
import weakref
from typing import Iterator, Sequence

import numpy as np
import torch

from datasets.cut_videos import index_error, missing_error
from datasets.frame_conversion import frame_array, new_scaler, quarter_turns, upright_size
from datasets.frame_index import FrameIndex, scan_frame_index
from datasets.open_files import OpenFiles
from datasets.spatial_transforms import DCT_FACTORS
from datasets.video_open import REENCODE, open_video, pyav, set_threads
from datasets.video_stream import video_stream
from datasets.whole_videos import iter_frames
from utils.errors import DataError

__all__ = ['VideoClip', 'VideoClipLoader', 'read_video']


def _stack(arrays: list[np.ndarray]) -> torch.Tensor:
    """(H, W, 3) arrays -> uint8 (T, C, H, W) in channels-last memory (as the jpg path)."""
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2)


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
        self.container = open_video(self.path, self.store)
        self.stream = video_stream(self.container)
        set_threads(self.stream, self.threads)

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
    index, av = video.index, pyav()
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
        return self._open.local(lambda: new_scaler(self._threads()))

    def read(self, video_file, positions: Sequence[int]) -> VideoClip:
        """The clip's frames sought but not converted (a :class:`VideoClip`): the data
        set plans the crop from its ``frame_size``, then ``decode(factor)``."""
        path = os.fspath(video_file)
        video = self._get(path)
        index = video.index
        positions = [int(p) for p in positions]
        error = index_error(path, index, positions)
        if error is not None:
            raise error
        return VideoClip(self, path, video, _loop_pad(positions, index.n_frames))

    def __call__(self, video_file, positions: Sequence[int]) -> torch.Tensor:
        return self.read(video_file, positions).decode()

    def _failed(self, path: str, video: _OpenVideo, error) -> DataError:
        self._open.discard(path)  # its demuxer and decoder state are unknown now
        return DataError(f'video file {path}: decoding failed ({error}): {REENCODE}')


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
        except pyav().FFmpegError as e:
            raise self.loader._failed(self.path, self.video, e) from None

    def _peek(self):
        if self._first is None:
            self._first = self._next()
            if self._first is None:
                raise missing_error(self.path, self.video.index, self._uniq)
        return self._first

    @property
    def frame_size(self) -> tuple[int, int]:
        return upright_size(self._peek()[1], self.loader.short_side)

    def decode(self, factor: int = 1) -> torch.Tensor:
        if factor != 1 and factor not in self.factors:
            raise ValueError(f'this clip converts at 1/1 or 1/{self.factors} of its size, '
                             f'not 1/{factor}')
        first = self._peek()
        turns, scaler = quarter_turns(first[1]), self.loader._convert
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
                                f'{"x".join(map(str, array.shape[:2]))}): {REENCODE} at one size')
            # copied into the clip while the converted frame is still in the cache, and
            # freed: not a list of converted frames kept for one stack at the end
            clip[slots[p]] = array
            filled.append(p)
            item = self._next()
        if len(filled) < len(self._uniq):
            done = set(filled)
            raise missing_error(self.path, self.video.index,
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
            raise DataError(f'video file {path} has no frames: {REENCODE}')
        return _stack(arrays)
    loader = VideoClipLoader(short_side=short_side, threads=threads, max_open=1)
    try:
        return loader(path, positions)
    finally:
        loader.close()
