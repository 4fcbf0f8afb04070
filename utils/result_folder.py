"""One run per result folder: an exclusive lock on <result_path>/.lock.

The lock is a POSIX record lock (lockf) on the file: the kernel drops it when
the owning process exits for any reason (kill -9 included), so a lock left
behind by a dead run is never in the way; unlike flock it is not inherited by
forked DataLoader workers, which may outlive a killed run by a few seconds.
The file's text names the owner (pid, host, start time, command) for the
message shown to a second run.
"""
import errno
import fcntl
import json
import os
import shutil
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from utils.atomic import write_atomic
from utils.errors import ResultFolderBusy, ResultFolderError
from utils.urls import redact_argv

LOCK_NAME = '.lock'


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
    command = redact_argv(sys.argv)  # shown to the next run: no URL credential, no storage option value
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


LAST_CHECKPOINT = 'last_checkpoint.json'

# Files a run writes into its result folder; --overwrite deletes exactly these.
RUN_FILES = ('opts.json', 'train.log', 'train_batch.log', 'val.log', 'train.json', 'val.json',
             'test.json', 'best.pth', 'best.json', 'curves.png', LAST_CHECKPOINT)
# What a line of training set aside keeps of the folder's logs (copies: the
# resumed run truncates them) besides its checkpoints and best.pth.
ABANDONED_LOGS = ('train.log', 'train_batch.log', 'val.log', 'opts.json')


def check_writable(result_path):
    """A folder that refuses new files (read-only, no permission) is found at
    start, not when the first checkpoint is due."""
    probe = Path(result_path) / f'.write_test.{os.getpid()}'
    try:
        probe.write_bytes(b'')
        probe.unlink()
    except OSError as e:
        raise ResultFolderError(f'cannot create files in result folder {result_path} '
                                f'({e.strerror}): choose a writable --result_path') from None


def refuse_or_clear_other_run(result_path, overwrite):
    """A fresh training into a folder holding another run's checkpoints would
    overwrite some of them and leave the rest for a later --auto_resume to
    pick: refuse, unless --overwrite, which deletes that run's files."""
    from utils.checkpoint import list_checkpoints
    result_path = Path(result_path)
    checkpoints = [p for _, p in list_checkpoints(result_path)]
    if not checkpoints:
        return []
    if not overwrite:
        names = ', '.join(p.name for p in checkpoints[:3]) + \
            (f' ... {checkpoints[-1].name}' if len(checkpoints) > 3 else '')
        raise ResultFolderError(
            f'result folder {result_path} holds checkpoints of another run ({names}): resume '
            f'it with --auto_resume (or --resume_path), choose another --result_path, or add '
            f'--overwrite to delete that run\'s checkpoints and logs and start clean')
    removed = checkpoints + [result_path / n for n in RUN_FILES if (result_path / n).exists()]
    removed += sorted(result_path.glob('events.out.tfevents.*'))
    removed += sorted(result_path.glob('train_steps/events.out.tfevents.*'))  # utils/logs.py STEP_RUN
    for p in removed:
        p.unlink()
    return [p.name for p in removed]


def claim_result_folder(result_path, lock):
    """Rank 0 creates the folder and takes its lock: one run per folder. Then
    it checks that files can be created there and deletes the temporaries of
    checkpoint writes a killed run left."""
    from utils.checkpoint import remove_stale_temporaries
    try:
        result_path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ResultFolderError(f'cannot create result folder {result_path} ({e.strerror}): '
                                f'choose another --result_path') from None
    lock.acquire()
    check_writable(result_path)
    remove_stale_temporaries(result_path)


def record_last_checkpoint(result_path, checkpoint_path):
    """Names the checkpoint just written as the run's last (after it is in
    place; written atomically): --auto_resume takes it, not a higher-numbered
    checkpoint another line of training left."""
    write_atomic(Path(result_path) / LAST_CHECKPOINT,
                 json.dumps({'checkpoint': Path(checkpoint_path).name}) + '\n')


def recorded_last_checkpoint(result_path):
    """The checkpoint last_checkpoint.json names, when it is still there; None
    without a record (a folder of an earlier version) or when it is gone."""
    from utils.retention import checkpoint_progress
    try:
        name = json.loads((Path(result_path) / LAST_CHECKPOINT).read_text())['checkpoint']
    except (OSError, ValueError, KeyError, TypeError):
        return None
    path = Path(result_path) / str(name)
    return path if checkpoint_progress(path.name) is not None and path.is_file() else None


def set_aside_later_checkpoints(result_path, progress, now=None):
    """A run resumed from a checkpoint of `progress` ((completed epochs, batches
    of the next), utils.retention.checkpoint_progress) into a folder holding
    later checkpoints abandons the line of training that wrote them: they move
    into abandoned_<time>/, with best.pth/best.json when they are of a later
    epoch and copies of the logs as they were (the run truncates them), so
    neither --auto_resume nor --keep_last mixes the two lines. Returns (the
    folder, the names moved), or (None, []) when nothing is later."""
    from utils.retention import BEST, checkpoint_progress, checkpoints_newest_first
    result_path = Path(result_path)
    later = [p for p in checkpoints_newest_first(result_path) if checkpoint_progress(p.name) > progress]
    if not later:
        return None, []
    stamp = time.strftime('%Y%m%d-%H%M%S', time.localtime(now))
    folder, n = result_path / f'abandoned_{stamp}', 1
    while folder.exists():  # two resumes within a second
        n += 1
        folder = result_path / f'abandoned_{stamp}_{n}'
    folder.mkdir()
    moved = list(reversed(later))  # oldest first
    try:
        best_epoch = json.loads((result_path / 'best.json').read_text())['epoch']
    except (OSError, ValueError, KeyError, TypeError):
        best_epoch = None
    if best_epoch is not None and best_epoch > progress[0] and (result_path / BEST).is_file():
        moved += [result_path / BEST, result_path / 'best.json']
    for path in moved:
        os.replace(path, folder / path.name)
    for name in ABANDONED_LOGS:
        if (result_path / name).is_file():
            shutil.copy2(result_path / name, folder / name)
    return folder, [p.name for p in moved]


@contextmanager
def result_folder(result_path, claim):
    """The run's result folder for the length of a ``with``: ``claim(lock)`` takes
    it (rank 0: claim_result_folder), the lock is released at the end, and a run
    that fails in a folder it created, before a log or checkpoint is in it, leaves
    no folder behind (remove_unused)."""
    lock = ResultFolderLock(result_path)
    created = not Path(result_path).exists()
    try:
        claim(lock)
        yield
    except BaseException:
        if created and lock.fd is not None:  # this process created and holds it
            remove_unused(result_path)
        raise
    finally:
        lock.release()


def remove_unused(result_path) -> bool:
    """Removes a result folder a run created and then failed in before writing
    a log or a checkpoint (a missing video, a bad option found at start): no empty
    folder, lock or data_index/ is left behind. True if removed."""
    result_path = Path(result_path)
    if any((result_path / name).exists() for name in ('train.log', 'val.log')) or \
            any(result_path.glob('*.pth')):
        return False
    shutil.rmtree(result_path, ignore_errors=True)
    return True
