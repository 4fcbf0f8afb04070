"""Whether a video file is cut short (a truncated download), by the loader's rules,
and the errors that say so.  The byte-level facts of each container are
datasets/container_ends.py's; here they are weighed against what one demux pass
found (:func:`looks_cut`, for datasets.frame_index.scan_frame_index) or against
the file's own index without a pass (:func:`whole_by_its_index`, the common case
of --check_frames).  :func:`index_error` and :func:`missing_error` give the
DataError of frames asked for past a cut, past an end that cannot be told from a
cut, or that did not decode.
"""
from __future__ import annotations

import numpy as np

from datasets import container_ends as ends
from datasets.video_open import EXACT_COUNT_FORMATS, REENCODE, container_source
from utils.errors import DataError

__all__ = ['index_error', 'looks_cut', 'missing_error', 'whole_by_its_index']


def _header_duration(container) -> float | None:
    """The duration in seconds a FLV or ASF header states, None if it states none
    (other formats' durations are estimated from the file's end or bit rate, which
    says nothing about a cut)."""
    if set(container.format.name.split(',')) & {'flv', 'asf'} and container.duration:
        return container.duration / 1e6
    return None


def looks_cut(container, stream, scan, sorted_pts: np.ndarray | None) -> bool | None:
    """Whether the file's data ends before its own structure says its video does,
    decided by what is there (a variable frame rate's gaps and a last frame shown long
    change no count), read from what the container reads (a path, a shard member):
    AVI, fewer chunk slots than the header counts (the empty chunks FFmpeg writes for
    dropped frames included); MP4/MOV, fewer packets than the sample table lists;
    Matroska/WebM, a file ending inside a Cluster (container_ends.matroska_cut; None
    when a live writer's file, stating no size, ends between two of its elements and
    its Info states no duration: whether it was cut cannot be told); ASF, a file
    shorter than its Data Object; FLV, shorter than its metadata's file size (without
    one: a shorter duration than the header's); Ogg, no whole last page.  ``scan``:
    the demux pass (datasets.frame_index._Scan)."""
    formats = set(container.format.name.split(','))
    source = container_source(container)
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


def whole_by_its_index(container, stream) -> bool:
    """Whether the file's own index shows, without a demux pass, that the scan would
    find it whole (the common case, at the cost of an open): MP4/MOV, every sample of
    the table ends within the file; AVI, every idx1 entry does and they reach the
    header's chunk count; Matroska/WebM, container_ends.matroska_cut says not cut.
    False: only the scan tells.  The file is what the container reads (a path, a
    shard member)."""
    formats = set(container.format.name.split(','))
    if formats & {'matroska', 'webm'}:
        return ends.matroska_cut(container_source(container)) is False
    table = bool(formats & set(EXACT_COUNT_FORMATS))
    if not (table or 'avi' in formats) or stream.frames <= 0:
        return False
    entries = stream.index_entries
    end = slots = 0
    for entry in entries:
        end = max(end, entry.pos + entry.size)
        slots = max(slots, entry.timestamp + 1)
    inside = 0 < end <= (ends.source_size(container_source(container)) or 0)
    return inside and (len(entries) == stream.frames if table else slots >= stream.frames)


def missing_error(path: str, index, missing: list[int]) -> DataError:
    """Why the ``missing`` positions of the video at ``path`` (its FrameIndex:
    ``index``) were not read: cut short, past an end that may be a cut's, or not decoded."""
    shown = ', '.join(map(str, missing[:8])) + (f' and {len(missing) - 8} more'
                                                 if len(missing) > 8 else '')
    if index.truncated:
        total = f' of {index.expected}' if index.expected else ''
        return DataError(f'video file {path} is cut short (a truncated download?): it holds '
                         f'{index.n_frames} whole frames{total}; frames {shown} (0-based) '
                         f'are missing: {REENCODE}')
    if index.open_end:
        return DataError(f'video file {path} may be cut short: it states no length (a live '
                         f'recording\'s Matroska/WebM) and ends after {index.n_frames} frames; frames '
                         f'{shown} (0-based) are past that end and are not loop-padded: remux or '
                         f're-encode the video (its length is then stated), or annotate only '
                         f'{index.n_frames} frames')
    return DataError(f'video file {path}: frames {shown} (0-based) of {index.n_frames} could '
                     f'not be decoded: {REENCODE}')


def index_error(path: str, index, positions) -> DataError | None:
    """The error reading ``positions`` raises before any decoding (a video without
    frames; positions past the end of one cut short, or of one whose end cannot be told
    from a cut, which are not loop-padded), None if none."""
    if index.n_frames == 0:
        if index.truncated or index.open_end:
            return missing_error(path, index, sorted(set(positions)))
        return DataError(f'video file {path} has no frames: {REENCODE}')
    if index.truncated or index.open_end:
        past = sorted({p for p in positions if p >= index.n_frames})
        if past:
            return missing_error(path, index, past)
    return None
