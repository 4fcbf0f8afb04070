"""Stop signals: recorded by the handler, agreed by every rank, SLURM requeue."""
import contextlib
import io
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import main
from tests.conftest import tiny_args
from utils.checkpoint import load_checkpoint
from utils.distributed import DistContext
from utils.logs import read_tsv
from utils.preemption import (
    EXIT_PREEMPTED,
    STOP_SIGNALS,
    StopRequest,
    agree_to_stop,
    requeue_slurm_job,
    shield_loader_worker,
)
from utils.processes import alive, child_pids
from utils.retention import checkpoint_name


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
@pytest.mark.slow
def test_ranks_agree_to_stop_when_any_rank_was_signalled(tmp_path, requesting_rank, rank_pool):
    rank_pool.run(_agree_worker, requesting_rank, tmp_path)
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


# --- end to end: a stopped run resumes to the uninterrupted run's weights

ROOT = Path(__file__).resolve().parents[1]


def _env(**extra):
    e = dict(os.environ, OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1', **extra)
    e['PYTHONPATH'] = str(ROOT) + os.pathsep + e.get('PYTHONPATH', '')
    for key in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'SLURM_JOB_ID'):
        e.pop(key, None)
    return e


def _weights(path):
    return load_checkpoint(path)['state_dict']


def _stop_mid_epoch(cmd, result, sig, env, epoch=1):
    """Starts cmd, sends `sig` once the first mid-epoch checkpoint of `epoch`
    exists, returns (exit code, output)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 180
    while not (result / checkpoint_name(epoch, 2)).exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[0][-3000:]
        time.sleep(0.02)
    proc.send_signal(sig)
    return proc.wait(timeout=180), proc.stdout.read()


@pytest.mark.slow
def test_sigterm_mid_epoch_then_resume_gives_the_uninterrupted_weights(tiny_synthetic, tmp_path):
    # 24 training videos in batches of 4: 6 steps an epoch. Loader workers on,
    # so the per-sample augmentation seeds are what makes the resume exact.
    common = ['--batch_size', '4', '--n_threads', '1', '--train_crop', 'random',
              '--colorjitter', '--lr_scheduler', 'cosine', '--n_epochs', '2', '--no_val']
    # Every part runs as a subprocess with one thread: bitwise equality needs the
    # same float reductions, and pytest's own process may use more threads.
    whole = tmp_path / 'whole'
    run_main = [sys.executable, str(ROOT / 'main.py')]
    subprocess.run([*run_main, *tiny_args(*tiny_synthetic, whole, *common)], cwd=ROOT, env=_env(),
                   check=True, capture_output=True)

    stopped = tmp_path / 'stopped'
    args = tiny_args(*tiny_synthetic, stopped, *common, '--checkpoint_steps', '2',
                     '--auto_resume')
    code, out = _stop_mid_epoch([*run_main, *args], stopped, signal.SIGTERM, _env())
    assert code == EXIT_PREEMPTED, out[-3000:]
    assert 'stopped by SIGTERM' in out and 'with --auto_resume to continue' in out
    saved = sorted(p.name for p in stopped.glob('save_*.pth'))
    assert not (stopped / 'save_2.pth').exists() and saved, saved
    subprocess.run([*run_main, *args], cwd=ROOT, env=_env(), check=True,
                   capture_output=True)  # the same command again
    final = _weights(stopped / 'save_2.pth')
    expected = _weights(whole / 'save_2.pth')
    assert final.keys() == expected.keys()
    assert all(torch.equal(final[k], expected[k]) for k in expected)
    # Every step ran once: the resumed epoch went on with the next unseen batch.
    steps = [(r['epoch'], r['batch']) for r in read_tsv(stopped / 'train_batch.log')]
    assert steps == [(str(e), str(b)) for e in (1, 2) for b in range(1, 7)]


RECIPE = ['--mixup_alpha', '0.4', '--cutmix_alpha', '1.0', '--ema_decay', '0.9',
          '--precise_bn', '2', '--label_smoothing', '0.1']


@pytest.mark.parametrize('recipe', [[], RECIPE], ids=['plain', 'mix_ema_precise_bn'])
@pytest.mark.slow
@pytest.mark.usefixtures('one_torch_thread', 'no_curves')
def test_a_resumed_mid_epoch_checkpoint_skips_exactly_the_batches_it_covers(tiny_synthetic,
                                                                           tmp_path, capsys, recipe):
    """Resuming from a mid-epoch checkpoint of a run ends with that run's weights
    (and EMA weights: mixup draws, EMA and precise BN resume too)."""
    common = ['--batch_size', '4', '--n_threads', '0', '--train_crop', 'random',
              '--n_epochs', '1', '--no_val', '--lr_scheduler', 'cosine', *recipe]
    whole = tmp_path / 'whole'
    main.main(tiny_args(*tiny_synthetic, whole, *common, '--checkpoint_steps', '1'))
    expected = load_checkpoint(whole / 'save_1.pth')
    ckpt = load_checkpoint(whole / checkpoint_name(1, 3))
    assert ckpt['epoch'] == 0 and ckpt['batches_done'] == 3
    resumed = tmp_path / 'resumed'
    main.main(tiny_args(*tiny_synthetic, resumed, *common, '--resume_path',
                        str(whole / checkpoint_name(1, 3))))
    final = load_checkpoint(resumed / 'save_1.pth')
    for key in ['state_dict'] + (['ema_state_dict'] if recipe else []):
        assert all(torch.equal(final[key][k], expected[key][k]) for k in expected[key]), key
    # The resumed epoch's row covers the whole epoch, the 3 batches before the checkpoint too.
    rows = [read_tsv(d / 'train.log')[0] for d in (whole, resumed)]
    assert [(r['loss'], r['acc']) for r in rows[1:]] == [(rows[0]['loss'], rows[0]['acc'])], rows
    if recipe:
        return
    assert [r['batch'] for r in read_tsv(resumed / 'train_batch.log')] == ['4', '5', '6']
    # With a larger batch the epoch has 3 batches: the checkpoint's place in it is gone.
    other = [a if a != '4' else '8' for a in common]
    with pytest.raises(SystemExit) as stop:
        main.main(tiny_args(*tiny_synthetic, tmp_path / 'other', *other, '--resume_path',
                            str(whole / checkpoint_name(1, 3))))
    assert stop.value.code == 2
    assert 'resume with the --batch_size and number of processes' in capsys.readouterr().err


class SlowItems(torch.utils.data.Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        time.sleep(0.2)
        return torch.tensor(i)


def _signal_from_another_process(pid, sig):
    subprocess.run([sys.executable, '-c', f'import os; os.kill({pid}, {int(sig)})'], check=True)


def _signal_bits(pid, field):
    """The signals of /proc/<pid>/status's SigBlk / SigIgn mask."""
    for line in Path(f'/proc/{pid}/status').read_text().splitlines():
        if line.startswith(field + ':'):
            mask = int(line.split()[1], 16)
            return {s for s in signal.Signals if mask >> (s - 1) & 1}
    raise AssertionError(field)


def test_a_stop_signal_between_fork_and_shield_waits_for_the_shield(tmp_path, monkeypatch):
    """The real VideoDataLoader's workers are forked with the stop signals blocked
    (stop_signals_blocked): a signal to the process group in the moment between
    the fork and shield_loader_worker waits in the worker and is then dropped.
    Without the block the worker's SigBlk lacks SIGINT and SIGUSR1 here and the
    SIGTERM kills it ('DataLoader worker ... is killed by signal: Terminated').
    The moment is held open by a worker_init_fn that waits before the shield."""
    import dataset
    ready, go = tmp_path / 'ready', tmp_path / 'go'

    def late_shield(worker_id):
        ready.write_text(str(os.getpid()))
        while not go.exists():
            time.sleep(0.01)
        shield_loader_worker(worker_id)

    def signal_the_waiting_worker(seen):
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        pid = int(ready.read_text())
        seen['blocked'] = _signal_bits(pid, 'SigBlk')
        for sig in STOP_SIGNALS:
            _signal_from_another_process(pid, sig)
        seen['pending'] = _signal_bits(pid, 'ShdPnd') | _signal_bits(pid, 'SigPnd')
        go.touch()

    monkeypatch.setattr(dataset, 'shield_loader_worker', late_shield)
    loader = dataset.VideoDataLoader(SlowItems(), batch_size=1, num_workers=1)
    seen = {}
    sender = threading.Thread(target=signal_the_waiting_worker, args=(seen,))
    sender.start()
    try:
        batches = [int(b) for b in loader]
    finally:
        go.touch()
        sender.join()
    assert set(STOP_SIGNALS) <= seen['blocked']
    assert set(STOP_SIGNALS) <= seen['pending']  # they came, and waited
    assert batches == list(range(6))
    assert not set(STOP_SIGNALS) & signal.pthread_sigmask(signal.SIG_BLOCK, [])


def _rank_with_a_late_worker(ready, go):
    """A rank's loader whose worker waits (at `go`) before its worker_init_fn."""
    import dataset

    def late_shield(worker_id):
        ready.write_text(str(os.getpid()))
        while not go.exists():
            time.sleep(0.01)
        shield_loader_worker(worker_id)
    dataset.shield_loader_worker = late_shield
    for _ in dataset.VideoDataLoader(SlowItems(), batch_size=1, num_workers=1):
        pass


@pytest.mark.skipif(not Path('/proc/self/stat').exists(), reason='reads process states from /proc')
def test_a_worker_whose_rank_died_before_it_started_ends(tmp_path):
    """A rank SIGKILLed while its loader workers start (torchrun's elastic restart
    found one in the GPU self-check's dry run): torch's own watchdog takes the
    parent it watches from getppid() after worker_init_fn, by when a dead rank's
    orphan has a new parent, so the worker lived on forever. It held the rank's
    pipe, and torchrun, which sees a rank's end when that pipe closes, waited
    for it instead of restarting the job. The worker now watches the process
    that forked it and ends."""
    import multiprocessing
    ready, go = tmp_path / 'ready', tmp_path / 'go'
    rank = multiprocessing.get_context('fork').Process(target=_rank_with_a_late_worker, args=(ready, go))
    rank.start()
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        worker = int(ready.read_text())
        os.kill(rank.pid, signal.SIGKILL)
        rank.join()
        go.touch()
        deadline = time.monotonic() + 15  # torch's watchdog looks every 5 s; ours every second
        while alive(worker) and time.monotonic() < deadline:  # an orphan's zombie may never be reaped
            time.sleep(0.05)
        assert not alive(worker), 'the orphaned loader worker is still running'
    finally:
        go.touch()
        if ready.exists() and alive(int(ready.read_text())):
            os.kill(int(ready.read_text()), signal.SIGKILL)


def test_loader_workers_leave_stop_signals_to_the_main_process():
    """A stop signal sent to the process group (torchrun ending the job, Ctrl-C)
    reaches the loader workers too. Before, they died of it and the main process
    failed with 'DataLoader worker ... is killed by signal: Terminated' instead of
    writing its checkpoint. The main process's own SIGTERM still ends a worker."""
    from dataset import VideoDataLoader
    loader = VideoDataLoader(SlowItems(), batch_size=1, num_workers=1)
    before = set(child_pids(os.getpid()))
    batches = iter(loader)
    seen = [int(next(batches))]
    (worker_pid,) = set(child_pids(os.getpid())) - before
    assert {signal.SIGINT, signal.SIGUSR1} <= _signal_bits(worker_pid, 'SigIgn')
    assert signal.SIGTERM in _signal_bits(worker_pid, 'SigBlk')
    assert not set(STOP_SIGNALS) & signal.pthread_sigmask(signal.SIG_BLOCK, [])  # ours again
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        _signal_from_another_process(worker_pid, sig)
    seen += [int(b) for b in batches]
    assert seen == list(range(6))
    shielded = torch.utils.data.DataLoader(SlowItems(), batch_size=1, num_workers=1,
                                           worker_init_fn=shield_loader_worker)
    batches = iter(shielded)
    next(batches)
    worker = batches._workers[0]
    os.kill(worker.pid, signal.SIGTERM)  # from the main process, as at its shutdown
    worker.join(timeout=10)
    assert worker.exitcode == 0
    del batches


def _raised_in(filename, exc):
    """exc_info of exc raised by code that claims to live in filename."""
    try:
        exec(compile('raise exc', filename, 'exec'), {'exc': exc})
    except BaseException:
        return sys.exc_info()


def test_a_loader_worker_is_quiet_when_its_dead_main_process_resets_the_fd_sharing():
    """A rank killed while its loader worker hands it a batch's file descriptor:
    the worker's resource_sharer thread printed a ConnectionResetError traceback
    (under the dead rank's prefix) beside the surviving rank's one-line error.
    Other errors still print."""
    import multiprocessing.resource_sharer

    from utils.preemption import loader_worker_excepthook
    reset = _raised_in(multiprocessing.resource_sharer.__file__, ConnectionResetError(104, 'reset'))
    elsewhere = _raised_in('somewhere.py', ConnectionResetError(104, 'reset'))
    other = _raised_in(multiprocessing.resource_sharer.__file__, ValueError('a real bug'))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        loader_worker_excepthook(*reset)
        assert err.getvalue() == ''
        loader_worker_excepthook(*elsewhere)
        loader_worker_excepthook(*other)
    assert err.getvalue().count('Traceback') == 2 and 'a real bug' in err.getvalue()


class _WorkerHook(torch.utils.data.Dataset):
    def __len__(self):
        return 1

    def __getitem__(self, index):
        from utils.preemption import loader_worker_excepthook
        return torch.tensor(sys.excepthook is loader_worker_excepthook)


def test_shielded_loader_workers_install_the_quiet_hook():
    loader = torch.utils.data.DataLoader(_WorkerHook(), num_workers=1, worker_init_fn=shield_loader_worker)
    assert bool(next(iter(loader)))
