"""--dist_timeout: a frozen rank makes the others' next collective fail."""
import dataclasses
import datetime
import time

import pytest
import torch
import torch.distributed as dist

from tests.dist_helpers import run_ranks
from utils.distributed import PG_TIMEOUT, set_collective_timeout

pytestmark = pytest.mark.slow  # every test freezes one of 2 processes and waits out a timeout


def late_all_reduce(ctx, out_dir):
    set_collective_timeout(ctx, 2)
    if ctx.rank == 1:
        time.sleep(8)  # frozen for longer than the timeout, then back
    try:
        torch.distributed.all_reduce(torch.ones(1))
        result = 'completed'
    except RuntimeError as e:
        result = f'failed: {type(e).__name__}'
    (out_dir / f'rank{ctx.rank}').write_text(result)


def test_collective_fails_after_the_timeout_instead_of_waiting(tmp_path):
    run_ranks(late_all_reduce, 2, tmp_path)
    # Without the 2 s timeout rank 0 would simply wait the 8 s and complete.
    assert (tmp_path / 'rank0').read_text().startswith('failed')


def group_timeout(group):
    return group._get_backend(torch.device('cpu')).options._timeout


def late_all_reduce_on_the_cpu_group(ctx, out_dir):
    # The shape of an NCCL job: a default group and the gloo group that
    # init_distributed adds for host collectives (both gloo here).
    cpu_group = dist.new_group(backend='gloo', timeout=PG_TIMEOUT)
    ctx = dataclasses.replace(ctx, cpu_group=cpu_group)
    set_collective_timeout(ctx, 2)
    timeouts = [group_timeout(dist.group.WORLD), group_timeout(cpu_group)]
    if ctx.rank == 1:
        time.sleep(6)  # frozen: rank 0 waits in a host collective (the stop flag, say)
    try:
        dist.all_reduce(torch.ones(1), group=cpu_group)
        result = 'completed'
    except RuntimeError as e:
        result = f'failed: {type(e).__name__}'
    (out_dir / f'rank{ctx.rank}').write_text(f'{timeouts[0]} {timeouts[1]} {result}')


def test_the_timeout_reaches_the_cpu_group_too(tmp_path):
    run_ranks(late_all_reduce_on_the_cpu_group, 2, tmp_path)
    default, cpu, result = (tmp_path / 'rank0').read_text().split(' ', 2)
    two_seconds = str(datetime.timedelta(seconds=2))
    assert (default, cpu) == (two_seconds, two_seconds)
    assert result.startswith('failed')  # after 2 s, not the 6 s of rank 1's freeze


def frozen_peer_at_the_stop_flag(ctx, out_dir):
    from types import SimpleNamespace

    from utils.failures import describe_failure
    from utils.preemption import agree_to_stop
    set_collective_timeout(ctx, 2)
    if ctx.rank == 1:
        time.sleep(6)
        return
    try:
        agree_to_stop(False, ctx)
        line = 'completed'
    except RuntimeError as e:
        opt = SimpleNamespace(dist_timeout=2, n_threads=1, batch_size=8, sample_size=32)
        line = describe_failure(e, opt, ctx.rank)
    (out_dir / 'line').write_text(line)


def test_a_frozen_peer_is_reported_in_one_line_naming_the_collective(tmp_path):
    run_ranks(frozen_peer_at_the_stop_flag, 2, tmp_path)
    line = (tmp_path / 'line').read_text()
    assert line.startswith('error: rank 0: the collective all_reduce (utils/preemption.py:')
    assert 'agree_to_stop) failed: timed out (--dist_timeout 2 s): another process of the ' \
           'job froze' in line, line
