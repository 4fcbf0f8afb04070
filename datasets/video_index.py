"""A compact, cached table of :class:`~datasets.annotation.VideoRecord` s for large data sets.

A list of 650k ``VideoRecord`` objects (Kinetics-700) costs ~100 MB of Python
objects, and every DataLoader worker that reads them writes their reference
counts, copying every page (copy-on-write) into each worker: the classic
"memory leak" of PyTorch data loading.  :class:`RecordTable` keeps the same
data in a handful of numpy arrays (UTF-8 buffers with offsets for ids and
paths, int32 frames, int16 labels); reading an entry builds a short-lived
``VideoRecord`` and writes nothing shared.

:func:`load_record_table` builds the table from the annotation once and caches
it as an ``.npz`` in ``cache_dir`` (next to the results), keyed by the cache's
FORMAT_VERSION, the annotation file (path, size, modification time), the video
path, the subset, data set and file type.  The file also lists what its records
were read from (the video root, each class folder, each video counted from disk:
datasets.annotation.load_annotations' ``depends``) with their modification
times: a video renamed, added or removed in a class folder, or a counted one
replaced, builds it again.  A cached start-up reads the arrays and one stat per
class folder, and skips the JSON.

:class:`FrameTable` keeps the frame indexes of ``--file_type video`` files (what a
frame-exact seek needs: timestamps, keyframes) in memory-mapped segment files
under ``<result_path>/data_index/frames/``: each video is demuxed once per run
(at its first open), not at every open.
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from datasets.annotation import VideoRecord, load_annotations, path_signature
from utils.atomic import atomic_file

__all__ = ['FrameTable', 'RecordTable', 'load_record_table']

# Bump it whenever what a record cache file stores or means changes (an array, how a
# path is stored, what `depends` lists): it is in the key, so older files are not read.
FORMAT_VERSION = 2
_ARRAYS = ('ids', 'id_offsets', 'paths', 'path_offsets', 'first_frame', 'n_frames', 'label',
           'segment_begin')


def _changed(depends: dict) -> str | None:
    """The first path of ``depends`` ({path: path_signature}) whose signature differs now."""
    return next((path for path, signature in depends.items()
                 if path_signature(path) != signature), None)


def _pack(strings: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """One UTF-8 buffer and int64 offsets (len + 1) for a list of strings."""
    encoded = [s.encode('utf-8') for s in strings]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    return np.frombuffer(b''.join(encoded), dtype=np.uint8).copy(), offsets


class RecordTable(Sequence):
    """Read-only sequence of VideoRecord built on access from numpy arrays.

    ``n_frames``, ``first_frame``, ``label`` are exposed as arrays for
    vectorised use (sampling, window counts).  Paths are stored relative to
    ``root`` when they lie under it."""

    def __init__(self, arrays: dict[str, np.ndarray], root: str):
        for name in _ARRAYS:
            setattr(self, name, arrays[name])
        self.root = root

    @classmethod
    def from_records(cls, records: Sequence[VideoRecord], root) -> RecordTable:
        root = os.fspath(root)
        prefix = root.rstrip(os.sep) + os.sep
        rel = [r.path[len(prefix):] if r.path.startswith(prefix) else '\0' + r.path
               for r in records]
        ids, id_offsets = _pack([r.video_id for r in records])
        paths, path_offsets = _pack(rel)
        arrays = dict(ids=ids, id_offsets=id_offsets, paths=paths, path_offsets=path_offsets,
                      first_frame=np.array([r.first_frame for r in records], dtype=np.int32),
                      n_frames=np.array([r.n_frames for r in records], dtype=np.int32),
                      label=np.array([r.label for r in records], dtype=np.int16),
                      segment_begin=np.array([r.segment[0] for r in records], dtype=np.int32))
        if len(records) and max(r.label for r in records) >= 2**15:
            raise ValueError('more than 32767 classes do not fit the int16 labels')
        return cls(arrays, root)

    def __len__(self) -> int:
        return len(self.n_frames)

    def _text(self, buffer: np.ndarray, offsets: np.ndarray, i: int) -> str:
        return buffer[offsets[i]:offsets[i + 1]].tobytes().decode('utf-8')

    def video_id(self, i: int) -> str:
        return self._text(self.ids, self.id_offsets, i)

    def path(self, i: int) -> str:
        rel = self._text(self.paths, self.path_offsets, i)
        return rel[1:] if rel.startswith('\0') else os.path.join(self.root, rel)

    def paths_list(self) -> list[str]:
        """Every record's path (path(i) for all i), decoded in one pass."""
        data, offsets = self.paths.tobytes(), self.path_offsets.tolist()
        texts = [data[a:b].decode('utf-8') for a, b in zip(offsets, offsets[1:])]
        return [t[1:] if t.startswith('\0') else os.path.join(self.root, t) for t in texts]

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f'record {i} of {n}')
        i = int(i) % n
        first, count = int(self.first_frame[i]), int(self.n_frames[i])
        begin = int(self.segment_begin[i])
        return VideoRecord(self.video_id(i), self.path(i), first, count, int(self.label[i]),
                           (begin, begin + count))

    def __iter__(self) -> Iterator[VideoRecord]:
        return (self[i] for i in range(len(self)))

    def save(self, path, class_names: Sequence[str], depends: dict | None = None) -> None:
        """Atomic write (ranks may race to write it); ``depends``: {path: path_signature}
        of what the records were read from, checked by load."""
        with atomic_file(path) as f:
            np.savez(f, root=np.array(self.root), class_names=np.array(json.dumps(class_names)),
                     depends=np.array(json.dumps(depends or {})),
                     **{k: getattr(self, k) for k in _ARRAYS})

    @classmethod
    def load(cls, path) -> tuple[RecordTable, list[str]]:
        """The table and class names saved at ``path``; ValueError when a file or folder
        the records were read from changed since."""
        with np.load(path, allow_pickle=False) as data:
            changed = _changed(json.loads(str(data['depends'])))
            if changed is not None:
                raise ValueError(f'{changed} changed since the records were read')
            table = cls({k: data[k] for k in _ARRAYS}, str(data['root']))
            return table, json.loads(str(data['class_names']))


def _cache_key(annotation_path, subset, videos: str, dataset, file_type) -> str:
    """What names the cache file; the videos' folders are checked by RecordTable.load."""
    annotation = Path(annotation_path).resolve()
    st = annotation.stat()
    key = json.dumps([FORMAT_VERSION, str(annotation), st.st_size, st.st_mtime_ns, videos,
                      subset, dataset.lower(), file_type])
    return hashlib.sha1(key.encode()).hexdigest()[:16]


def load_record_table(annotation_path, subset: str, video_path, dataset: str,
                      file_type: str = 'jpg', cache_dir=None,
                      shards=None) -> tuple[RecordTable, list[str], bool]:
    """(table, class names, whether the cache was used): load_annotations' records as
    a RecordTable, read from / written to ``cache_dir`` when given.  ``shards``: the
    ShardIndex of make_shards' output at ``video_path`` (datasets/shards.py): each
    record's path is its video's REL (``<label>/<video_id>``), the cache depends on
    the annotation and the index, not on any folder."""
    cache = None
    if cache_dir is not None and Path(annotation_path).is_file():
        videos = (f'shards {shards.source} {shards.digest}' if shards is not None else
                  str(Path(video_path if video_path is not None else '.').resolve()))
        key = _cache_key(annotation_path, subset, videos, dataset, file_type)
        cache = Path(cache_dir) / f'records_{subset}_{key}.npz'
        if cache.is_file():
            try:
                return (*RecordTable.load(cache), True)
            except (OSError, ValueError, KeyError):
                pass  # damaged, or the videos changed: rebuild below
    depends = {} if cache is not None and shards is None else None
    if shards is not None:  # jpg naming: <label>/<video_id>, no listing, no extension
        records, class_names = load_annotations(annotation_path, subset, '', dataset, file_type='jpg',
                                                count=shards.n_frames)
    else:
        records, class_names = load_annotations(annotation_path, subset, video_path, dataset,
                                                file_type=file_type, depends=depends)
    table = RecordTable.from_records(records, video_path if video_path is not None and shards is None
                                     else '.')
    del records
    if cache is not None:
        table.save(cache, class_names, depends)
    return table, class_names, False


# ----------------------------------------------------------------------------- frame indexes
# What the frame-exact video loader needs of each video (datasets.frame_index.FrameIndex:
# timestamps, keyframes) comes from a demux pass over the whole file; a FrameTable
# keeps it, so that a clip costs open + seek + at most one GOP of decoding whatever
# the video's length.

# 2: cut-short files told by what is there (issue 24); 3: a live writer's Matroska/WebM and
# shard members judged by their bytes (issue 37): older tables rebuilt
FRAMES_VERSION = 3
FLUSH_EVERY = 4096  # new indexes a process keeps before writing them out
COMPACT_ABOVE = 4  # segment files merged into one when a run starts
_UNTIMED, _TRUNCATED, _OPEN_END = 1, 2, 4  # flags
_ROWS = {'hash': np.uint64, 'size': np.int64, 'mtime': np.int64, 'n_frames': np.int32,
         'expected': np.int32, 'flags': np.uint8, 'pts0': np.int64, 'step': np.int64,
         'pts_off': np.int64, 'key_off': np.int64}
_RAGGED = {'pts': np.int64, 'key_pos': np.int32, 'key_pts': np.int64, 'key_seek': np.int64}


def path_hash(path: str) -> int:
    """64 bits of the path's BLAKE2b digest: the same in every process (unlike hash())."""
    return int.from_bytes(hashlib.blake2b(path.encode('utf-8', 'surrogateescape'),
                                          digest_size=8).digest(), 'little')


def _write_segment(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """One .npy of bytes: an 8-byte header length, a JSON layout, then the arrays at
    8-aligned offsets (so that a memory map gives each as a view); atomic."""
    layout, parts, offset = {}, [], 0
    for name, a in arrays.items():
        data = np.ascontiguousarray(a).tobytes()
        layout[name] = [np.dtype(a.dtype).str, offset, len(a)]
        parts.append(data + b'\0' * (-len(data) % 8))
        offset += len(parts[-1])
    header = json.dumps({'version': FRAMES_VERSION, 'arrays': layout}).encode()
    header += b' ' * (-len(header) % 8)
    blob = len(header).to_bytes(8, 'little') + header + b''.join(parts)
    with atomic_file(path) as f:
        np.save(f, np.frombuffer(blob, np.uint8))


def _read_segment(path: Path) -> dict[str, np.ndarray] | None:
    """The arrays of a segment as views of a read-only memory map (pages shared by
    every process that maps the file); None if it is missing, damaged or of another
    version."""
    try:
        blob = np.load(path, mmap_mode='r', allow_pickle=False)
        n = int.from_bytes(blob[:8].tobytes(), 'little')
        meta = json.loads(blob[8:8 + n].tobytes())
        if meta.get('version') != FRAMES_VERSION:
            return None
        base = 8 + n
        blob = np.asarray(blob)  # plain views of the map: numpy's memmap class is slow to index
        return {name: blob[base + off:base + off + count * np.dtype(dt).itemsize].view(dt)
                for name, (dt, off, count) in meta['arrays'].items()}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _row_values(index) -> tuple[dict, np.ndarray]:
    """(scalar fields, presentation timestamps to store: none when they are regular,
    pts0 + step * position)."""
    flags = (_UNTIMED if index.pts is None else 0) | (_TRUNCATED if index.truncated else 0) | \
        (_OPEN_END if index.open_end else 0)
    row = dict(n_frames=index.n_frames, expected=-1 if index.expected is None else index.expected,
               flags=flags, pts0=0, step=1)
    pts = index.pts if index.pts is not None else np.zeros(0, np.int64)
    if len(pts):
        steps = np.diff(pts)
        row['pts0'] = int(pts[0])
        if len(steps) and (steps == steps[0]).all():
            row['step'] = int(steps[0])
        elif len(steps):
            row['step'] = 0  # irregular: stored
            return row, pts
    return row, np.zeros(0, np.int64)


def _pack_indexes(entries: list[tuple[int, int, int, object]]) -> dict[str, np.ndarray]:
    """Segment arrays of (path hash, size, mtime_ns, FrameIndex) entries, sorted by hash;
    the rows of one video (changed during a run) in the order added: _merge takes the last."""
    entries = sorted(entries, key=lambda e: e[0])  # stable
    cols = {name: [] for name in _ROWS}
    ragged = {name: [] for name in _RAGGED}
    n_pts = n_keys = 0
    for h, size, mtime, index in entries:
        row, pts = _row_values(index)
        for name, value in dict(hash=h, size=size, mtime=mtime, pts_off=n_pts,
                                key_off=n_keys, **row).items():
            cols[name].append(value)
        ragged['pts'].append(pts)
        for name in ('key_pos', 'key_pts', 'key_seek'):
            ragged[name].append(np.asarray(getattr(index, name)))
        n_pts, n_keys = n_pts + len(pts), n_keys + len(index.key_pos)
    cols['pts_off'].append(n_pts)
    cols['key_off'].append(n_keys)
    arrays = {name: np.asarray(cols[name], dtype) for name, dtype in _ROWS.items()}
    for name, dtype in _RAGGED.items():
        arrays[name] = np.concatenate(ragged[name]).astype(dtype) if entries else \
            np.zeros(0, dtype)
    return arrays


def _gather(parts: list[np.ndarray], offsets: list[np.ndarray], rows: np.ndarray):
    """(values, offsets) of the ragged rows ``rows`` (indexes into the segments' rows
    laid end to end) of arrays ``parts`` with per-segment offsets ``offsets``."""
    bases = np.cumsum([0] + [len(p) for p in parts[:-1]])
    starts = np.concatenate([o[:-1] + b for o, b in zip(offsets, bases)])[rows]
    counts = np.concatenate([np.diff(o) for o in offsets])[rows]
    new_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    take = np.repeat(starts - new_offsets[:-1], counts) + np.arange(new_offsets[-1])
    return np.concatenate(parts)[take], new_offsets


def _merge(segments: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One segment of ``segments`` (newest first): per video (path hash) the newest row,
    that of the newest segment holding it and, within a segment, the last."""
    hashes = np.concatenate([s['hash'] for s in segments])
    segment = np.concatenate([np.full(len(s['hash']), k) for k, s in enumerate(segments)])
    later = np.concatenate([-np.arange(len(s['hash'])) for s in segments])
    order = np.lexsort((later, segment, hashes))
    first = np.ones(len(order), bool)
    first[1:] = hashes[order][1:] != hashes[order][:-1]
    rows = order[first]
    out = {name: np.concatenate([s[name] for s in segments])[rows]
           for name in _ROWS if not name.endswith('_off')}
    out['pts'], out['pts_off'] = _gather([s['pts'] for s in segments],
                                         [s['pts_off'] for s in segments], rows)
    for name in ('key_pos', 'key_pts', 'key_seek'):
        out[name], out['key_off'] = _gather([s[name] for s in segments],
                                            [s['key_off'] for s in segments], rows)
    return {name: out[name].astype(dtype) for name, dtype in {**_ROWS, **_RAGGED}.items()}


def _unpack(seg: dict[str, np.ndarray], i: int):
    from datasets.frame_index import FrameIndex
    n, flags = int(seg['n_frames'][i]), int(seg['flags'][i])
    k0, k1 = int(seg['key_off'][i]), int(seg['key_off'][i + 1])
    if flags & _UNTIMED:
        pts = None
    elif seg['step'][i] == 0:
        pts = np.array(seg['pts'][int(seg['pts_off'][i]):int(seg['pts_off'][i + 1])])
    else:
        pts = int(seg['pts0'][i]) + int(seg['step'][i]) * np.arange(n, dtype=np.int64)
    expected = int(seg['expected'][i])
    return FrameIndex(pts, np.array(seg['key_pos'][k0:k1]), np.array(seg['key_pts'][k0:k1]),
                      np.array(seg['key_seek'][k0:k1]), n, bool(flags & _TRUNCATED),
                      None if expected < 0 else expected, bool(flags & _OPEN_END))


class FrameTable:
    """The frame indexes of the videos a run has opened, kept in ``folder``
    (``<result_path>/data_index/frames/``) across epochs, DataLoader workers
    (re-forked every epoch) and restarts.

    A process that opens a video the table does not hold (or that changed since:
    its size or modification time differ) demuxes it once and adds its index; new
    indexes are written out as a segment file every FLUSH_EVERY and when the process
    exits.  Every process memory-maps the segments, so a forked worker shares their
    pages instead of copying them (numpy arrays, no Python object per video: at
    Kinetics scale, 650k videos); a lookup is a binary search per segment.  A
    segment is written under a unique name and renamed into place, so processes
    and ranks writing at once do not clash."""

    def __init__(self, folder):
        self.folder = Path(folder) if folder is not None else None  # None: kept in memory only
        self._pid = None
        self._segments: list[dict[str, np.ndarray]] = []
        self._pending: dict[tuple, object] = {}  # key -> FrameIndex, not yet written

    def __getstate__(self):
        return {'folder': self.folder, '_pid': None, '_segments': [], '_pending': {}}

    def _files(self) -> list[Path]:
        if self.folder is None:
            return []
        try:
            return sorted(self.folder.glob('frames_*.npy'), key=lambda p: p.name, reverse=True)
        except OSError:
            return []

    def _fresh(self) -> None:
        """In a new process (a forked worker): map the segments there are now."""
        if self._pid == os.getpid():
            return
        self._pid, self._pending = os.getpid(), {}
        self._segments = [s for s in map(_read_segment, self._files()) if s is not None]
        from multiprocessing import util
        util.Finalize(self, FrameTable.flush, args=(self,), exitpriority=10)

    def __len__(self) -> int:
        self._fresh()
        return sum(len(s['hash']) for s in self._segments) + len(self._pending)

    def get(self, path: str):
        """(the stored FrameIndex of the video at ``path`` or None, the key to store
        one under: (path hash, size, mtime_ns), None if the file cannot be stat'ed)."""
        self._fresh()
        try:
            st = os.stat(path)
        except OSError:
            return None, None
        key = (path_hash(path), st.st_size, st.st_mtime_ns)
        return self.lookup(key), key

    def lookup(self, key):
        """The FrameIndex stored under ``key`` (path hash, size, mtime_ns), or None."""
        self._fresh()
        for seg in self._segments:
            i = int(np.searchsorted(seg['hash'], np.uint64(key[0])))
            while i < len(seg['hash']) and int(seg['hash'][i]) == key[0]:
                if seg['size'][i] == key[1] and seg['mtime'][i] == key[2]:
                    return _unpack(seg, i)
                i += 1
        return self._pending.get(key)

    def add(self, key, index) -> None:
        self._fresh()
        self._pending[key] = index
        if len(self._pending) >= FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        """Write the indexes this process added as a new segment."""
        if not self._pending or self._pid != os.getpid() or self.folder is None:
            return
        name = f'frames_{time.time_ns():020d}_{os.getpid()}_{secrets.token_hex(4)}.npy'
        try:
            entries = [(*key, index) for key, index in self._pending.items()]
            _write_segment(self.folder / name, _pack_indexes(entries))
        except OSError:
            return  # a cache: not writing it only costs demuxing again
        self._pending = {}
        segment = _read_segment(self.folder / name)
        if segment is not None:
            self._segments.insert(0, segment)

    def compact(self) -> None:
        """Merge the segments into one when there are more than COMPACT_ABOVE (at the
        start of a run: each epoch's workers may have added one).  Newest entry of a
        video wins; inputs are removed only after the merged file is in place.  A
        listed file gone when read means another rank is compacting: left to it."""
        files = self._files()
        if len(files) <= COMPACT_ABOVE:
            return
        segments = []
        for path in files:
            seg = _read_segment(path)
            if seg is None and not path.exists():
                return
            if seg is not None:  # a damaged one is dropped
                segments.append(seg)
        newest = files[0].name
        merged = _merge(segments) if segments else _pack_indexes([])
        _write_segment(self.folder / f'{newest[:-4]}_merged.npy', merged)
        for path in files:
            path.unlink(missing_ok=True)
        self._pid = None  # map the merged file on next use
