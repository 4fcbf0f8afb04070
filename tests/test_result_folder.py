"""The result folder after faults: one run at a time, no stale temporaries,
logs cut back to the checkpoint a run resumes from."""
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from utils.checkpoint import remove_stale_temporaries, save_checkpoint_atomic
from utils.errors import ResultFolderBusy, ResultFolderError
from utils.logs import TsvLogger, read_tsv, truncate_log
from utils.result_folder import ResultFolderLock

ROOT = Path(__file__).resolve().parents[1]


def start_python(code, *args):
    """A child python that prints 'ready' once it has done its part."""
    proc = subprocess.Popen([sys.executable, '-c', textwrap.dedent(code), *map(str, args)],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == 'ready'
    return proc


HOLD_LOCK = '''
    import sys, time
    from utils.result_folder import ResultFolderLock
    ResultFolderLock(sys.argv[1]).acquire()
    print('ready', flush=True)
    time.sleep(60)
'''


def test_second_run_is_refused_with_the_owner_named(tmp_path):
    owner = start_python(HOLD_LOCK, tmp_path)
    try:
        with pytest.raises(ResultFolderBusy) as info:
            ResultFolderLock(tmp_path).acquire()
        msg = str(info.value)
        assert f'pid {owner.pid}' in msg and str(tmp_path) in msg and '--result_path' in msg
    finally:
        owner.kill()
        owner.wait()
    # The owner died with kill -9: its lock went with it.
    lock = ResultFolderLock(tmp_path).acquire()
    lock.release()


def test_lock_is_not_held_by_a_forked_child_of_a_dead_owner(tmp_path):
    """DataLoader workers are forked; one that outlives a killed run must not
    keep the next run out."""
    code = '''
        import os, sys, time
        from utils.result_folder import ResultFolderLock
        ResultFolderLock(sys.argv[1]).acquire()
        if os.fork() == 0:
            time.sleep(5)
            os._exit(0)
        print('ready', flush=True)
        time.sleep(60)
    '''
    owner = start_python(code, tmp_path)
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    with ResultFolderLock(tmp_path):
        pass


def test_result_path_that_is_a_file(tmp_path):
    path = tmp_path / 'results'
    path.write_text('x')
    with pytest.raises(ResultFolderError, match='must be a folder'):
        ResultFolderLock(path).acquire()


@pytest.mark.slow
def test_stale_temporaries_of_a_killed_write_are_removed(tmp_path):
    # A real kill during a checkpoint write leaves its temporary behind.
    code = '''
        import os, signal, sys, torch
        from utils.checkpoint import save_checkpoint_atomic
        os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)
        print('ready', flush=True)
        save_checkpoint_atomic({'w': torch.zeros(100_000)}, sys.argv[1] + '/save_3.pth')
    '''
    proc = start_python(code, tmp_path)
    assert proc.wait() == -signal.SIGKILL
    [tmp] = os.listdir(tmp_path)
    assert tmp.startswith('.save_3.pth.') and tmp.endswith('.tmp')
    save_checkpoint_atomic({'w': torch.ones(1)}, tmp_path / 'save_2.pth')
    others = ['notes.tmp', '.opts.json.tmp', 'save_2.pth.tmp', '.save_2.pth']
    for name in others:
        (tmp_path / name).write_text('not ours')
    assert remove_stale_temporaries(tmp_path) == [tmp]
    assert sorted(os.listdir(tmp_path)) == sorted(['save_2.pth', *others])


def write_log(path, rows, header=('epoch', 'loss')):
    log = TsvLogger(path, header)
    log.log_many(rows)
    log.close()


def test_truncate_log_equals_the_uninterrupted_log(tmp_path):
    rows = [{'epoch': e, 'loss': 1.0 / e} for e in range(1, 6)]
    interrupted, uninterrupted = tmp_path / 'a.log', tmp_path / 'b.log'
    write_log(interrupted, rows)
    with open(interrupted, 'a') as f:
        f.write('6\t0.1')  # a row cut short by a kill
    write_log(uninterrupted, rows[:3])
    assert truncate_log(interrupted, 3) == 3
    assert interrupted.read_bytes() == uninterrupted.read_bytes()
    # Resume: appending epochs 4 and 5 again gives the uninterrupted run's log.
    write_log(interrupted, rows[3:])
    write_log(uninterrupted, rows[3:])
    assert interrupted.read_bytes() == uninterrupted.read_bytes()
    assert [r['epoch'] for r in read_tsv(interrupted)] == ['1', '2', '3', '4', '5']
    assert truncate_log(interrupted, 5) == 0
    assert truncate_log(tmp_path / 'none.log', 1) == 0


def test_truncate_log_within_an_epoch(tmp_path):
    path = tmp_path / 'train_batch.log'
    header = ('epoch', 'batch', 'iter', 'loss')
    write_log(path, [{'epoch': e, 'batch': b, 'iter': (e - 1) * 3 + b, 'loss': 0.5}
                     for e in (1, 2) for b in (1, 2, 3)], header)
    assert truncate_log(path, 2, last_iter=4) == 2
    assert [(r['epoch'], r['iter']) for r in read_tsv(path)] == \
        [('1', '1'), ('1', '2'), ('1', '3'), ('2', '4')]
    assert truncate_log(path, 0) == 4
    assert path.read_text() == 'epoch\tbatch\titer\tloss\n'


def test_truncate_log_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / 'train.log'
    write_log(path, [{'epoch': e, 'loss': 0.5} for e in (1, 2, 3)])
    before = path.read_bytes()

    def killed(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, 'fsync', killed)
    with pytest.raises(KeyboardInterrupt):
        truncate_log(path, 1)
    assert path.read_bytes() == before


def test_other_runs_checkpoints_refused_or_cleared(tmp_path):
    from utils.result_folder import refuse_or_clear_other_run
    assert refuse_or_clear_other_run(tmp_path, overwrite=False) == []
    for e in range(1, 6):
        save_checkpoint_atomic({'epoch': e, 'state_dict': {}}, tmp_path / f'save_{e}.pth')
    for name in ('opts.json', 'train.log', 'val.json', 'events.out.tfevents.1.host',
                 'notes.txt', 'save_best.pth'):
        (tmp_path / name).write_text('x')
    with pytest.raises(ResultFolderError) as info:
        refuse_or_clear_other_run(tmp_path, overwrite=False)
    msg = str(info.value)
    assert 'save_1.pth, save_2.pth, save_3.pth ... save_5.pth' in msg
    assert '--auto_resume' in msg and '--overwrite' in msg and '\n' not in msg
    assert len(os.listdir(tmp_path)) == 11  # nothing touched
    refuse_or_clear_other_run(tmp_path, overwrite=True)
    assert sorted(os.listdir(tmp_path)) == ['notes.txt', 'save_best.pth']  # not ours


def test_folder_refusing_new_files(tmp_path, monkeypatch):
    from pathlib import Path

    from utils.result_folder import check_writable
    check_writable(tmp_path)
    assert os.listdir(tmp_path) == []

    def refuse(self, data):
        raise PermissionError(13, 'Permission denied')

    monkeypatch.setattr(Path, 'write_bytes', refuse)
    with pytest.raises(ResultFolderError, match='Permission denied.*writable --result_path'):
        check_writable(tmp_path)


# ----------------------------------------------------------------------------- through main.py

def run_main(capsys, args):
    import main
    try:
        main.main(args)
    except SystemExit as e:
        return e.code, capsys.readouterr().err
    return 0, capsys.readouterr().err


def test_second_run_into_a_busy_folder(tiny_synthetic, tmp_path, capsys):
    from tests.conftest import tiny_args
    result = tmp_path / 'r'
    result.mkdir()
    owner = start_python(HOLD_LOCK, result)
    try:
        code, err = run_main(capsys, tiny_args(*tiny_synthetic, result, '--auto_resume'))
    finally:
        owner.kill()
        owner.wait()
    assert code == 2 and err.startswith('error: ') and f'pid {owner.pid}' in err
    assert sorted(os.listdir(result)) == ['.lock']  # nothing written, no opts.json


def test_a_failure_at_start_removes_the_folder_it_created(tiny_synthetic, tmp_path, capsys):
    """A missing video found at start: the folder the run created goes, lock, index
    and all; a folder that was there keeps what it held."""
    from tests.conftest import tiny_args
    video_path, annotation_path = tiny_synthetic
    result = tmp_path / 'new' / 'r'
    code, err = run_main(capsys, tiny_args(video_path, tmp_path / 'missing.json', result))
    assert code == 2 and 'missing.json' in err
    assert not result.exists()
    kept = tmp_path / 'kept'
    kept.mkdir()
    (kept / 'notes.txt').write_text('mine')
    code, err = run_main(capsys, tiny_args(video_path, tmp_path / 'missing.json', kept))
    assert code == 2 and sorted(os.listdir(kept)) == ['.lock', 'notes.txt']


@pytest.mark.slow
def test_fresh_run_into_another_runs_folder(tiny_synthetic, tmp_path, capsys):
    from tests.conftest import tiny_args
    result = tmp_path / 'r'
    args = tiny_args(*tiny_synthetic, result, '--n_epochs', '2', '--checkpoint', '1', '--no_val')
    assert run_main(capsys, args)[0] == 0
    save_checkpoint_atomic({'epoch': 8, 'state_dict': {}}, result / 'save_8.pth')  # stale
    opts_before = (result / 'opts.json').read_text()
    code, err = run_main(capsys, args + ['--manual_seed', '5'])
    assert code == 2 and 'holds checkpoints of another run' in err and '--overwrite' in err
    assert (result / 'opts.json').read_text() == opts_before  # options not written
    assert run_main(capsys, args + ['--manual_seed', '5', '--overwrite'])[0] == 0
    assert sorted(p.name for p in result.glob('save_*')) == ['save_1.pth', 'save_2.pth']
    assert '"manual_seed": 5' in (result / 'opts.json').read_text()
    assert [r['epoch'] for r in read_tsv(result / 'train.log')] == ['1', '2']


@pytest.mark.slow
def test_resumed_logs_equal_the_uninterrupted_run(tiny_synthetic, tmp_path, capsys):
    """A kill after epoch 3's logs were written but before its checkpoint, and
    a killed checkpoint write: the resumed run's logs equal an uninterrupted run's."""
    from tests.conftest import tiny_args
    full, cut = tmp_path / 'full', tmp_path / 'cut'
    extra = ('--n_epochs', '3', '--checkpoint', '1', '--auto_resume')
    for result in (full, cut):
        assert run_main(capsys, tiny_args(*tiny_synthetic, result, *extra))[0] == 0
    for name in ('save_2.pth', 'save_3.pth'):
        (cut / name).unlink()
    (cut / '.save_2.pth.k1ll3d.tmp').write_bytes(b'partial')
    with open(cut / 'train_batch.log', 'a') as f:
        f.write('4\t1\t')  # a row cut short
    assert run_main(capsys, tiny_args(*tiny_synthetic, cut, *extra))[0] == 0
    for name in ('train.log', 'val.log', 'train_batch.log'):
        a, b = read_tsv(full / name), read_tsv(cut / name)
        for row in a + b:  # timing differs from run to run
            row.pop('clips_per_s', None)
            row.pop('data_wait', None)
        assert a == b, name
    assert not list(cut.glob('.*.tmp'))
