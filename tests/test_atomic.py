"""utils/atomic.py: every file the project writes whole goes through one helper: a
temporary of a random name beside it, fsynced, renamed onto the name; a failed
write leaves the old file and no temporary."""
import os
import re

import pytest

from datasets import frame_check
from utils.atomic import atomic_file, atomic_path, temporary_pattern, write_atomic


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / 'record.json'
    write_atomic(path, '{"old": 1}\n')
    with pytest.raises(RuntimeError), atomic_file(path, 'w') as f:
        f.write('{"new": ')
        raise RuntimeError('killed mid-write')
    assert path.read_text() == '{"old": 1}\n'
    assert os.listdir(tmp_path) == ['record.json']


def test_temporaries_are_random_beside_the_file_and_match_the_pattern(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, 'fsync', lambda fd: synced.append(fd) or real_fsync(fd))
    path, seen = tmp_path / 'sub' / 'save_3.pth', []
    for _ in range(2):
        with atomic_path(path) as tmp:
            seen.append(tmp.name)
            tmp.write_bytes(b'weights')
    assert path.read_bytes() == b'weights' and os.listdir(path.parent) == ['save_3.pth']
    assert seen[0] != seen[1] and not any(str(os.getpid()) in name for name in seen)
    assert all(temporary_pattern(re.escape('save_3.pth')).match(name) for name in seen), seen
    assert len(synced) >= 2  # the file's data before each rename
    with atomic_path(tmp_path / 'model.pt2', keep_suffix=True) as tmp:
        assert tmp.suffix == '.pt2'


def test_write_atomic_takes_bytes_and_text(tmp_path):
    write_atomic(tmp_path / 'a.bin', b'\x00\xff')
    write_atomic(tmp_path / 'b.txt', 'é\n')
    assert (tmp_path / 'a.bin').read_bytes() == b'\x00\xff'
    assert (tmp_path / 'b.txt').read_bytes() == 'é\n'.encode()


def test_the_frame_check_cache_is_written_beside_another_process_of_the_same_pid(tmp_path):
    """Ranks of two nodes (or two containers) often share a PID: the cache's
    temporary was named by it, so a second writer's temporary (here held as a
    folder) made the write fail and the check ran again at every start."""
    cache = tmp_path / 'frame_check.json'
    (tmp_path / f'.{cache.name}.{os.getpid()}.tmp').mkdir()
    frame_check._write_cache(cache, 12, 'all')
    assert cache.exists() and '"videos": 12' in cache.read_text()
