"""Starting the processes of a run and ending them: one process, main.py's
own spawner (--distributed without a launcher: one process per GPU), or the
processes torchrun or srun started. Every failure ends in one line where it
is not a bug of this program (a user error: exit 2; a dead peer or loader
worker: utils/failures.py, EXIT_FAILED), a stop signal in a checkpoint and
EXIT_PREEMPTED. log and on_main_rank are the stages' rank-0 helpers.
"""
import os
import signal
import sys
import traceback

import torch
import torch.multiprocessing as mp

from utils import distributed as du
from utils.errors import USER_ERRORS, OptionError
from utils.failures import EXIT_FAILED, describe_failure
from utils.preemption import EXIT_PREEMPTED, Preempted, requeue_slurm_job
from utils.threads import set_threads


def log(ctx, *args):
    """print on rank 0 only."""
    if ctx.is_main:
        print(*args, flush=True)


def on_main_rank(ctx, fn):
    """fn() on rank 0 only; an error there stops every rank (the others would
    otherwise wait for rank 0 in their next collective)."""
    error = None
    if ctx.is_main:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - re-raised below, after telling the others
            error = e
    message = du.broadcast_object(None if error is None else str(error), ctx)
    if error is not None:
        raise error
    if message is not None:
        raise OptionError(f'rank 0 stopped: {message}')


def launch(opt, run):
    """run(opt, ctx) in every process the options ask for; a user error ends
    in one line and exit status 2."""
    try:
        if opt.distributed and not du.launched_by_a_launcher():
            n = torch.cuda.device_count() if not opt.no_cuda else 0
            n = max(1, n)
            mp.spawn(worker, args=(opt, n, run), nprocs=n)
        else:
            worker(None, opt, 1, run)
    except USER_ERRORS as e:
        release_frames(e)
        report(f'error: {e}')
        sys.exit(2)
    except mp.ProcessExitedException as e:  # the process said why, unless a signal killed it
        if e.signal_name:
            report(f'error: process {e.error_index} (pid {e.error_pid}) of the job was killed by '
                   f'{e.signal_name}' + (', most likely by the kernel\'s out-of-memory killer'
                                         if e.signal_name == 'SIGKILL' else ''))
        sys.exit(e.exit_code if e.exit_code > 0 else EXIT_FAILED)
    except RuntimeError as e:  # a dead loader worker (one process)
        line = describe_failure(e, opt)
        if line is None:
            raise
        release_frames(e)
        report(line)
        sys.exit(EXIT_FAILED)


def worker(local_rank, opt, ranks_per_node, run):
    """One process: sets up its device and process group, runs, and ends."""
    if local_rank is None:
        ctx = du.init_distributed(opt)
    else:  # spawned by launch() itself
        rank = opt.node_rank * ranks_per_node + local_rank
        world = max(1, opt.world_size) * ranks_per_node
        ctx = du.init_distributed(opt, local_rank=local_rank, rank=rank, world_size=world)
    local_ranks = ranks_per_node if local_rank is not None else int(os.environ.get('LOCAL_WORLD_SIZE', '1'))
    threads, how = set_threads(opt.threads, local_ranks, opt.n_threads)
    log(ctx, f'{threads} intra-op thread{"s" if threads > 1 else ""} a process ({how}; --threads to change)')
    try:
        run(opt, ctx)
    except Preempted as stopped:
        log(ctx, str(stopped))
        if opt.requeue and ctx.is_main:
            log(ctx, requeue_slurm_job())
        du.cleanup(ctx)  # every rank stopped at the same step: a clean teardown
        sys.exit(EXIT_PREEMPTED)
    except BaseException as error:
        if not ctx.distributed:
            raise
        # destroy_process_group() after a failure can block (NCCL: the peers wait
        # in their next collective, or the group is broken): exit without it,
        # and the launcher ends the other ranks.
        exit_now(error, ctx, opt)
    du.cleanup(ctx)


def exit_now(error, ctx, opt):
    """Reports the error as launch() would, then ends the process at once."""
    line = describe_failure(error, opt, ctx.rank)
    code = EXIT_FAILED
    if line is not None:
        report(line)
    elif isinstance(error, USER_ERRORS):
        report(f'error: {error}')
        code = 2
    elif isinstance(error, SystemExit):
        code = error.code if isinstance(error.code, int) else 1
    else:
        traceback.print_exception(error)
        code = 130 if isinstance(error, KeyboardInterrupt) else 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def release_frames(error):
    """Drops the locals of the finished frames error's traceback holds: the run's
    DataLoader iterators among them shut their workers down now, while their
    queues still work. Left to the garbage collector (a caller in this process
    keeps the error), each worker waits out its 5 s status-check timeout."""
    traceback.clear_frames(error.__traceback__)


def report(line):
    """The one line of a failure on stderr. Loader workers that die from now on
    (torchrun ends the process group of a failed job) are no news: their
    SIGCHLD no longer raises a second error while this one is reported."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    print(line, file=sys.stderr, flush=True)
