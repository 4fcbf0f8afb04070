"""One line for the failures that are not bugs of this program: another process
of the job died or froze (a collective failed), or a DataLoader worker was
killed (most often by the kernel's out-of-memory killer).

Both end the process with EXIT_FAILED: torchrun --max-restarts restarts the
job on any non-zero status, and --auto_resume continues it from the last
checkpoint. A failure is often a chain: torchrun ends the surviving ranks'
process groups after a peer died, so their loader workers die by SIGTERM
while the failed collective is being unwound. The earliest failure of the
chain is the one reported.
"""
import re
import signal
import traceback
from pathlib import Path

import torch.distributed as dist

EXIT_FAILED = 1
ROOT = Path(__file__).resolve().parents[1]

_WORKER_DEATH = re.compile(
    r'DataLoader worker \(pid(?:\(s\))? ([\d, ]+)\) (?:is killed by signal: ([^.]+)'
    r'|exited unexpectedly(?: with exit code (-?\d+))?)')
_SIGNAL_NAMES = {signal.strsignal(s): s.name for s in signal.Signals if signal.strsignal(s)}
_COLLECTIVE_TEXT = ('gloo', 'NCCL', 'nccl', 'Timed out', 'timed out', 'Connection closed',
                    'Connection reset')
_PEER_DIED = ('Connection reset by peer', 'Connection closed by peer', 'Broken pipe',
              'Connection refused', 'ncclRemoteError', 'remote process exiting')


def error_chain(error):
    """The error and those it was raised while handling, earliest first."""
    chain, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        chain.append(error)
        error = error.__cause__ or error.__context__
    return chain[::-1]


def is_collective_failure(error):
    if isinstance(error, (dist.DistBackendError, dist.DistNetworkError)):
        return True
    return isinstance(error, RuntimeError) and any(s in str(error) for s in _COLLECTIVE_TEXT)


def worker_death(error):
    """The regex match of a DataLoader worker's death in error's text, or None."""
    return _WORKER_DEATH.search(str(error)) if isinstance(error, RuntimeError) else None


def describe_failure(error, opt, rank=None):
    """The line for error (with its chain), or None when it is none of these
    failures. opt: the parsed options (dist_timeout, n_threads, batch_size,
    sample_size are read); rank: this process's rank in a distributed job."""
    where = f'rank {rank}: ' if rank is not None else ''
    restart = (f'--auto_resume continues from the last checkpoint (exit {EXIT_FAILED}, on which '
               f'torchrun --max-restarts restarts the job)')
    for e in error_chain(error):
        if is_collective_failure(e):
            reason, meaning = collective_reason(str(e), opt.dist_timeout)
            return (f'error: {where}{failed_collective(e)} failed: {reason}: '
                    f'{meaning}; {restart}')
        match = worker_death(e)
        if match:
            return f'error: {where}{describe_worker_death(match, opt)}; {restart}'
    return None


def collective_reason(text, dist_timeout):
    """(why the collective failed, what that says about the job)."""
    for phrase in _PEER_DIED:
        if phrase in text:
            return phrase[0].lower() + phrase[1:], 'another process of the job died'
    if re.search(r'timed out|timeout', text, re.IGNORECASE):
        return (f'timed out (--dist_timeout {dist_timeout} s)',
                'another process of the job froze, or fell that far behind')
    first = (text.strip().splitlines() or ['unknown error'])[0]
    first = re.sub(r'^\[[^\]]*\]\s*', '', first)  # gloo's "[.../pair.cc:545] " prefix
    return first[:160].rstrip('. '), 'another process of the job died or froze'


def failed_collective(error):
    """Which collective: the torch.distributed call and our line that made it,
    or DDP's collectives inside backward/forward."""
    frames = traceback.extract_tb(error.__traceback__)
    ours = [f for f in frames if _is_ours(f.filename)]
    caller = f' ({Path(ours[-1].filename).relative_to(ROOT)}:{ours[-1].lineno} ' \
             f'{ours[-1].name})' if ours else ''
    for f in frames:
        if f.filename.endswith('distributed_c10d.py') and not f.name.startswith('_') \
                and f.name != 'wrapper':
            return f'the collective {f.name}{caller}'
    if any(f.filename.endswith(('autograd/graph.py', '_tensor.py')) for f in frames):
        return f"DistributedDataParallel's gradient all-reduce in backward{caller}"
    if any(f.filename.endswith('parallel/distributed.py') for f in frames):
        return f"DistributedDataParallel's forward (its buffer broadcast){caller}"
    return f'a collective{caller}'


def _is_ours(filename):
    path = Path(filename).resolve()
    return path.is_relative_to(ROOT) and 'site-packages' not in path.parts


def describe_worker_death(match, opt):
    pids, signal_text, exit_code = match.group(1).strip(), match.group(2), match.group(3)
    who = f'DataLoader worker (pid {pids})'
    lower = (f'lower --n_threads ({opt.n_threads}), --batch_size ({opt.batch_size}) or '
             f'--sample_size ({opt.sample_size})')
    if signal_text is None:
        if exit_code is not None:
            return (f'{who} exited with status {exit_code}: rerun with --n_threads 0 '
                    f'to see its error in the main process')
        return (f'{who} died without a word, most likely killed by the kernel\'s '
                f'out-of-memory killer (dmesg names it): {lower}')
    name = _SIGNAL_NAMES.get(signal_text.strip(), signal_text.strip())
    if name == 'SIGKILL':
        return (f'{who} was killed by SIGKILL, most likely by the kernel\'s out-of-memory '
                f'killer (dmesg names it): {lower}')
    if name == 'SIGBUS':
        return (f'{who} was killed by SIGBUS: out of shared memory (/dev/shm carries the '
                f'batches from the workers): enlarge /dev/shm (docker run --shm-size 16g) '
                f'or {lower}')
    if name in ('SIGTERM', 'SIGINT', 'SIGHUP', 'SIGQUIT'):
        return f'{who} was ended by {name}, sent to the whole process group'
    return (f'{who} was killed by {name} (a crash in native code, a video decoder say): '
            f'rerun with --n_threads 0 to see where')
