import errno
import io
import os
import random
import tempfile

import numpy as np
import pytest
import torch

from utils import checkpoint as ck
from utils.logs import TsvLogger, read_tsv


def test_interrupted_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / 'save_1.pth'
    ck.save_checkpoint_atomic({'epoch': 1, 'state_dict': {'w': torch.ones(3)}}, path)

    def dying_save(obj, f):
        f.write(b'partial bytes')
        raise KeyboardInterrupt  # killed in the middle of the write

    monkeypatch.setattr(torch, 'save', dying_save)
    with pytest.raises(KeyboardInterrupt):
        ck.save_checkpoint_atomic({'epoch': 1, 'state_dict': {'w': torch.zeros(3)}}, path)
    monkeypatch.undo()
    assert torch.equal(ck.load_checkpoint(path)['state_dict']['w'], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ['save_1.pth']


def test_find_latest_skips_corrupt_and_foreign_files(tmp_path):
    for epoch in (1, 2, 10):
        ck.save_checkpoint_atomic({'epoch': epoch, 'state_dict': {}}, tmp_path / f'save_{epoch}.pth')
    (tmp_path / 'save_11.pth').write_bytes(b'truncated')
    (tmp_path / 'save_x.pth').write_bytes(b'')
    assert ck.find_latest_checkpoint(tmp_path) == tmp_path / 'save_10.pth'
    assert ck.find_latest_checkpoint(tmp_path / 'none') is None


def test_module_prefix_stripped():
    sd = {'module.a': 1, 'module.b': 2}
    assert ck.strip_module_prefix(sd) == {'a': 1, 'b': 2}
    assert ck.strip_module_prefix({'a': 1}) == {'a': 1}


def test_rng_state_round_trip_through_weights_only_load(tmp_path):
    random.seed(3)
    np.random.seed(3)
    torch.manual_seed(3)
    state = ck.capture_rng_state()
    path = tmp_path / 'rng.pth'
    ck.save_checkpoint_atomic({'rng_state': state}, path)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    ck.restore_rng_state(ck.load_checkpoint(path)['rng_state'])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


@pytest.mark.gpu
def test_cuda_rng_state_round_trip(tmp_path):
    device = torch.device('cuda', 0)
    torch.cuda.manual_seed(3)
    state = ck.capture_rng_state(device)
    assert state['cuda'].device.type == 'cpu'  # a ByteTensor any machine loads
    ck.save_checkpoint_atomic({'rng_state': state}, tmp_path / 'rng.pth')
    expected = torch.rand(4, device=device)
    ck.restore_rng_state(ck.load_checkpoint(tmp_path / 'rng.pth')['rng_state'], device)
    assert torch.equal(torch.rand(4, device=device), expected)
    ck.restore_rng_state(state, torch.device('cpu'))  # a GPU checkpoint resumed on CPU


def test_tsv_logger_appends_without_second_header(tmp_path):
    path = tmp_path / 'train.log'
    log = TsvLogger(path, ['epoch', 'loss'])
    log.log({'epoch': 1, 'loss': 0.5})
    log.close()
    log = TsvLogger(path, ['epoch', 'loss'])
    log.log({'epoch': 2, 'loss': 0.25})
    log.close()
    assert path.read_text() == 'epoch\tloss\n1\t0.5\n2\t0.25\n'
    assert read_tsv(path)[1] == {'epoch': '2', 'loss': '0.25'}


def test_disk_full_is_one_line_and_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    ck.save_checkpoint_atomic({'epoch': 1, 'state_dict': {'w': torch.ones(3)}},
                              tmp_path / 'save_1.pth')
    real_fdopen = os.fdopen

    class FullDisk(io.FileIO):
        def write(self, b):
            if self.tell() + len(b) > 1000:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return super().write(b)

    monkeypatch.setattr(os, 'fdopen', lambda fd, mode: FullDisk(fd, 'w'))
    with pytest.raises(ck.CheckpointWriteError) as info:
        ck.save_checkpoint_atomic({'epoch': 2, 'state_dict': {'w': torch.zeros(10_000)}},
                                  tmp_path / 'save_2.pth')
    monkeypatch.setattr(os, 'fdopen', real_fdopen)
    msg = str(info.value)
    assert 'No space left on device' in msg and 'save_2.pth' in msg and '\n' not in msg
    assert 'unexpected pos' not in msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ['save_1.pth']  # no temporary left
    assert ck.find_latest_checkpoint(tmp_path) == tmp_path / 'save_1.pth'


def test_folder_refusing_new_files(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(tempfile, 'mkstemp', refuse)
    with pytest.raises(ck.CheckpointWriteError, match='Permission denied'):
        ck.save_checkpoint_atomic({'epoch': 1}, tmp_path / 'save_1.pth')


def test_a_text_file_is_not_a_checkpoint(tmp_path):
    path = tmp_path / 'notes.txt'
    path.write_text('epoch 3 was good\n')
    with pytest.raises(ck.CheckpointError, match='notes.txt is not a checkpoint'):
        ck.load_checkpoint(path)
    weights = tmp_path / 'weights.pth'
    torch.save({'conv1.weight': torch.ones(1)}, weights)
    with pytest.raises(ck.CheckpointError, match='not a training checkpoint.*conv1.weight'):
        ck.load_training_checkpoint(weights)
    truncated = tmp_path / 'save_1.pth'
    ck.save_checkpoint_atomic({'epoch': 1, 'state_dict': {}}, truncated)
    truncated.write_bytes(truncated.read_bytes()[:100])
    with pytest.raises(ck.CheckpointError, match='truncated'):
        ck.load_checkpoint(truncated)
    good = tmp_path / 'save_2.pth'
    ck.save_checkpoint_atomic({'epoch': 2, 'state_dict': {}}, good)
    assert ck.load_training_checkpoint(good)['epoch'] == 2


# ----------------------------------------------------------------------------- resuming (checkpoint.py)

def test_class_names_checked_by_name():
    from checkpoint import check_class_names
    from utils.errors import DataError
    stored = ['walk', 'run', 'jump', 'sit']
    assert check_class_names(stored, list(stored), 'c.pth', 'a.json', fine_tuning=False) is None
    assert check_class_names(None, ['x'], 'c.pth', 'a.json', fine_tuning=False) is None  # predecessor's
    # 'walk' stays label 0; 'run' and 'jump' are the first two that moved
    with pytest.raises(DataError, match=r"a.json lists the classes of --resume_path c.pth in another order: "
                                        r"'run' is label 1 in the checkpoint and 3 here, 'jump' 2 and 1; "):
        check_class_names(stored, ['walk', 'jump', 'sit', 'run'], 'c.pth', 'a.json', fine_tuning=True)
    other = ['walk', 'run', 'hop', 'stand']
    with pytest.raises(DataError, match=r"other classes than --resume_path c.pth: 'jump' \(and 1 more\) is "
                                        r"not in it, 'hop' \(and 1 more\) is new; .* --pretrain_path c.pth"):
        check_class_names(stored, other, 'c.pth', 'a.json', fine_tuning=False)
    note = check_class_names(stored, other, 'c.pth', 'a.json', fine_tuning=True)
    assert note.endswith("is new: fine-tuning (--pretrain_path) goes on under the annotation's names")


@pytest.mark.parametrize('change', [{'n_epochs': 5}, {'min_lr': 0.03}, {'warmup_epochs': 2.0}])
def test_resumed_cosine_rate_is_the_new_schedules(change):
    """Loading a cosine state into a schedule of other settings sets the rate the
    next step uses to the new schedule's at that step (before: the old one's)."""
    from utils.lr_schedule import LRSchedule, ScheduleConfig

    def schedule(**settings):
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        return LRSchedule(optimizer, ScheduleConfig('cosine', **settings), steps_per_epoch=4)
    old = {'n_epochs': 3, 'min_lr': 0.01, 'warmup_epochs': 1.0}
    trained, whole = schedule(**old), schedule(**{**old, **change})
    for _ in range(6):
        for run in (trained, whole):
            run.scheduler.optimizer.step()
            run.after_step()
    resumed = schedule(**{**old, **change})
    resumed.scheduler.optimizer.param_groups[0]['lr'] = trained.scheduler.optimizer.param_groups[0]['lr']
    resumed.load_state_dict(trained.state_dict())
    rate = resumed.scheduler.optimizer.param_groups[0]['lr']
    assert rate == whole.scheduler.optimizer.param_groups[0]['lr'] == resumed.scheduler.get_last_lr()[0]
    assert rate != trained.scheduler.optimizer.param_groups[0]['lr']
