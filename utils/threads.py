"""How many intra-op threads torch gets in a process of ours: the CPUs this
process may really use (its affinity mask and its cgroup's CPU quota, as SLURM's
--cpus-per-task and a container's CPU limit set them), shared among the ranks of
this node, less one core for each process or thread that decodes beside it.

torch's default is one thread per core the machine has. Where some of those
cores are taken (data workers, other jobs, a quota) its thread pool waits on
the slowest thread at every operation: measured here, the demo trained 4x slower
at load 3-13 with the default than with one thread (bench/threads.py gives the
table, docs/benchmarks.md keeps it). Standard library only."""
import math
import os
from pathlib import Path

CGROUP = Path('/sys/fs/cgroup')


def affinity_cpus() -> int:
    """The CPUs this process may be scheduled on (taskset, SLURM's binding)."""
    if hasattr(os, 'sched_getaffinity'):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cgroup_cpu_quota(root: Path = CGROUP) -> float | None:
    """CPUs' worth of time the cgroup may use (cgroup v2 cpu.max, or v1
    cfs_quota_us / cfs_period_us), None where no quota is set or readable."""
    try:
        quota, period = (root / 'cpu.max').read_text().split()[:2]
        return None if quota == 'max' else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / 'cpu' / 'cpu.cfs_quota_us').read_text())
        period = int((root / 'cpu' / 'cpu.cfs_period_us').read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def usable_cpus(root: Path = CGROUP) -> int:
    """Whole CPUs this process may use: its affinity mask, capped by the
    cgroup quota (rounded up: a quota of 1.5 CPUs lets two threads run)."""
    cpus = affinity_cpus()
    quota = cgroup_cpu_quota(root)
    return max(1, min(cpus, math.ceil(quota))) if quota else cpus


def default_threads(local_ranks: int = 1, decoders: int = 0, cpus: int | None = None) -> int:
    """Intra-op threads for one of ``local_ranks`` processes on this node, each
    with ``decoders`` processes or threads of its own that decode clips beside
    it (its DataLoader workers; a live stream's reader): each of those keeps a
    core, and the process computes on what is left, at least one thread."""
    cpus = usable_cpus() if cpus is None else cpus
    share = cpus // max(1, local_ranks)
    return max(1, share - max(0, decoders))


def set_threads(threads: int | None, local_ranks: int = 1, decoders: int = 0) -> tuple[int, str]:
    """Sets torch's intra-op threads to ``threads`` (None or 0: default_threads)
    and returns (threads, a phrase saying how they were chosen) for the run's log.
    OMP_NUM_THREADS, where set, is the user's choice and wins over the default."""
    import torch
    if threads:
        how = '--threads'
    elif os.environ.get('OMP_NUM_THREADS', '').isdigit() and int(os.environ['OMP_NUM_THREADS']) > 0:
        threads, how = int(os.environ['OMP_NUM_THREADS']), 'OMP_NUM_THREADS'
    else:
        cpus = usable_cpus()
        threads = default_threads(local_ranks, decoders, cpus)
        how = (f'{cpus} usable CPUs' + (f' / {local_ranks} ranks' if local_ranks > 1 else '')
               + (f' - {decoders} decoding' if decoders else ''))
    torch.set_num_threads(threads)
    return threads, how
