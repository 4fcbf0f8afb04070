"""--ft_lr_ratio (two parameter groups) and resuming a fine-tuning run from the
checkpoint alone."""
import json

import pytest
import torch

import main
from model import freeze_before
from models import resnet
from tests.conftest import tiny_args
from training import OptimizerConfig, make_optimizer
from utils.checkpoint import load_checkpoint

pytestmark = pytest.mark.usefixtures('one_torch_thread', 'no_curves')


def _tiny(n_classes=6):
    torch.manual_seed(0)
    return resnet.generate_model(10, widen_factor=0.25, n_classes=n_classes)


def test_ft_lr_ratio_makes_head_and_backbone_groups():
    model = _tiny()
    freeze_before(model, 'layer4')
    config = OptimizerConfig('sgd', 0.1, head='fc', backbone_lr_ratio=0.1)
    groups = make_optimizer(model, config).param_groups
    assert [g['lr'] for g in groups] == [0.1, pytest.approx(0.01)]
    assert {id(p) for p in groups[0]['params']} == {id(p) for p in model.fc.parameters()}
    assert {id(p) for p in groups[1]['params']} == {id(p) for p in model.layer4.parameters()}
    # the default: one group of every trainable tensor, frozen ones left out
    (one,) = make_optimizer(model, OptimizerConfig('sgd', 0.1, head='fc')).param_groups
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert len(one['params']) == len(trainable) < len(list(model.parameters()))


def _finetune_args(data, result, *extra):
    return tiny_args(*data, result, '--no_val', '--checkpoint', '1', *extra)


@pytest.mark.slow
def test_resuming_a_finetuning_run_needs_only_the_checkpoint(tiny_synthetic, tmp_path):
    pretrained = tmp_path / 'pretrained.pth'
    torch.save({'state_dict': _tiny(n_classes=3).state_dict()}, pretrained)
    finetune = ('--pretrain_path', str(pretrained), '--n_pretrain_classes', '3',
                '--ft_begin_module', 'layer4', '--ft_lr_ratio', '0.1')
    main.main(_finetune_args(tiny_synthetic, tmp_path / 'a', '--n_epochs', '2', *finetune))
    main.main(_finetune_args(tiny_synthetic, tmp_path / 'b', '--n_epochs', '1', *finetune))
    pretrained.unlink()  # not needed to resume
    b1 = tmp_path / 'b' / 'save_1.pth'
    saved = load_checkpoint(b1)
    assert (saved['n_classes'], saved['ft_begin_module'], saved['ft_lr_ratio']) == (6, 'layer4', 0.1)
    assert [g['lr'] for g in saved['optimizer']['param_groups']] == [0.01, pytest.approx(0.001)]
    main.main(_finetune_args(tiny_synthetic, tmp_path / 'b', '--n_epochs', '2',
                             '--resume_path', str(b1)))
    a, b = (load_checkpoint(tmp_path / r / 'save_2.pth') for r in 'ab')
    assert b['ft_begin_module'] == 'layer4' and b['ft_lr_ratio'] == 0.1
    for key, value in a['state_dict'].items():
        torch.testing.assert_close(b['state_dict'][key], value, rtol=0, atol=1e-6, msg=key)
    # the frozen layers did not move from the pretrained weights
    torch.testing.assert_close(a['state_dict']['layer1.0.conv1.weight'],
                               _tiny(n_classes=3).state_dict()['layer1.0.conv1.weight'])


@pytest.mark.slow
def test_resume_rejects_a_different_fine_tuning_setting(tiny_synthetic, tmp_path, capsys):
    main.main(_finetune_args(tiny_synthetic, tmp_path, '--n_epochs', '1',
                             '--ft_begin_module', 'layer4'))
    with pytest.raises(SystemExit) as exit_info:
        main.main(_finetune_args(tiny_synthetic, tmp_path, '--n_epochs', '2',
                                 '--resume_path', str(tmp_path / 'save_1.pth'),
                                 '--ft_begin_module', 'layer3'))
    assert exit_info.value.code == 2
    assert "--ft_begin_module layer3 differs from the 'layer4'" in capsys.readouterr().err


# ---- class counts from the data ------------------------------------------------

def _without_n_classes(args):
    i = args.index('--n_classes')
    return args[:i] + args[i + 2:]


@pytest.mark.slow
def test_n_classes_defaults_to_the_annotations_label_count(tiny_synthetic, tmp_path):
    main.main(_without_n_classes(_finetune_args(tiny_synthetic, tmp_path, '--n_epochs', '1')))
    saved = load_checkpoint(tmp_path / 'save_1.pth')
    assert saved['n_classes'] == 6 and saved['state_dict']['fc.weight'].shape[0] == 6
    assert json.loads((tmp_path / 'opts.json').read_text())['run']['n_classes'] == 6


@pytest.mark.slow
def test_mixup_on_a_resumed_run_takes_the_class_count_from_the_checkpoint(tiny_synthetic, tmp_path):
    """Given at the start, --n_classes is not needed to resume, with mixup/cutmix
    either (their targets used the option's default)."""
    main.main(_finetune_args(tiny_synthetic, tmp_path, '--n_epochs', '1', '--mixup_alpha', '0.4'))
    main.main(_without_n_classes(_finetune_args(
        tiny_synthetic, tmp_path, '--n_epochs', '2', '--mixup_alpha', '0.4', '--cutmix_alpha', '1.0',
        '--resume_path', str(tmp_path / 'save_1.pth'))))
    assert load_checkpoint(tmp_path / 'save_2.pth')['n_classes'] == 6


@pytest.mark.slow
def test_n_pretrain_classes_is_read_from_the_pretrained_file(tiny_synthetic, tmp_path):
    pretrained = tmp_path / 'pretrained.pth'
    net = _tiny(n_classes=10)
    torch.save({'state_dict': {'module.' + k: v for k, v in net.state_dict().items()}}, pretrained)
    main.main(_without_n_classes(_finetune_args(
        tiny_synthetic, tmp_path / 'ft', '--n_epochs', '1', '--pretrain_path', str(pretrained),
        '--ft_begin_module', 'fc')))
    weights = load_checkpoint(tmp_path / 'ft' / 'save_1.pth')['state_dict']
    assert weights['fc.weight'].shape[0] == 6
    assert torch.equal(weights['layer1.0.conv1.weight'], net.state_dict()['layer1.0.conv1.weight'])


def test_help_shows_where_the_class_count_comes_from():
    from opts import build_parser
    text = ' '.join(build_parser().format_help().split())
    assert ("--n-classes N_CLASSES Number of classes (default: the annotation's label count; "
            "3D-ResNets-PyTorch's default was 400). Given, it must equal that count "
            "--n_pretrain_classes") in text  # and no "(default: None)"
