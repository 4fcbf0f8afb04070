"""A 2-process mid-epoch resume ends with the uninterrupted run's weights bit for
bit (CPU, gloo), with every family of the training recipe on, and the resumed
epoch's train.log row is the uninterrupted run's.

Each test: one uninterrupted 2-process run with --checkpoint_steps 1 (which
also gives the checkpoint to resume from), then a 2-process run resumed from
the checkpoint after 2 of the epoch's 6 steps. Both runs go through main.run
on two processes the session keeps (the path torchrun takes after start-up;
tests.dist_helpers.RankPool)."""
import pytest
import torch

import main
from tests.conftest import tiny_args
from tests.dist_helpers import main_worker
from utils.checkpoint import load_checkpoint
from utils.logs import read_tsv
from utils.retention import checkpoint_name


def max_weight_difference(a, b, key='state_dict'):
    return max((a[key][k].double() - b[key][k].double()).abs().max().item() for k in a[key])


FAMILIES = {
    'mixup_cutmix': ['--mixup_alpha', '0.8', '--cutmix_alpha', '1.0'],
    'randaugment_erasing': ['--randaugment', '2', '9', '--random_erasing', '0.5'],
    'ema': ['--ema_decay', '0.8'],
    'precise_bn': ['--precise_bn', '2'],
    'label_smoothing': ['--label_smoothing', '0.1'],
}


@pytest.mark.slow
@pytest.mark.usefixtures('one_torch_thread', 'no_curves')
@pytest.mark.parametrize('family', list(FAMILIES))
def test_two_process_mid_epoch_resume_is_exact(tiny_synthetic, tmp_path, family, capsys, rank_pool):
    # 24 training videos, global batch 4: 2 clips per process, 6 steps.
    common = ['--distributed', '--batch_size', '4', '--n_threads', '0', '--n_epochs', '1',
              '--no_val', '--lr_scheduler', 'cosine', '--learning_rate', '0.05',
              *FAMILIES[family]]
    whole = tmp_path / 'whole'
    rank_pool.run(main_worker, tiny_args(*tiny_synthetic, whole, *common, '--checkpoint_steps', '1'))
    resumed = tmp_path / 'resumed'
    rank_pool.run(main_worker, tiny_args(*tiny_synthetic, resumed, *common, '--resume_path',
                                         str(whole / checkpoint_name(1, 2))))
    expected, final = load_checkpoint(whole / 'save_1.pth'), load_checkpoint(resumed / 'save_1.pth')
    keys = ['state_dict'] + (['ema_state_dict'] if 'ema_state_dict' in expected else [])
    differences = {key: max_weight_difference(expected, final, key) for key in keys}
    assert all(d == 0 for d in differences.values()), differences
    rows = [read_tsv(d / 'train.log')[0] for d in (whole, resumed)]
    assert [(r['loss'], r['acc']) for r in rows] == [(rows[0]['loss'], rows[0]['acc'])] * 2, rows
    assert torch.equal(final['optimizer']['state'][0]['momentum_buffer'],
                       expected['optimizer']['state'][0]['momentum_buffer'])
    if family != 'mixup_cutmix':
        return
    # The same checkpoint on one process: said in one line, and the run goes on.
    main.main(tiny_args(*tiny_synthetic, tmp_path / 'one', *common[1:], '--resume_path',
                        str(whole / checkpoint_name(1, 2))))
    out = capsys.readouterr().out
    assert 'holds the random states of 2 process(es), this run has 1' in out
    assert (tmp_path / 'one' / 'save_1.pth').exists()
