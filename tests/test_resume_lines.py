"""A resume from an earlier checkpoint starts another line of training: the
later checkpoints of the line it abandons are set aside, and --auto_resume
takes the checkpoint written last (last_checkpoint.json), never a
higher-numbered leftover."""
import json
import os

import pytest
import torch

import checkpoint as ckpt
import main
from tests.conftest import tiny_args
from utils.logs import read_tsv
from utils.result_folder import record_last_checkpoint, set_aside_later_checkpoints
from utils.retention import checkpoint_progress

pytestmark = pytest.mark.usefixtures('one_torch_thread', 'no_curves')


def _epochs(log):
    return [int(row['epoch']) for row in read_tsv(log)]


def _touch(folder, *names):
    for name in names:
        progress = checkpoint_progress(name)
        torch.save({'epoch': progress[0] if progress else 0, 'state_dict': {}}, folder / name)


def test_auto_resume_takes_the_recorded_checkpoint_not_a_higher_leftover(tmp_path):
    _touch(tmp_path, 'save_2.pth', 'save_3.pth', 'save_4.pth')
    assert ckpt.auto_resume_checkpoint(tmp_path).name == 'save_4.pth'  # no record: the newest
    record_last_checkpoint(tmp_path, tmp_path / 'save_3.pth')
    assert ckpt.auto_resume_checkpoint(tmp_path).name == 'save_3.pth'
    (tmp_path / 'save_3.pth').unlink()  # a record naming a file that is gone is no record
    assert ckpt.auto_resume_checkpoint(tmp_path).name == 'save_4.pth'


def test_a_folder_without_record_warns_when_a_lower_checkpoint_is_newer(tmp_path):
    """A folder of an earlier version (no last_checkpoint.json) where a resume
    from save_2 rewrote save_3 and left save_4: --auto_resume still takes
    save_4 (nothing tells the lines apart), with a warning."""
    _touch(tmp_path, 'save_2.pth', 'save_3.pth', 'save_4.pth')
    for i, name in enumerate(['save_2.pth', 'save_3.pth', 'save_4.pth']):
        os.utime(tmp_path / name, (1e9 + i * 100, 1e9 + i * 100))
    assert ckpt.written_after(tmp_path / 'save_4.pth') is None  # written in order
    os.utime(tmp_path / 'save_3.pth', (1e9 + 300, 1e9 + 300))
    assert ckpt.written_after(tmp_path / 'save_4.pth') == (
        f'warning: save_3.pth was written after save_4.pth: save_4.pth may be of a line of training a '
        f'resume abandoned; to go on from save_3.pth, give --resume_path {tmp_path / "save_3.pth"} (the '
        f'later checkpoints are then set aside)')
    record_last_checkpoint(tmp_path, tmp_path / 'save_4.pth')  # the record decides: no guess
    assert ckpt.written_after(tmp_path / 'save_4.pth') is None


def test_later_checkpoints_move_aside_with_best_and_copies_of_the_logs(tmp_path):
    _touch(tmp_path, 'save_2.pth', 'save_3_5.pth', 'save_3.pth', 'save_4.pth', 'best.pth')
    (tmp_path / 'best.json').write_text(json.dumps({'epoch': 4, 'val_video_acc': 0.5}))
    (tmp_path / 'train.log').write_text('epoch\n1\n2\n3\n4\n')
    folder, moved = set_aside_later_checkpoints(tmp_path, (2, 5), now=0)
    assert moved == ['save_3.pth', 'save_4.pth', 'best.pth', 'best.json']  # save_3_5 is (2, 5): kept
    assert folder.parent == tmp_path and folder.name.startswith('abandoned_')
    assert sorted(p.name for p in tmp_path.glob('*.pth')) == ['save_2.pth', 'save_3_5.pth']
    assert (folder / 'train.log').read_text() == (tmp_path / 'train.log').read_text()
    again, _ = set_aside_later_checkpoints(tmp_path, (1, 0), now=0)  # the same second: another folder
    assert again != folder and sorted(p.name for p in again.iterdir()) == \
        ['save_2.pth', 'save_3_5.pth', 'train.log']
    assert set_aside_later_checkpoints(tmp_path, (1, 0)) == (None, [])


@pytest.mark.slow
def test_auto_resume_after_a_resume_from_an_earlier_epoch(tiny_synthetic, tmp_path, capsys):
    """4 epochs, a resume from save_2 to --n_epochs 3, then --auto_resume
    --n_epochs 5: epochs 4 and 5 follow the resumed line's save_3 (it took the
    abandoned save_4 and logged epochs 1, 2, 3, 5), with --keep_last 3."""
    result = tmp_path / 'r'
    args = tiny_args(*tiny_synthetic, result, '--checkpoint', '1', '--keep_last', '3')
    main.main([*args, '--n_epochs', '4'])
    main.main([*args, '--n_epochs', '3', '--resume_path', str(result / 'save_2.pth')])
    out = capsys.readouterr().out
    assert 'holds checkpoints after the one this run resumes (epoch 2): save_3.pth, save_4.pth' in out
    (abandoned,) = result.glob('abandoned_*')
    assert sorted(p.name for p in abandoned.glob('*.pth')) == ['save_3.pth', 'save_4.pth']
    assert _epochs(abandoned / 'train.log') == [1, 2, 3, 4]  # the abandoned line's log, as it was
    main.main([*args, '--n_epochs', '5', '--auto_resume'])
    assert f'auto-resume from {result / "save_3.pth"}' in capsys.readouterr().out
    assert _epochs(result / 'train.log') == [1, 2, 3, 4, 5]
    assert _epochs(result / 'val.log') == [1, 2, 3, 4, 5]
    assert sorted(p.name for p in result.glob('save_*.pth')) == ['save_3.pth', 'save_4.pth', 'save_5.pth']
    assert json.loads((result / 'last_checkpoint.json').read_text()) == {'checkpoint': 'save_5.pth'}


class Killed(BaseException):
    """Ends a run as a kill would: no handler of the run sees it."""


@pytest.mark.slow
def test_a_resumed_run_killed_then_auto_resumed_follows_its_own_line(tiny_synthetic, tmp_path,
                                                                     monkeypatch, capsys):
    """4 epochs; a resume from save_2 killed after writing save_3; --auto_resume
    then goes on from that save_3, not from the first run's save_4."""
    result = tmp_path / 'r'
    args = tiny_args(*tiny_synthetic, result, '--checkpoint', '1', '--no_val')
    main.main([*args, '--n_epochs', '4'])
    real = ckpt.CheckpointSaver.after_epoch

    def killed_after_epoch_3(self, epoch, *rest, **kw):
        path = real(self, epoch, *rest, **kw)
        if epoch == 3:
            raise Killed
        return path

    monkeypatch.setattr(ckpt.CheckpointSaver, 'after_epoch', killed_after_epoch_3)
    with pytest.raises(Killed):
        main.main([*args, '--n_epochs', '5', '--resume_path', str(result / 'save_2.pth')])
    monkeypatch.setattr(ckpt.CheckpointSaver, 'after_epoch', real)
    capsys.readouterr()
    main.main([*args, '--n_epochs', '5', '--auto_resume'])
    assert f'auto-resume from {result / "save_3.pth"}' in capsys.readouterr().out
    assert _epochs(result / 'train.log') == [1, 2, 3, 4, 5]
    assert sorted(p.name for p in result.glob('save_*.pth')) == \
        ['save_1.pth', 'save_2.pth', 'save_3.pth', 'save_4.pth', 'save_5.pth']
    (abandoned,) = result.glob('abandoned_*')
    assert sorted(p.name for p in abandoned.glob('*.pth')) == ['save_3.pth', 'save_4.pth']
