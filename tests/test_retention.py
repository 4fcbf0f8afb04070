"""Checkpoint order, --keep_last and best.pth."""
import json

import pytest
import torch

import main
from tests.conftest import tiny_args
from utils.checkpoint import find_latest_checkpoint, load_checkpoint
from utils.logs import read_tsv
from utils.retention import BestTracker, better_epoch, checkpoint_name, checkpoint_progress, prune_checkpoints

pytestmark = pytest.mark.usefixtures('one_torch_thread', 'no_curves')


def test_names_and_their_order():
    assert checkpoint_name(3) == 'save_3.pth' and checkpoint_name(4, 20) == 'save_4_20.pth'
    assert checkpoint_progress('save_3.pth') == (3, 0)
    assert checkpoint_progress('save_4_20.pth') == (3, 20)  # 3 epochs and 20 batches done
    assert checkpoint_progress('best.pth') is None
    assert checkpoint_progress('.save_5.pth.abc.tmp') is None  # being written
    names = ['save_4_20.pth', 'save_10.pth', 'save_3.pth', 'save_4_5.pth', 'save_4.pth']
    assert sorted(names, key=checkpoint_progress) == \
        ['save_3.pth', 'save_4_5.pth', 'save_4_20.pth', 'save_4.pth', 'save_10.pth']


def _touch_checkpoints(folder, names):
    for name in names:
        torch.save({'epoch': 0, 'state_dict': {}}, folder / name)


def test_keep_last_deletes_the_oldest_only(tmp_path):
    _touch_checkpoints(tmp_path, ['save_1.pth', 'save_2_3.pth', 'save_2.pth', 'save_3_1.pth',
                                  'best.pth', '.save_3.pth.x.tmp'])
    deleted = prune_checkpoints(tmp_path, 2)
    assert sorted(p.name for p in deleted) == ['save_1.pth', 'save_2_3.pth']
    assert sorted(p.name for p in tmp_path.iterdir()) == \
        ['.save_3.pth.x.tmp', 'best.pth', 'save_2.pth', 'save_3_1.pth']
    assert prune_checkpoints(tmp_path, 0) == []  # 0 keeps everything


def test_auto_resume_picks_the_newest_including_mid_epoch(tmp_path):
    _touch_checkpoints(tmp_path, ['save_2.pth', 'save_3_4.pth', 'save_3_10.pth'])
    assert find_latest_checkpoint(tmp_path).name == 'save_3_10.pth'


def _epoch(epoch, acc, loss):
    return {'epoch': epoch, 'val_video_acc': acc, 'val_loss': loss}


def test_best_breaks_accuracy_ties_by_validation_loss_then_the_later_epoch():
    """A run that learned its training set scores 1 of 3 validation videos at
    every epoch: epoch 1 (scores ~1/3 for every class) must not stay best.pth
    only because it came first."""
    untrained = _epoch(1, 1 / 3, 1.0986)
    assert better_epoch(untrained, None)
    assert better_epoch(_epoch(5, 1 / 3, 0.9), untrained)  # same accuracy, lower loss
    assert not better_epoch(_epoch(5, 1 / 3, 1.5), untrained)  # same accuracy, higher loss
    assert better_epoch(_epoch(5, 1 / 3, 1.0986), untrained)  # all equal: the later epoch
    assert better_epoch(_epoch(5, 2 / 3, 9.0), untrained)  # accuracy first
    assert not better_epoch(_epoch(5, 0.0, 0.1), untrained)
    assert not better_epoch(_epoch(5, 1 / 3, float('nan')), untrained)  # nan: the highest loss
    assert better_epoch(_epoch(5, 1 / 3, 2.0), {'epoch': 1, 'val_video_acc': 1 / 3})  # best.json before val_loss


def test_best_json_keeps_the_loss_for_a_resumed_run(tmp_path):
    tracker = BestTracker(tmp_path)
    assert tracker.improves(1, 0.5, 1.2)
    torch.save({}, tmp_path / 'best.pth')
    tracker.saved(1, 0.5, float('nan'))
    assert json.loads((tmp_path / 'best.json').read_text()) == _epoch(1, 0.5, None)
    tracker.saved(2, 0.5, 0.8)
    resumed = BestTracker(tmp_path)
    assert not resumed.improves(3, 0.5, 0.9) and resumed.improves(3, 0.5, 0.7)


@pytest.mark.slow
def test_keep_last_and_best_in_a_run(tiny_synthetic, tmp_path):
    result = tmp_path / 'r'
    main.main(tiny_args(*tiny_synthetic, result, '--n_epochs', '4', '--checkpoint', '1',
                        '--keep_last', '2', '--learning_rate', '0.05'))
    assert sorted(p.name for p in result.glob('save_*.pth')) == ['save_3.pth', 'save_4.pth']
    rows = read_tsv(result / 'val.log')
    accs = [float(r['acc']) for r in rows]
    assert len(set(accs)) > 1  # the choice means something
    # the highest accuracy; a tie, the lower loss (the log's 6 digits tell them apart here)
    best_epoch = max(range(1, 5), key=lambda e: (accs[e - 1], -float(rows[e - 1]['loss']), e))
    best = json.loads((result / 'best.json').read_text())
    assert best['epoch'] == best_epoch and abs(best['val_video_acc'] - max(accs)) < 1e-6  # log: 6 digits
    assert load_checkpoint(result / 'best.pth')['epoch'] == best_epoch


def _claim_best(folder, epoch, acc):
    """best.json/best.pth as a run that reached `acc` at `epoch` leaves them."""
    torch.save({'epoch': epoch, 'state_dict': {}}, folder / 'best.pth')
    (folder / 'best.json').write_text(json.dumps({'epoch': epoch, 'val_video_acc': acc}))


@pytest.mark.slow
def test_best_is_cut_back_on_resume_and_in_a_fresh_run(tiny_synthetic, tmp_path, capsys):
    """best.json/best.pth of epochs a run redoes (after its checkpoint; all of
    them in a fresh run) are dropped, as the logs' rows are: a best claimed by
    the abandoned history no longer keeps the run from writing its own."""
    result = tmp_path / 'r'
    args = tiny_args(*tiny_synthetic, result, '--checkpoint', '1', '--keep_last', '5')
    main.main([*args, '--n_epochs', '1'])
    assert json.loads((result / 'best.json').read_text())['epoch'] == 1
    _claim_best(result, 2, 1.01)  # as if a diverged run had been best at epoch 2
    main.main([*args, '--n_epochs', '2', '--resume_path', str(result / 'save_1.pth')])
    assert 'best.pth (epoch 2) is after the checkpoint the run resumes (epoch 1)' in \
        capsys.readouterr().out
    # The earlier best.pth was overwritten by the dropped one: best.pth follows the
    # epochs trained since the resume.
    best = json.loads((result / 'best.json').read_text())
    acc_2 = float(read_tsv(result / 'val.log')[1]['acc'])
    assert best['epoch'] == 2 and abs(best['val_video_acc'] - acc_2) < 1e-6
    fresh = tmp_path / 'fresh'
    fresh.mkdir()
    _claim_best(fresh, 7, 1.01)  # all that is left of another run
    main.main([*tiny_args(*tiny_synthetic, fresh, '--keep_last', '5'), '--n_epochs', '1'])
    assert json.loads((fresh / 'best.json').read_text())['epoch'] == 1
    assert load_checkpoint(fresh / 'best.pth')['epoch'] == 1
