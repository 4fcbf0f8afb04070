"""Stop signals: recorded by the handler, agreed by every rank, SLURM requeue."""
import os
import signal
import subprocess

import pytest

from tests.dist_helpers import run_ranks
from utils.distributed import DistContext
from utils.preemption import StopRequest, agree_to_stop, requeue_slurm_job


@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1])
def test_stop_signal_is_recorded_not_raised(sig):
    previous = signal.getsignal(sig)
    with StopRequest() as stop:
        assert not stop.requested
        os.kill(os.getpid(), sig)  # delivered before kill() returns (same thread)
        assert stop.requested and stop.signal_name == sig.name
        os.kill(os.getpid(), signal.SIGTERM)  # a later signal does not replace the first
        assert stop.signal_name == sig.name
    assert signal.getsignal(sig) == previous


def test_second_ctrl_c_interrupts_at_once():
    with StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)


def _agree_worker(ctx, requesting_rank, out_dir):
    decided = agree_to_stop(ctx.rank == requesting_rank, ctx)
    (out_dir / f'{ctx.rank}').write_text(str(decided))


@pytest.mark.parametrize('requesting_rank', [None, 0, 1])
def test_ranks_agree_to_stop_when_any_rank_was_signalled(tmp_path, requesting_rank):
    run_ranks(_agree_worker, 2, requesting_rank, tmp_path)
    expected = str(requesting_rank is not None)
    assert [(tmp_path / f'{r}').read_text() for r in (0, 1)] == [expected, expected]


def test_single_process_needs_no_collective():
    assert agree_to_stop(True, DistContext()) is True
    assert agree_to_stop(False, DistContext()) is False


def test_requeue_calls_scontrol_with_the_job_id():
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, '', '')

    assert requeue_slurm_job({'SLURM_JOB_ID': '4242'}, fake_run) == 'requeued SLURM job 4242'
    assert calls == [['scontrol', 'requeue', '4242']]


def test_requeue_reports_failures_in_one_line():
    def refused(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 1, '', 'Requested operation is disabled\n')

    def missing(cmd, **kw):
        raise FileNotFoundError(2, 'No such file or directory', 'scontrol')

    assert 'not a SLURM job' in requeue_slurm_job({}, refused)
    assert requeue_slurm_job({'SLURM_JOB_ID': '7'}, refused) == \
        '--requeue: scontrol requeue 7 failed: Requested operation is disabled'
    assert 'scontrol requeue 7 failed' in requeue_slurm_job({'SLURM_JOB_ID': '7'}, missing)
