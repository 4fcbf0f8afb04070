"""One run per result folder: an exclusive lock on <result_path>/.lock.

The lock is a POSIX record lock (lockf) on the file: the kernel drops it when
the owning process exits for any reason (kill -9 included), so a lock left
behind by a dead run is never in the way; unlike flock it is not inherited by
forked DataLoader workers, which may outlive a killed run by a few seconds. The file's text names the owner (pid, host, start
time, command) for the message shown to a second run.
"""
import errno
import fcntl
import os
import socket
import sys
import time
from pathlib import Path

LOCK_NAME = '.lock'


class ResultFolderError(RuntimeError):
    """The result folder cannot be used; the message says why and what to do."""


class ResultFolderBusy(ResultFolderError):
    """Another live process holds the result folder; the message names it."""


class ResultFolderLock:
    """Holds the lock from acquire() to release() (or the end of the process)."""

    def __init__(self, result_path):
        self.path = Path(result_path) / LOCK_NAME
        self.fd = None

    def acquire(self):
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ResultFolderError(f'cannot create {self.path} ({e.strerror}): --result_path '
                                    f'must be a folder this user can write to') from None
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            owner = _read_owner(fd)
            os.close(fd)
            if e.errno not in (errno.EACCES, errno.EAGAIN):
                raise ResultFolderError(f'cannot lock {self.path} ({e.strerror}): put '
                                        f'--result_path on a file system with locks') from None
            raise ResultFolderBusy(
                f'result folder {self.path.parent} is in use by another run ({owner}): wait '
                f'for it to finish or stop it, or choose another --result_path') from None
        os.ftruncate(fd, 0)
        os.write(fd, _owner_text().encode())
        self.fd = fd
        return self

    def release(self):
        if self.fd is not None:
            os.ftruncate(self.fd, 0)  # the next reader sees no owner
            fcntl.lockf(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


def _owner_text():
    command = ' '.join(sys.argv)
    if len(command) > 200:
        command = command[:197] + '...'
    started = time.strftime('%Y-%m-%d %H:%M:%S', time.localtime())
    return f'pid {os.getpid()} on {socket.gethostname()}, started {started}: {command}\n'


def _read_owner(fd):
    try:
        text = os.pread(fd, 4096, 0).decode(errors='replace').strip()
    except OSError:
        text = ''
    return text or 'owner unknown: it may still be starting'
