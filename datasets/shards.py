"""Video data sets as WebDataset-style tar shards: the format, its index, and the
helpers that write it (util_scripts/make_shards.py) and read it.  Torch-free
(numpy and the standard library), so that any process can read an index.

A shard folder (local, or the same names under an HTTP or S3 prefix)::

    shard-000000.tar, shard-000001.tar, ...   the videos
    index.json, index.npz                     the index, written last
    .make_shards.json                         the writer's progress (for its reruns only)

Shards.  Plain tar files (tarfile's GNU format: 512-byte headers, names longer
than 100 bytes in a ././@LongLink member, UTF-8 names), ended by two zero blocks
and padded to a multiple of 10240 bytes as tarfile pads them.  Each video is two
consecutive members, WebDataset's layout of one sample:

* ``<KEY>.<ext>``: the payload.  A video file's bytes unchanged (ext: its own
  extension lower-cased without the dot: mp4, avi, webm, mkv, ...), an hdf5 file's
  bytes unchanged (ext hdf5), or a jpg frame folder packed as
  util_scripts/generate_video_hdf5.py packs it (dataset 'video' of variable-length
  uint8, element p = the bytes of image_{p+1:05d}.jpg; the same bytes as the file
  that tool writes; ext hdf5).
* ``<KEY>.json``: ``{"file_type", "label", "n_frames", "path", "subsets"}``, keys
  sorted, separators ``,`` and ``:``: the payload's file_type ('video' or 'hdf5'),
  the class name (null for test videos), the video's frame count, REL, and the
  subsets ('training', 'validation', 'testing') whose annotation entries name it.

REL is the video's path relative to the video root, without the extension of a
file: ``<label>/<video_id>`` (``test/<video_id>`` for unlabelled videos,
``v_<video_id>`` for ActivityNet), the same whichever file type the videos had;
readers find a record's payload by it (:func:`relative_path`).  KEY is REL made
safe for WebDataset, which splits a member name at the first '.' of its base name:
'%' becomes '%25' and '.' becomes '%2E', '/' is kept (:func:`escape_key`).

Members are sorted by REL and shards filled in that order, each up to the writer's
shard size (a video larger than that gets a shard of its own).  Every header has
mtime 0, uid and gid 0, empty uname and gname, mode 0o644, type REG: the same input
gives the same bytes.

Index.  ``index.json``: ``{"format": "video-shards", "version": 1, "file_type":
"video" | "hdf5", "n_videos": N, "shards": [{"name", "size", "sha256", "members",
"n_videos"}]}`` (members: tar members, 2 per video).  ``index.npz`` (numpy arrays,
``np.load(..., allow_pickle=False)``), one row per video, sorted by ``path``:

* ``path`` (unicode): REL; ``ext`` (unicode): the payload member's extension;
* ``shard`` (int32): position in index.json's "shards";
* ``offset``, ``size`` (int64): where the payload member's data starts in its shard
  (tarfile's TarInfo.offset_data) and its length: one byte range per video;
* ``meta_offset``, ``meta_size`` (int64): the same for the json member;
* ``n_frames`` (int64): as in the json member.

The npz is written with fixed zip timestamps (not np.savez's, which stamp the
time), so it is byte-identical for the same rows too.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tarfile
import zipfile
from pathlib import Path
from typing import NamedTuple

import numpy as np

from datasets.formats import HDF5_SUFFIXES, VIDEO_EXTENSIONS
from utils.errors import DataError

__all__ = ['FORMAT', 'VERSION', 'INDEX_JSON', 'INDEX_NPZ', 'PROGRESS_NAME', 'COLUMNS', 'ShardEntry',
           'ShardIndex', 'shard_name', 'is_shard_file', 'escape_key', 'unescape_key', 'relative_path',
           'payload_ext', 'meta_bytes', 'tar_header', 'block_padding', 'archive_end', 'archive_size',
           'encode_index', 'read_shard_rows', 'file_sha256']

FORMAT = 'video-shards'
VERSION = 1
INDEX_JSON = 'index.json'
INDEX_NPZ = 'index.npz'
PROGRESS_NAME = '.make_shards.json'
TAR_FORMAT = tarfile.GNU_FORMAT
BLOCK = tarfile.BLOCKSIZE  # 512
RECORD = tarfile.RECORDSIZE  # 10240: tarfile pads an archive to a multiple of this
# index.npz's arrays, in the order written, and their dtypes (path and ext: unicode)
COLUMNS = {'path': None, 'ext': None, 'shard': np.int32, 'offset': np.int64, 'size': np.int64,
           'meta_offset': np.int64, 'meta_size': np.int64, 'n_frames': np.int64}
_SHARD_FILE = re.compile(r'^shard-\d{6}\.tar(\.tmp)?$')
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def shard_name(i: int) -> str:
    return f'shard-{i:06d}.tar'


def is_shard_file(name: str) -> bool:
    """A shard's name, or that of one being written (shard-NNNNNN.tar.tmp)."""
    return _SHARD_FILE.match(name) is not None


def escape_key(rel: str) -> str:
    """KEY of REL: '%' -> '%25', '.' -> '%2E' (WebDataset splits names at the first '.')."""
    return rel.replace('%', '%25').replace('.', '%2E')


def unescape_key(key: str) -> str:
    return key.replace('%2E', '.').replace('%25', '%')


def relative_path(path, root, file_type: str) -> str:
    """REL of a video at ``path`` (a record's path) under the video root ``root``:
    relative, '/'-separated, a file's extension (.hdf5/.h5, a video extension) removed.
    ValueError when the path is not under ``root``."""
    rel = Path(os.path.abspath(path)).relative_to(os.path.abspath(root)).as_posix()
    if rel == '.':
        raise ValueError(f'{path} is the video root itself')
    stem, ext = os.path.splitext(rel)
    known = HDF5_SUFFIXES if file_type == 'hdf5' else VIDEO_EXTENSIONS if file_type == 'video' else ()
    return stem if ext.lower() in known else rel


def payload_ext(path, file_type: str) -> str:
    """The payload member's extension: 'hdf5' for jpg folders and hdf5 files, a video
    file's own extension lower-cased."""
    return os.path.splitext(os.fspath(path))[1][1:].lower() if file_type == 'video' else 'hdf5'


def meta_bytes(rel: str, label, subsets, n_frames: int, file_type: str) -> bytes:
    """The ``<KEY>.json`` member of a video."""
    meta = {'path': rel, 'label': label, 'subsets': list(subsets), 'n_frames': int(n_frames),
            'file_type': file_type}
    return json.dumps(meta, sort_keys=True, separators=(',', ':')).encode()


def tar_header(name: str, size: int) -> bytes:
    """The header block(s) of a regular member of ``size`` bytes: mtime 0, uid/gid 0,
    no user or group name, mode 0o644 (a long name adds a GNU ././@LongLink member)."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.type = size, 0, 0o644, tarfile.REGTYPE
    info.uid = info.gid = 0
    info.uname = info.gname = ''
    return info.tobuf(TAR_FORMAT, 'utf-8', 'surrogateescape')


def block_padding(size: int) -> bytes:
    """The zeros after ``size`` data bytes up to the next 512-byte block."""
    return b'\0' * (-size % BLOCK)


def archive_end(offset: int) -> bytes:
    """What ends an archive whose members take ``offset`` bytes: two zero blocks, then
    zeros up to a multiple of 10240 (as tarfile ends one)."""
    return b'\0' * (archive_size(offset) - offset)


def archive_size(offset: int) -> int:
    """The size of a shard whose members take ``offset`` bytes."""
    return -(-(offset + 2 * BLOCK) // RECORD) * RECORD


def file_sha256(path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _npz_bytes(columns: dict) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, 'w', zipfile.ZIP_DEFLATED) as zf:
        for name in COLUMNS:
            info = zipfile.ZipInfo(f'{name}.npy', date_time=_ZIP_TIME)
            info.compress_type, info.external_attr = zipfile.ZIP_DEFLATED, 0o644 << 16
            with zf.open(info, 'w', force_zip64=True) as f:
                np.lib.format.write_array(f, np.ascontiguousarray(columns[name]), allow_pickle=False)
    return buf.getvalue()


def encode_index(file_type: str, shards: list[dict], rows: list[dict]) -> tuple[bytes, bytes]:
    """(index.json, index.npz) bytes of the shards (dicts: name, size, sha256, members,
    n_videos) and the per-video rows (dicts with COLUMNS' keys), rows sorted by path."""
    paths = [r['path'] for r in rows]
    if paths != sorted(paths) or len(set(paths)) != len(paths):
        raise ValueError('index rows must be sorted by path, each path once')
    columns = {name: np.array([r[name] for r in rows], dtype=dtype or str) for name, dtype in COLUMNS.items()}
    info = {'format': FORMAT, 'version': VERSION, 'file_type': file_type, 'n_videos': len(rows),
            'shards': [{k: s[k] for k in ('name', 'size', 'sha256', 'members', 'n_videos')} for s in shards]}
    return json.dumps(info, sort_keys=True, indent=1).encode() + b'\n', _npz_bytes(columns)


def read_shard_rows(path, shard: int) -> list[dict]:
    """The index rows of the videos in one shard file, read from its headers and json
    members (how a writer takes up its finished shards again, or a checker checks
    them).  DataError when it is not a shard of this format."""
    rows = []
    try:
        with tarfile.open(path, 'r:') as tar:
            members = tar.getmembers()
            if len(members) % 2:
                raise DataError(f'{path}: odd number of members, not a shard of videos')
            for payload, meta in zip(members[::2], members[1::2]):
                data = json.loads(tar.extractfile(meta).read())
                key, ext = payload.name.split('.', 1) if '.' in payload.name else (payload.name, '')
                if meta.name != f'{key}.json' or key != escape_key(data['path']):
                    raise DataError(f'{path}: members {payload.name} and {meta.name} are not one video')
                rows.append({'path': data['path'], 'ext': ext, 'shard': shard,
                             'offset': payload.offset_data, 'size': payload.size,
                             'meta_offset': meta.offset_data, 'meta_size': meta.size,
                             'n_frames': int(data['n_frames'])})
    except (tarfile.TarError, OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(f'{path}: not a readable shard ({e})') from None
    return rows


class ShardEntry(NamedTuple):
    """One video's row of the index; ``shard`` is the shard's file name."""
    path: str
    shard: str
    offset: int
    size: int
    meta_offset: int
    meta_size: int
    n_frames: int
    ext: str


class ShardIndex:
    """The index of a shard folder: ``ShardIndex.load(folder)`` or
    ``ShardIndex.from_bytes(index_json, index_npz)`` (fetched over HTTP or S3).
    Lookups bisect the sorted path array (np.searchsorted): no Python object per
    video, so that an index of 650,000 videos loads in a fraction of a second."""

    def __init__(self, info: dict, columns: dict, source: str = 'index', digest: str = ''):
        self.source, self.digest = source, digest  # digest: of index.json, which lists every shard's sha256
        if not isinstance(info, dict) or info.get('format') != FORMAT:
            raise DataError(f'{source}: not a video-shards index (format {FORMAT!r} expected)')
        if info.get('version') != VERSION:
            raise DataError(f'{source}: index version {info.get("version")!r}, this code reads {VERSION}')
        missing = [name for name in COLUMNS if name not in columns]
        if missing:
            raise DataError(f'{source}: index.npz lacks {", ".join(missing)}')
        self.file_type: str = info['file_type']
        self.shards: list[dict] = list(info['shards'])
        self.shard_names: tuple[str, ...] = tuple(s['name'] for s in self.shards)
        self.shard_sha256: dict[str, str] = {s['name']: s.get('sha256', '') for s in self.shards}
        self.columns = {name: np.asarray(columns[name]) for name in COLUMNS}
        self.paths = self.columns['path']
        n = len(self.paths)
        if any(len(a) != n for a in self.columns.values()) or n != info.get('n_videos'):
            raise DataError(f'{source}: index.json and index.npz disagree on the number of videos')
        if n > 1 and not bool(np.all(self.paths[1:] > self.paths[:-1])):
            raise DataError(f'{source}: index paths are not sorted')

    @classmethod
    def from_bytes(cls, index_json: bytes, index_npz: bytes, source: str = 'index') -> ShardIndex:
        try:
            info = json.loads(index_json)
            with np.load(io.BytesIO(index_npz), allow_pickle=False) as npz:
                columns = {name: npz[name] for name in npz.files}
        except (ValueError, OSError, zipfile.BadZipFile) as e:
            raise DataError(f'{source}: unreadable index ({e})') from None
        return cls(info, columns, source, hashlib.sha256(index_json).hexdigest()[:16])

    @classmethod
    def load(cls, folder) -> ShardIndex:
        folder = Path(folder)
        try:
            json_bytes = (folder / INDEX_JSON).read_bytes()
            npz_bytes = (folder / INDEX_NPZ).read_bytes()
        except OSError as e:
            raise DataError(f'{folder}: no shard index ({e.strerror}: {e.filename}); write one with '
                            f'util_scripts.make_shards') from None
        return cls.from_bytes(json_bytes, npz_bytes, str(folder))

    def __len__(self) -> int:
        return len(self.paths)

    def __contains__(self, rel: str) -> bool:
        return self.find(rel) is not None

    def _row(self, rel: str) -> int | None:
        i = int(np.searchsorted(self.paths, rel))
        return i if i < len(self.paths) and self.paths[i] == rel else None

    def find(self, rel: str) -> int | None:
        """Row number of REL, None when the index has no such video.  A record path with
        a file's extension (an annotation entry's own "video_path": x/y.mp4) is found
        under REL without it, as make_shards stored it."""
        i = self._row(rel)
        stem, ext = os.path.splitext(rel)
        if i is None and ext.lower() in HDF5_SUFFIXES + VIDEO_EXTENSIONS:
            i = self._row(stem)
        return i

    def rows(self, rels) -> np.ndarray:
        """find() of many RELs at once (one searchsorted): row numbers, -1 where absent."""
        rels = np.asarray(rels, dtype=str)
        at = np.minimum(np.searchsorted(self.paths, rels), max(len(self.paths) - 1, 0))
        rows = np.where(self.paths[at] == rels, at, -1) if len(self.paths) else np.full(len(rels), -1)
        for i in np.flatnonzero(rows < 0):  # the few with a file's extension, or absent
            row = self.find(str(rels[i]))
            rows[i] = -1 if row is None else row
        return rows

    def n_frames(self, rel: str) -> int | None:
        """The frame count make_shards stored for REL, None when it is not indexed."""
        i = self.find(rel)
        return None if i is None else int(self.columns['n_frames'][i])

    def entry(self, rel: str) -> ShardEntry:
        i = self.find(rel)
        if i is None:
            raise KeyError(rel)
        c = self.columns
        return ShardEntry(str(self.paths[i]), self.shard_names[int(c['shard'][i])], int(c['offset'][i]),
                          int(c['size'][i]), int(c['meta_offset'][i]), int(c['meta_size'][i]),
                          int(c['n_frames'][i]), str(c['ext'][i]))

    def lookup(self, rel: str) -> tuple[str, int, int]:
        """(shard name, offset, size) of REL's payload; KeyError when absent."""
        e = self.entry(rel)
        return e.shard, e.offset, e.size
