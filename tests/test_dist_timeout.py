"""--dist_timeout: a frozen rank makes the others' next collective fail; the
gather at the end of inference waits for ranks that are still working."""
import dataclasses
import datetime
import json
import os
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


class SlowLoader:
    """An inference loader (as dataset.make_inference_loader's DeviceLoader
    yields: clips, video indices, segments) over one video per rank, which
    sleeps `delay` seconds first (a rank on slow storage); with `dies`, its
    process then ends without a word (exit 0: mp.spawn leaves the others running)."""

    def __init__(self, rank, delay, dies=False):
        from types import SimpleNamespace
        self.rank, self.delay, self.dies = rank, delay, dies
        self.dataset = SimpleNamespace(records=[SimpleNamespace(video_id=f'video_{r}') for r in range(2)],
                                       spatial_transform=None)

    def __iter__(self):
        time.sleep(self.delay)
        if self.dies:
            os._exit(0)
        yield torch.ones(1, 3, 2, 4, 4), torch.tensor([self.rank]), [torch.tensor([1]), torch.tensor([9])]


def inference_with_a_slow_rank(ctx, out_dir, delay, dies=False):
    from types import SimpleNamespace

    from inference import run_inference
    set_collective_timeout(ctx, 2)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(96, 3))
    config = SimpleNamespace(amp=False, amp_dtype=None, progress_bar=False)
    t0 = time.monotonic()
    try:
        loader = SlowLoader(ctx.rank, delay, dies) if ctx.rank == 1 else SlowLoader(0, 0)
        run_inference(loader, model, ['a', 'b', 'c'], ctx, config, out_dir / 'test.json')
        result = 'completed'
    except RuntimeError as e:
        result = f'failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}'
    (out_dir / f'rank{ctx.rank}').write_text(f'{time.monotonic() - t0:.1f} {result}')


def test_the_end_of_inference_waits_for_a_rank_slower_than_the_timeout(tmp_path):
    """Inference shards end far apart on uneven I/O: the gather of the scores
    waits for the last rank instead of failing after --dist_timeout (2 s
    here, rank 1 done 6 s after rank 0)."""
    run_ranks(inference_with_a_slow_rank, 2, tmp_path, 6)
    seconds, result = (tmp_path / 'rank0').read_text().split(' ', 1)
    assert result == 'completed', result
    assert float(seconds) >= 6
    written = json.loads((tmp_path / 'test.json').read_text())
    assert sorted(written['results']) == ['video_0', 'video_1'] and written['views'] == {'video_0': 1, 'video_1': 1}


def test_a_rank_that_died_during_inference_fails_the_gather_at_once(tmp_path):
    """The long wait is for ranks still working: one that died breaks its
    connection, and rank 0 fails within seconds, not after the long wait."""
    run_ranks(inference_with_a_slow_rank, 2, tmp_path, 1, True)
    seconds, result = (tmp_path / 'rank0').read_text().split(' ', 1)
    assert result.startswith('failed') and float(seconds) < 30, (seconds, result)


def test_timeouts_are_set_where_torch_has_no_public_set_timeout(monkeypatch):
    """requirements.txt admits torch 2.6, whose dist has no set_timeout: its private name serves."""
    import datetime

    from utils import distributed as du
    calls = []
    monkeypatch.delattr(du.dist, 'set_timeout', raising=False)
    monkeypatch.setattr(du.dist.distributed_c10d, '_set_pg_timeout', lambda t, g=None: calls.append((t, g)))
    du._set_timeout(datetime.timedelta(seconds=5), 'cpu group')
    assert calls == [(datetime.timedelta(seconds=5), 'cpu group')]
