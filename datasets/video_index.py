"""A compact, cached table of :class:`~datasets.annotation.VideoRecord` s for large data sets.

A list of 650k ``VideoRecord`` objects (Kinetics-700) costs ~100 MB of Python
objects, and every DataLoader worker that reads them writes their reference
counts, copying every page (copy-on-write) into each worker: the classic
"memory leak" of PyTorch data loading.  :class:`RecordTable` keeps the same
data in a handful of numpy arrays (UTF-8 buffers with offsets for ids and
paths, int32 frames, int16 labels); reading an entry builds a short-lived
``VideoRecord`` and writes nothing shared.

:func:`load_record_table` builds the table from the annotation once and caches
it as an ``.npz`` in ``cache_dir`` (next to the results), keyed by the
annotation file (path, size, modification time), the video path (and its
modification time), the subset, data set and file type: a change to any of
them builds a new one.  A cached start-up reads the arrays and skips the JSON.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from datasets.annotation import VideoRecord, load_annotations

__all__ = ['RecordTable', 'load_record_table']

FORMAT_VERSION = 1
_ARRAYS = ('ids', 'id_offsets', 'paths', 'path_offsets', 'first_frame', 'n_frames', 'label',
           'segment_begin')


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

    def save(self, path, class_names: Sequence[str]) -> None:
        """Atomic write (temporary file + rename): ranks may race to write it."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f'.{path.name}.{os.getpid()}.tmp')
        with open(tmp, 'wb') as f:
            np.savez(f, root=np.array(self.root), class_names=np.array(json.dumps(class_names)),
                     **{k: getattr(self, k) for k in _ARRAYS})
        os.replace(tmp, path)

    @classmethod
    def load(cls, path) -> tuple[RecordTable, list[str]]:
        with np.load(path, allow_pickle=False) as data:
            table = cls({k: data[k] for k in _ARRAYS}, str(data['root']))
            return table, json.loads(str(data['class_names']))


def _cache_key(annotation_path, subset, video_path, dataset, file_type) -> str:
    annotation = Path(annotation_path).resolve()
    video = Path(video_path).resolve() if video_path is not None else Path('.').resolve()
    st = annotation.stat()
    try:
        video_mtime = video.stat().st_mtime_ns
    except OSError:
        video_mtime = None
    key = json.dumps([FORMAT_VERSION, str(annotation), st.st_size, st.st_mtime_ns, str(video),
                      video_mtime, subset, dataset.lower(), file_type])
    return hashlib.sha1(key.encode()).hexdigest()[:16]


def load_record_table(annotation_path, subset: str, video_path, dataset: str,
                      file_type: str = 'jpg',
                      cache_dir=None) -> tuple[RecordTable, list[str], bool]:
    """(table, class names, whether the cache was used): load_annotations' records as
    a RecordTable, read from / written to ``cache_dir`` when given."""
    cache = None
    if cache_dir is not None and Path(annotation_path).is_file():
        key = _cache_key(annotation_path, subset, video_path, dataset, file_type)
        cache = Path(cache_dir) / f'records_{subset}_{key}.npz'
        if cache.is_file():
            try:
                return (*RecordTable.load(cache), True)
            except (OSError, ValueError, KeyError):
                pass  # damaged: rebuild below
    records, class_names = load_annotations(annotation_path, subset, video_path, dataset,
                                            file_type=file_type)
    table = RecordTable.from_records(records, video_path if video_path is not None else '.')
    del records
    if cache is not None:
        table.save(cache, class_names)
    return table, class_names, False
