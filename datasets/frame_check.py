"""Up-front check that every frame a run will read is there (--check_frames):
:func:`check_videos`, which dataset.py runs on each subset's records.

* ``last``: one stat per video, of the last needed frame (the check before
  --check_frames existed).
* ``all``: one directory listing per jpg video; every frame the annotation
  names must be in it (hdf5: as ``last``; video files: a file cut short before
  the frames needed is found as the loader finds it, from the file's own index or
  one demux pass, nothing decoded).
* ``decode``: reads and decodes every needed frame (finds zero-byte and
  corrupt files too).

Videos run on a thread pool (the listing and reading release the GIL; that
matters most on network file systems). A check that found nothing wrong is
remembered in a cache file keyed by the mode and the exact list of videos and
frame ranges, so the next start on the same data skips it. The cache does not
look at the disk again: after changing frames on disk, delete the cache file
(its path is printed) or rely on --on_bad_video during training.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import numpy as np

from datasets.annotation import VideoRecord
from datasets.formats import frame_count, frame_file_name
from datasets.loader import make_loader
from datasets.temporal_transforms import clip_span
from datasets.whole_videos import check_video_frames, container_frames
from utils.atomic import write_atomic
from utils.errors import DataError

MODES = ('last', 'all', 'decode')
DECODE_CHUNK = 64  # frames decoded at once: bounds the memory of a long video


def default_cache_dir() -> Path:
    base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    return Path(base) / '3d-resnets-pytorch' / 'frame_check'


def needed_ranges(records) -> dict[str, list[tuple[int, int]]]:
    """Per video path, the merged half-open ranges of 0-based positions its
    records use (several ActivityNet segments can share one video)."""
    spans: dict[str, list[tuple[int, int]]] = {}
    for r in records:
        spans.setdefault(r.path, []).append((r.first_frame, r.first_frame + r.n_frames))
    merged = {}
    for path, ranges in spans.items():
        if len(ranges) == 1:  # the common case: one record per video
            merged[path] = ranges
            continue
        ranges.sort()
        out = [list(ranges[0])]
        for a, b in ranges[1:]:
            if a <= out[-1][1]:
                out[-1][1] = max(out[-1][1], b)
            else:
                out.append([a, b])
        merged[path] = [(a, b) for a, b in out]
    return merged


class _FrameNames:
    """image_{p+1:05d}.jpg for positions 0..n, formatted once and sliced."""

    def __init__(self):
        self.names: list[str] = []

    def upto(self, end: int) -> list[str]:
        while len(self.names) < end:
            self.names.append(frame_file_name(len(self.names)))
        return self.names


def _check_listing(path: str, ranges, names: list[str]) -> str | None:
    try:
        present = set(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return f'{path}: folder missing'
    except OSError as e:
        return f'{path}: cannot list the folder ({e.strerror})'
    if all(present.issuperset(names[a:b]) for a, b in ranges):
        return None
    missing = [n for a, b in ranges for n in names[a:b] if n not in present]
    shown = ', '.join(missing[:3]) + (f' and {len(missing) - 3} more' if len(missing) > 3 else '')
    total = sum(b - a for a, b in ranges)
    return f'{path}: {len(missing)} of the {total} frames it needs are missing ({shown})'


def _check_decode(path: str, ranges, loader) -> str | None:
    try:
        for a, b in ranges:
            for start in range(a, b, DECODE_CHUNK):
                loader(path, range(start, min(b, start + DECODE_CHUNK)))
    except DataError as e:
        return str(e).split(': re-extract')[0]
    except (OSError, RuntimeError) as e:
        return f'{path}: reading frames failed ({e})'
    return None


# In the cache key: bump it when a check finds more than it did (2: video files under
# 'all' are checked for a cut as the loader checks them; 3: so are those in local shards,
# and a live writer's Matroska/WebM), so older passes are not trusted.
CHECK_VERSION = 3


def cache_key(items, mode: str, file_type: str, input_type: str) -> str:
    text = '\n'.join(f'{path}\t{ranges[0][0]}\t{ranges[0][1]}' if len(ranges) == 1
                     else f'{path}\t{ranges}' for path, ranges in items)
    head = f'{CHECK_VERSION}|{mode}|{file_type}|{input_type}'
    return hashlib.sha256(f'{head}\n{text}'.encode()).hexdigest()[:32]


def check_frames(items, mode: str = 'all', file_type: str = 'jpg', input_type: str = 'rgb',
                 n_threads: int = 16, cache_dir=None) -> list[str]:
    """Problems (one line per bad video) of ``items``: (path, ranges) pairs
    (or the dict :func:`needed_ranges` makes). Empty when all is well; an empty result is
    cached in ``cache_dir`` (None: no cache)."""
    if mode not in ('all', 'decode'):
        raise ValueError(f'check_frames mode must be all or decode, got {mode!r}')
    items = list(items.items()) if isinstance(items, dict) else list(items)
    cache_file = None
    if cache_dir is not None:
        cache_file = Path(cache_dir) / f'{cache_key(items, mode, file_type, input_type)}.ok'
        if cache_file.is_file():
            return []
    problems = _problems(_make_check(mode, file_type, input_type, items), items, n_threads)
    if not problems and cache_file is not None:
        _write_cache(cache_file, len(items), mode)
    return problems


def _problems(check, items, n_threads: int) -> list[str]:
    """The non-empty results of ``check`` over ``items``, in order; many items
    run on a thread pool."""
    if len(items) > 64 and n_threads > 1:
        with ThreadPoolExecutor(n_threads) as pool:
            return [p for p in pool.map(check, items, chunksize=64) if p]
    return [p for p in map(check, items) if p]


def _make_check(mode: str, file_type: str, input_type: str, items):
    if mode == 'decode':
        loader = make_loader(file_type, input_type)
        return lambda item: _check_decode(item[0], item[1], loader)
    if file_type != 'jpg':
        raise ValueError('check_frames lists jpg folders only; hdf5 and video files are '
                         'checked by check_videos')
    names = _FrameNames().upto(max((ranges[-1][1] for _, ranges in items), default=0))
    return lambda item: _check_listing(item[0], item[1], names)


def _write_cache(cache_file: Path, n_videos: int, mode: str) -> None:
    """Best effort: a cache that cannot be written only costs the next start time."""
    try:
        write_atomic(cache_file, json.dumps({'videos': n_videos, 'mode': mode,
                                             'checked_at': time.strftime('%Y-%m-%d %H:%M:%S')}) + '\n')
    except OSError:
        pass


def count_short_videos(records, sample_duration: int, t_stride: int = 1) -> int:
    """Videos with fewer frames than one clip spans (their clips are loop-padded)."""
    span = clip_span(sample_duration, t_stride)
    n_frames = getattr(records, 'n_frames', None)  # a RecordTable's array
    if n_frames is not None and not callable(n_frames):
        return int((n_frames < span).sum())
    return sum(1 for r in records if r.n_frames < span)


def _check_video_file(path: str, needed: int, mode: str, store=None) -> str | None:
    """'last': opens the container.  'all': what the loader finds too
    (datasets.whole_videos.check_video_frames: the file's own index or one demux pass): a
    file cut short before ``needed`` frames.  The frame count of a whole file is not compared with the segment:
    counts differ between tools (an annotation built from ffmpeg-extracted frames
    may list a frame more) and the loader loop-pads past the real end."""
    if mode == 'all':
        return check_video_frames(path, needed, store)
    try:
        container_frames(path)
    except DataError as e:
        return str(e)
    return None


def _check_one(item) -> str | None:
    path, needed, file_type, mode, *store = item
    if file_type == 'video':
        return _check_video_file(path, needed, mode, *store)
    if file_type == 'jpg':
        last = os.path.join(path, frame_file_name(needed - 1))
        try:
            os.stat(last)
            return None
        except OSError:
            pass
        if not os.path.isdir(path):
            return f'{path}: folder missing'
        return f'{path}: needs {needed} frames but {frame_file_name(needed - 1)} is missing'
    try:
        n = frame_count(path, 'hdf5')
    except OSError as e:
        if not os.path.exists(path):
            return f'{path}: file missing'
        return f'{path}: cannot be opened as hdf5 ({e})'
    if n is None:
        return f'{path}: no "video" (or "video_u") dataset'
    if n < needed:
        return f'{path}: needs {needed} frames but has {n}'
    return None


def _needed_ends(records) -> tuple[np.ndarray, np.ndarray]:
    """(distinct video paths, the end of the frames their records need), vectorised
    over a RecordTable's arrays (585,000 records in about a second)."""
    if hasattr(records, 'paths_list'):
        paths = np.asarray(records.paths_list(), dtype=str)
        ends = records.first_frame.astype(np.int64) + records.n_frames
    else:
        paths = np.asarray([r.path for r in records], dtype=str)
        ends = np.asarray([r.first_frame + r.n_frames for r in records], dtype=np.int64)
    distinct, which = np.unique(paths, return_inverse=True)
    needed = np.zeros(len(distinct), dtype=np.int64)
    np.maximum.at(needed, which, ends)
    return distinct, needed


def _member_problems(paths, needed, file_type, index) -> list[str]:
    rows = index.rows(paths)
    counts = np.where(rows >= 0, index.columns['n_frames'][np.maximum(rows, 0)], -1)
    short = (counts < needed) & (rows >= 0) if file_type == 'hdf5' else np.zeros(len(rows), dtype=bool)
    problems = []  # a video file's count is not compared (see _check_video_file)
    for i in np.flatnonzero((rows < 0) | short):
        problems.append(f'{paths[i]}: not in the shard index of {index.source}' if rows[i] < 0 else
                        f'{paths[i]}: needs {needed[i]} frames but has {counts[i]} (in the shard index)')
    return problems


def _shard_check_cache(records, index, mode, file_type, input_type, cache_dir, n_sample) -> Path | None:
    """Where a clean check of a RecordTable against a shard index is remembered: named
    by the records' arrays and the index's digest (a start-up at Kinetics scale then
    skips 2 s of lookups)."""
    if cache_dir is None or n_sample is not None or not hasattr(records, 'paths_list'):
        return None
    h = hashlib.sha256(f'{CHECK_VERSION}|shards|{mode}|{file_type}|{input_type}|{index.source}|{index.digest}'.encode())
    for array in (records.paths, records.path_offsets, records.first_frame, records.n_frames):
        h.update(np.ascontiguousarray(array).tobytes())
    return Path(cache_dir) / f'{h.hexdigest()[:32]}.ok'


def _shard_problems(records, store, file_type, mode, input_type, n_threads, n_sample):
    """check_videos on make_shards' output: each video looked up in the index (its
    frame count there), with 'all' a video file in a local shard checked for a cut as
    the loader checks it (its member read as the file is: an open, at most a demux
    pass; over a URL that would fetch every payload, so there a cut is found when a
    clip reads it), and with 'decode' every needed frame read and decoded through
    the store."""
    paths, needed = _needed_ends(records)
    if n_sample is not None and n_sample < len(paths):
        pick = sorted(random.Random(0).sample(range(len(paths)), n_sample))
        paths, needed = paths[pick], needed[pick]
    problems = _member_problems(paths, needed, file_type, store.index())
    if mode == 'all' and file_type == 'video' and not store.remote and not problems:
        problems = _problems(_check_one, [(str(p), int(n), file_type, mode, store) for p, n in zip(paths, needed)],
                             n_threads)
    if mode == 'decode' and not problems:
        loader = make_loader(file_type, input_type, store=store)
        ranges = needed_ranges(records)
        problems = _problems(lambda path: _check_decode(path, ranges[path], loader), [str(p) for p in paths],
                             n_threads)
    return problems, len(paths)


def check_videos(records: Sequence[VideoRecord], file_type: str = 'jpg',
                 n_sample: int | None = None, max_listed: int = 5,
                 n_threads: int = 16, mode: str = 'last', input_type: str = 'rgb',
                 cache_dir=None, store=None) -> None:
    """Verify that every video exists and has the frames its segment needs.

    ``mode`` 'last': one look per video (jpg: stat the last needed
    ``image_XXXXX.jpg``; hdf5: open and read the length; video: open the
    container).  'all': jpg folders are listed once each (every needed frame
    must be there), hdf5 files are looked at as by 'last', video files are
    checked for a cut short as the loader would (no decoding).
    'decode': every needed frame is decoded.  See :mod:`datasets.frame_check`;
    a clean 'all'/'decode' result is cached in ``cache_dir``.  Runs on a
    thread pool so that network file systems are fast too.  ``n_sample``:
    check only that many videos drawn at random (fixed seed).  Raises
    :class:`DataError` listing the first bad videos.  ``store``: the records are
    REL keys of make_shards' output (datasets/storage.py): checked in its index.
    """
    listing = mode == 'decode' or (mode == 'all' and file_type == 'jpg')
    if store is not None:
        cache_file = _shard_check_cache(records, store.index(), mode, file_type, input_type, cache_dir, n_sample)
        if cache_file is not None and cache_file.is_file():
            return None
        problems, n_items = _shard_problems(records, store, file_type, mode, input_type, n_threads, n_sample)
        if not problems and cache_file is not None:
            _write_cache(cache_file, n_items, mode)
        return _raise_problems(problems, n_items, file_type, mode, max_listed, shards=True)
    if not listing:
        needed: dict[str, int] = {}
        for r in records:
            end = r.first_frame + r.n_frames
            if needed.get(r.path, -1) < end:
                needed[r.path] = end
        items = [(p, n, file_type, mode) for p, n in needed.items()]
    else:
        items = list(needed_ranges(records).items())
    if n_sample is not None and n_sample < len(items):
        items = random.Random(0).sample(items, n_sample)
    if listing:
        problems = check_frames(items, mode, file_type, input_type, n_threads, cache_dir)
    else:
        problems = _problems(_check_one, items, n_threads)
    _raise_problems(problems, len(items), file_type, mode, max_listed)


def _raise_problems(problems, n_items, file_type, mode, max_listed, shards=False):
    if problems and shards:
        raise DataError(f'{len(problems)} of {n_items} videos are missing, too short or unreadable in the '
                        f'shards ({file_type}, --check_frames {mode}):\n  ' + '\n  '.join(problems[:max_listed]) +
                        (f'\n  ... and {len(problems) - max_listed} more' if len(problems) > max_listed else '') +
                        '\nFix: make the shards again from fixed videos (util_scripts.make_shards with this '
                        'annotation), or remove their entries; also check --video_path')
    if problems:
        redo = ('re-download or re-encode these videos' if file_type == 'video' else
                're-extract the frames of these videos (util_scripts generate_video_jpgs / '
                'generate_video_hdf5)')
        fix = (f'{redo} and rebuild the annotation file, or remove their entries; '
               'also check --video_path and --file_type')
        listed = '\n  '.join(problems[:max_listed])
        more = f'\n  ... and {len(problems) - max_listed} more' \
            if len(problems) > max_listed else ''
        raise DataError(f'{len(problems)} of {n_items} videos are missing, too short or '
                        f'unreadable ({file_type}, --check_frames {mode}):\n  {listed}{more}\n'
                        f'Fix: {fix}')

