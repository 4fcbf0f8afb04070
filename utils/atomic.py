"""Whole files written atomically: every file the project writes whole (checkpoints,
annotations, indexes, caches, records, pictures, exported models, shards) goes
through a temporary file beside it, flushed to disk and renamed onto the name,
so a reader sees the old file or the new one, never half of one, and a killed
write leaves the old file in place.

The temporary is '.<name>.<random>.tmp' in the same folder (tempfile's random
part, never the PID: ranks of two nodes, or containers, share PIDs and would
write one temporary), and is removed when the write fails. A killed write's
temporary stays; temporary_pattern(name) finds those of one kind of file."""
import contextlib
import os
import re
import tempfile
from pathlib import Path

TEMPORARY_SUFFIX = '.tmp'


def temporary_pattern(name_regex):
    """A regex matching the temporaries written for files whose names match
    name_regex (a regex without anchors): '.' + name + random part + '.tmp'."""
    return re.compile(rf'^\.{name_regex}\.[A-Za-z0-9_]+{re.escape(TEMPORARY_SUFFIX)}$')


def _fsync_folder(folder):
    """The rename itself on disk; best effort (some filesystems refuse a folder's fsync)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def _replacing(path, suffix):
    """(fd, path) of a new temporary beside ``path``, renamed onto it once the
    block ends without error, removed on an error."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f'.{path.name}.', suffix=suffix, dir=path.parent)
    try:
        yield fd, Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_folder(path.parent)


@contextlib.contextmanager
def atomic_path(path, keep_suffix=False):
    """A temporary path beside ``path`` for a writer that takes a file name
    (h5py, torch.export, onnxruntime, savefig): once the block ends without
    error it is flushed to disk and renamed onto ``path``; on an error it is
    removed. keep_suffix: the temporary ends in path's suffix too, for writers
    that choose the format by it ('.<name>.<random>.tmp.pt2')."""
    with _replacing(path, TEMPORARY_SUFFIX + (Path(path).suffix if keep_suffix else '')) \
            as (fd, tmp):
        os.close(fd)
        yield tmp
        with open(tmp, 'rb') as f:
            os.fsync(f.fileno())


@contextlib.contextmanager
def atomic_file(path, mode='wb', **open_args):
    """A file object (os.fdopen(…, mode)) whose contents replace ``path`` once
    the block ends without error (text is UTF-8 unless open_args say otherwise)."""
    if 'b' not in mode:
        open_args.setdefault('encoding', 'utf-8')
    with _replacing(path, TEMPORARY_SUFFIX) as (fd, _):
        try:
            f = os.fdopen(fd, mode, **open_args)
        except BaseException:
            os.close(fd)
            raise
        with f:
            yield f
            f.flush()
            os.fsync(f.fileno())


def write_atomic(path, data):
    """Replaces ``path`` with ``data`` (bytes, or str written as UTF-8)."""
    with atomic_file(path, 'wb' if isinstance(data, bytes) else 'w') as f:
        f.write(data)
