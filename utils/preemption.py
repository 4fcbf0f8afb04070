"""Stopping cleanly when asked: SIGTERM (scancel, torchrun's shutdown, SLURM
preemption), SIGINT (Ctrl-C) and SIGUSR1 (SLURM's warning before the time limit,
`#SBATCH --signal=USR1@180`).

The handler only records the signal. The training loop finishes the optimizer
step it is in, the ranks agree to stop at the same step (one tiny collective
over a CPU group), a checkpoint is written, and the process exits with
EXIT_PREEMPTED. Under SLURM with --requeue, rank 0 requeues the job first.
"""
import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import threading

import torch

from utils.processes import alive

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
MAIN_PROCESS_CHECK_S = 1.0  # how often a loader worker looks for its main process
# EX_TEMPFAIL: stopped on request with the state in a checkpoint; run the same
# command again (with --auto_resume) to continue.
EXIT_PREEMPTED = 75


class Preempted(Exception):
    """Raised after the checkpoint of a stopped run is written."""

    def __init__(self, signal_name, checkpoint):
        super().__init__(f'stopped by {signal_name}: state saved in {checkpoint}; run the same '
                         f'command with --auto_resume to continue')
        self.signal_name = signal_name
        self.checkpoint = checkpoint


class StopRequest:
    """Records the first stop signal; install() in the main thread, ask
    `requested` between steps. A second SIGINT interrupts at once (a user who
    presses Ctrl-C twice does not want to wait for the step)."""

    def __init__(self):
        self.signum = None
        self._previous = {}

    def install(self):
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def restore(self):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def __enter__(self):
        return self.install()

    def __exit__(self, *exc):
        self.restore()

    def _handle(self, signum, frame):
        if signum == signal.SIGINT and self.signum == signal.SIGINT:
            raise KeyboardInterrupt
        if self.signum is None:
            self.signum = signum

    @property
    def requested(self):
        return self.signum is not None

    @property
    def signal_name(self):
        return signal.Signals(self.signum).name if self.signum is not None else None


class NoStopRequest:
    """For loops run outside main.py (tests, benchmarks): never asks to stop."""
    requested = False
    signal_name = None


def shield_loader_worker(worker_id=None):
    """worker_init_fn of the DataLoaders. A stop signal sent to the whole process
    group (torchrun ending a job, Ctrl-C in a terminal) reaches the loader
    workers too; they died of it, and the main process then failed with
    "DataLoader worker is killed by signal: Terminated" instead of finishing its
    step and writing its checkpoint. The workers ignore SIGINT and SIGUSR1, and
    SIGTERM unless the main process sends it (it ends a stuck worker that way
    at shutdown, and multiprocessing at exit)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a pending one (stop_signals_blocked) is dropped
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGUSR1})
    # Blocked in every thread of the worker, and taken by one that can see the sender.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    threading.Thread(target=_end_with_main_process, args=(_main_process_pid(),), daemon=True,
                     name='end_with_main').start()
    sys.excepthook = loader_worker_excepthook


def loader_worker_excepthook(exc_type, exc, tb):
    """multiprocessing's resource_sharer thread hands batches' file descriptors
    to the main process and reports its errors through sys.excepthook. A main
    process killed mid-handover (a dead rank) resets that connection; its own
    death is reported where it happened, so the worker stays quiet about it."""
    if issubclass(exc_type, ConnectionError) and _raised_in_resource_sharer(tb):
        return
    sys.__excepthook__(exc_type, exc, tb)


def _raised_in_resource_sharer(tb):
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.endswith(os.path.join('multiprocessing', 'resource_sharer.py')):
            return True
        tb = tb.tb_next
    return False


@contextlib.contextmanager
def stop_signals_blocked():
    """The stop signals blocked in this thread while loader workers are forked:
    a worker inherits the mask, so a signal to the process group that comes
    before shield_loader_worker runs waits there instead of killing it; this
    process gets it when the block ends."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _main_process_pid():
    """The process that started this loader worker, as multiprocessing recorded
    it at the fork: getppid() is already someone else's when that process died
    before the worker got here."""
    parent = multiprocessing.parent_process()
    return parent.pid if parent is not None else os.getppid()


def _end_with_main_process(main):
    """The worker's end on the main process's SIGTERM, or within a second of the
    main process's death. torch's own watchdog watches getppid() from after
    worker_init_fn, every 5 s: a worker whose rank died first never ended, held
    the rank's pipe, and torchrun, which sees a rank's end when that pipe
    closes, never restarted the job."""
    while alive(main):  # a zombie counts as gone: a dead rank is reaped only after its workers end
        info = signal.sigtimedwait({signal.SIGTERM}, MAIN_PROCESS_CHECK_S)
        if info is not None and info.si_pid == main:
            break
    os._exit(0)  # as torch's own worker handler does for its parent's SIGTERM


def agree_to_stop(local_request, ctx):
    """True on every rank when any rank was asked to stop: ranks stop at the
    same step, so none waits alone in the next collective. A CPU tensor over
    ctx.cpu_group: no GPU synchronisation per step."""
    if not ctx.distributed:
        return local_request
    import torch.distributed as dist
    flag = torch.tensor([1 if local_request else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=ctx.cpu_group)
    return bool(flag.item())


def requeue_slurm_job(environ=os.environ, run=subprocess.run):
    """Puts this SLURM job back in the queue (`scontrol requeue`); returns a
    line to print. The job must have been submitted requeueable (the sbatch
    script's --requeue)."""
    job = environ.get('SLURM_JOB_ID')
    if not job:
        return '--requeue: not a SLURM job (no SLURM_JOB_ID), not requeued'
    try:
        proc = run(['scontrol', 'requeue', job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f'--requeue: scontrol requeue {job} failed: {e}'
    if proc.returncode != 0:
        return f'--requeue: scontrol requeue {job} failed: {proc.stderr.strip()}'
    return f'requeued SLURM job {job}'
