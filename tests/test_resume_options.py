"""What a resumed run does with optimization options other than its
checkpoint's: another --optimizer or --lr_scheduler is refused in one line;
a new --learning_rate is ignored (said); a new --plateau_patience,
--warmup_epochs, --min_lr or --n_epochs applies from the checkpoint on, its
first step included (said, and recorded in opts.json), and one not given is
the checkpoint's (--n_epochs: its default). Options that shape no part of the chosen schedule
are named at start."""
import json
import math

import pytest
import torch

import main
from tests.conftest import tiny_args
from utils.checkpoint import load_checkpoint
from utils.logs import read_tsv


def run(tiny, result, *extra):
    main.main(tiny_args(*tiny, result, '--no_val', '--checkpoint', '1', *extra))


def refused(tiny, result, capsys, *extra):
    with pytest.raises(SystemExit) as stop:
        run(tiny, result, *extra)
    assert stop.value.code == 2
    return capsys.readouterr().err.strip().splitlines()


@pytest.mark.slow
def test_another_optimizer_or_schedule_on_resume_is_refused(tiny_synthetic, tmp_path, capsys):
    run(tiny_synthetic, tmp_path, '--n_epochs', '1', '--warmup_epochs', '2', '--min_lr', '0.001')
    out = capsys.readouterr().out
    assert ('--warmup_epochs and --min_lr shape the cosine schedule only: ignored with '
            '--lr_scheduler multistep') in out
    resume = ('--n_epochs', '2', '--resume_path', str(tmp_path / 'save_1.pth'))
    for extra, given, stored in ((('--lr_scheduler', 'cosine'), '--lr_scheduler cosine', 'multistep'),
                                 (('--lr_scheduler', 'plateau'), '--lr_scheduler plateau', 'multistep'),
                                 (('--optimizer', 'adamw'), '--optimizer adamw', 'sgd')):
        lines = refused(tiny_synthetic, tmp_path, capsys, *resume, *extra)
        assert len(lines) == 1 and lines[0].startswith(f'error: {given} differs from the {stored} of '
                                                       f'--resume_path'), lines
        assert f'resume with {given.split()[0]} {stored}' in lines[0] and '--pretrain_path' in lines[0]
    assert not (tmp_path / 'save_2.pth').exists()


@pytest.mark.slow
def test_schedule_settings_on_resume(tiny_synthetic, tmp_path, capsys):
    cosine = ('--lr_scheduler', 'cosine', '--warmup_epochs', '1', '--min_lr', '0.002')
    whole = tmp_path / 'whole'
    run(tiny_synthetic, whole, '--n_epochs', '2', *cosine)
    # Resumed without the schedule options: the checkpoint's, so the run is the same.
    same = tmp_path / 'same'
    run(tiny_synthetic, same, '--n_epochs', '2', '--lr_scheduler', 'cosine',
        '--resume_path', str(whole / 'save_1.pth'))
    a, b = (load_checkpoint(d / 'save_2.pth')['state_dict'] for d in (whole, same))
    assert all(torch.equal(a[k], b[k]) for k in a)
    capsys.readouterr()
    # New values: --min_lr applies from the checkpoint on, --learning_rate is ignored.
    other = tmp_path / 'other'
    run(tiny_synthetic, other, '--n_epochs', '2', '--lr_scheduler', 'cosine', '--warmup_epochs', '1',
        '--min_lr', '0.005', '--learning_rate', '0.05', '--resume_path', str(whole / 'save_1.pth'))
    out = capsys.readouterr().out
    assert "--min_lr 0.005 replaces the checkpoint's 0.002 from here on" in out
    assert "--learning_rate 0.05 is ignored on resume: the optimizer and its schedule continue " \
           "from the checkpoint's (0.01)" in out
    last = [float(r['lr']) for r in read_tsv(other / 'train_batch.log')][-1]
    # cosine step 4 of 6 after a 3-step warmup: floor + (1 - floor) * (1 + cos(pi * 2/3)) / 2
    floor = 0.005 / 0.01
    assert last == pytest.approx(0.01 * (floor + (1 - floor) * 0.25), rel=1e-4)


@pytest.mark.slow
def test_plateau_patience_on_resume(tiny_synthetic, tmp_path, capsys):
    run(tiny_synthetic, tmp_path, '--n_epochs', '1', '--lr_scheduler', 'plateau', '--plateau_patience', '3')
    run(tiny_synthetic, tmp_path, '--n_epochs', '2', '--lr_scheduler', 'plateau',
        '--resume_path', str(tmp_path / 'save_1.pth'))
    assert load_checkpoint(tmp_path / 'save_2.pth')['scheduler']['patience'] == 3  # kept
    capsys.readouterr()
    run(tiny_synthetic, tmp_path, '--n_epochs', '2', '--lr_scheduler', 'plateau', '--plateau_patience', '1',
        '--resume_path', str(tmp_path / 'save_1.pth'))
    assert "--plateau_patience 1 replaces the checkpoint's 3 from here on" in capsys.readouterr().out
    assert load_checkpoint(tmp_path / 'save_2.pth')['scheduler']['patience'] == 1


def cosine_rate(step, total, warmup, floor, lr=0.01):
    """The rate of optimizer step `step` (0-based) of a warmup-cosine schedule, by hand."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


# 3 steps an epoch; the checkpoint's schedule: 2 epochs, warmup round(0.5 * 3) = 2 steps, floor 0.1.
COSINE = ('--lr_scheduler', 'cosine', '--warmup_epochs', '0.5', '--min_lr', '0.001')


@pytest.fixture(scope='module')
def cosine_run(tiny_synthetic, tmp_path_factory):
    result = tmp_path_factory.mktemp('cosine')
    run(tiny_synthetic, result, '--n_epochs', '2', *COSINE)
    return result


@pytest.mark.slow
@pytest.mark.parametrize('key, value, old, total, warmup, floor', [
    ('n_epochs', '3', 2, 9, 2, 0.1),
    ('min_lr', '0.004', 0.001, 6, 2, 0.4),
    ('warmup_epochs', '2', 0.5, 6, 6, 0.1),
])
def test_resumed_schedule_is_the_new_one_from_its_first_step(tiny_synthetic, cosine_run, tmp_path, capsys,
                                                             key, value, old, total, warmup, floor):
    """Before: the first step after the checkpoint ran at the checkpoint's rate (the
    old schedule's), the new schedule only from the second step on."""
    settings = {'n_epochs': '2', 'min_lr': '0.001', 'warmup_epochs': '0.5', key: value}
    new = tuple(arg for k, v in settings.items() for arg in (f'--{k}', v))
    capsys.readouterr()
    run(tiny_synthetic, tmp_path / 'resumed', '--lr_scheduler', 'cosine', *new,
        '--resume_path', str(cosine_run / 'save_1.pth'))
    out = capsys.readouterr().out
    assert (f"--{key} {value} replaces the checkpoint's {old:g} from here on: the cosine schedule is "
            f"recomputed, optimizer step 4 runs at lr {cosine_rate(3, total, warmup, floor):g} (the "
            f"checkpoint's schedule: {cosine_rate(3, 6, 2, 0.1):g})") in out
    resumed = {int(r['iter']): r['lr'] for r in read_tsv(tmp_path / 'resumed' / 'train_batch.log')}
    # step 4 (index 3), the first after the checkpoint, on the new schedule
    assert float(resumed[4]) == pytest.approx(cosine_rate(3, total, warmup, floor), rel=1e-5)
    assert float(resumed[4]) != pytest.approx(cosine_rate(3, 6, 2, 0.1), rel=1e-3)  # the old one's
    recorded = json.loads((tmp_path / 'resumed' / 'opts.json').read_text())['run']['schedule_changes']
    assert recorded == {key: {'checkpoint': old, 'now': type(old)(value)}}
    run(tiny_synthetic, tmp_path / 'whole', '--lr_scheduler', 'cosine', *new)
    whole = {int(r['iter']): r['lr'] for r in read_tsv(tmp_path / 'whole' / 'train_batch.log')}
    assert resumed == {step: lr for step, lr in whole.items() if step > 3}
