"""Reading a video file whole rather than a clip of it, for the preparation tools
and the data checks:

* :func:`iter_frames` -- every frame once, in order (optionally resampled to a
  frame rate and resized).
* :func:`count_frames` -- frame count from the container header or by decoding;
  :func:`container_frames` -- the header's count alone.
* :func:`check_video_frames` -- what the clip loader would find wrong in a video
  (cut short, no frames), from the file's own index or one demux pass
  (--check_frames all).
"""
from __future__ import annotations

import os
from typing import Iterator

import numpy as np

from datasets.cut_videos import index_error, whole_by_its_index
from datasets.frame_conversion import new_scaler, to_array
from datasets.frame_index import scan_frame_index
from datasets.video_open import EXACT_COUNT_FORMATS, REENCODE, open_video, pyav, set_threads
from datasets.video_stream import video_stream
from utils.errors import DataError

__all__ = ['check_video_frames', 'container_frames', 'count_frames', 'iter_frames']


def iter_frames(path, fps: float | None = None, short_side: int | None = None,
                threads: int = 0, interpolation: str = 'BICUBIC') -> Iterator[np.ndarray]:
    """Every frame of the video once, in presentation order, as upright RGB
    (H, W, 3) uint8 arrays (variable frame rate: every decoded frame, none
    duplicated or dropped).  ``fps > 0`` resamples: output frame ``k`` shows the
    input frame on screen at time ``k / fps`` (frames dropped or repeated)."""
    path = os.fspath(path)
    av = pyav()
    with open_video(path) as container:
        stream = video_stream(container)
        set_threads(stream, threads)
        frames = container.decode(stream)
        convert = new_scaler(threads)
        try:
            if fps is None or fps <= 0:
                for frame in frames:
                    yield to_array(frame, short_side, convert, interpolation)
            else:
                yield from _resample(frames, fps, short_side, convert, interpolation)
        except av.FFmpegError as e:
            raise DataError(f'video file {path}: decoding failed ({e}): {REENCODE}') from None


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
        previous = (t, to_array(frame, short_side, convert, interpolation))
        n_in += 1
    if previous is not None:
        mean_duration = (previous[0] - start) / (n_in - 1) if n_in > 1 else 1.0 / fps
        end = previous[0] - start + mean_duration
        while produced / fps < end - 1e-9 or produced == 0:
            yield previous[1]
            produced += 1


def container_frames(path) -> int | None:
    """The frame count the container's header gives (None if it gives none);
    opens the file, decodes nothing.  Raises DataError if it is no video."""
    with open_video(os.fspath(path)) as container:
        n = video_stream(container).frames
    return int(n) if n > 0 else None


def count_frames(path, exact: bool = False) -> tuple[int, str]:
    """(frame count, how it was measured: 'container' or 'decoded').

    MP4/MOV sample tables list the coded frames exactly (those an edit list hides
    are not counted: they are never shown); AVI indexes may list dropped (empty)
    frames and WebM/MKV give no count, so those (and ``exact=True``) are counted
    by decoding every frame."""
    path = os.fspath(path)
    av = pyav()
    with open_video(path) as container:
        stream = video_stream(container)
        formats = set(container.format.name.split(','))
        if not exact and stream.frames > 0 and formats & set(EXACT_COUNT_FORMATS):
            entries = stream.index_entries
            if len(entries) == stream.frames:
                return sum(not e.is_discard for e in entries), 'container'
            return int(stream.frames), 'container'
        set_threads(stream, 0)
        n = 0
        try:
            for _ in container.decode(stream):
                n += 1
        except av.FFmpegError as e:
            raise DataError(f'video file {path}: decoding failed after {n} frames ({e}): '
                            f'{REENCODE}') from None
        return n, 'decoded'


def check_video_frames(path, needed: int, store=None) -> str | None:
    """What the clip loader would find wrong reading frames 0 to ``needed`` - 1 of a
    video, by the loader's own rule: the file cannot be opened, has no frames, or is
    cut short before ``needed`` (past the end of a whole file clips are loop-padded:
    not wrong).  A file whose own index shows it whole costs an open; any other is
    indexed as the loader indexes it (one demux pass, nothing decoded).  None if
    nothing is wrong."""
    path = os.fspath(path)
    try:
        with open_video(path, store) as container:
            stream = video_stream(container)
            if whole_by_its_index(container, stream):
                return None  # a whole file: clips past its end are loop-padded
            index = scan_frame_index(container, stream)
    except DataError as e:
        return str(e)
    error = index_error(path, index, range(needed))
    return None if error is None else str(error)
