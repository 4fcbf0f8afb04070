"""model.py: building from options, checkpoint round trips for every family,
pretrained loading (predecessor dicts, bare and torchvision state dicts) and
the errors that say which options would match."""
import argparse

import pytest
import torch
import torchvision

from model import build_model, freeze_before, generate_model, load_state_dict_checked, replace_classifier
from opts import parse_opts
from utils.errors import OptionError


def options(**kw):
    base = dict(model='resnet', model_depth=10, n_classes=5, n_input_channels=3,
                conv1_t_size=3, conv1_t_stride=1, no_max_pool=False, resnet_shortcut='B',
                resnet_widen_factor=0.25, wide_resnet_k=1, resnext_cardinality=4, x3d_size='xs',
                pretrain_path=None, n_pretrain_classes=0, inflate_from=None)
    base.update(kw)
    return argparse.Namespace(**base)


FAMILIES = [('resnet', 10), ('resnet2p1d', 10), ('preresnet', 10), ('wideresnet', 50),
            ('resnext', 50), ('densenet', 121), ('r3d_18', 18), ('mc3_18', 18),
            ('r2plus1d_18', 18), ('x3d', None)]


HEAVY_FAMILIES = {'densenet', 'wideresnet', 'resnext', 'r2plus1d_18', 'r3d_18', 'mc3_18'}  # seconds each: `slow`


@pytest.mark.parametrize('name,depth', [pytest.param(n, d, marks=pytest.mark.slow) if n in HEAVY_FAMILIES else (n, d)
                                        for n, d in FAMILIES])
def test_checkpoint_round_trip_for_each_family(name, depth, tmp_path):
    torch.manual_seed(0)
    net = generate_model(options(model=name, model_depth=depth))
    for b in net.buffers():  # non-default BN statistics must round-trip too
        b.add_(1)
    path = tmp_path / 'save_1.pth'
    torch.save({'epoch': 1, 'arch': f'{name}-{depth}',
                'state_dict': {'module.' + k: v for k, v in net.state_dict().items()}}, path)
    other = generate_model(options(model=name, model_depth=depth))
    state = torch.load(path, weights_only=True)['state_dict']
    load_state_dict_checked(other, state, 'test')
    for k, v in net.state_dict().items():
        assert torch.equal(other.state_dict()[k], v), k


def test_unknown_model_and_depth_are_option_errors():
    with pytest.raises(OptionError, match='--model_depth 11'):
        generate_model(options(model_depth=11))
    with pytest.raises(OptionError, match='--model foo'):
        generate_model(options(model='foo'))


def test_class_count_mismatch_names_the_option(tmp_path):
    net = generate_model(options(n_classes=700))
    path = tmp_path / 'k700.pth'
    torch.save({'state_dict': net.state_dict()}, path)
    opt = options(pretrain_path=path, n_pretrain_classes=400)
    with pytest.raises(OptionError, match='700 classes: use --n_pretrain_classes 700'):
        build_model(opt, 5)
    for given in (700, 0):  # 0: read from the file
        model = build_model(options(pretrain_path=path, n_pretrain_classes=given), 5)
        assert model.fc.out_features == 5
    assert torch.equal(model.conv1.weight, net.conv1.weight)


def test_shortcut_mismatch_hints_at_the_right_shortcut(tmp_path):
    net_a = generate_model(options(resnet_shortcut='A', model_depth=18))
    with pytest.raises(OptionError, match='--resnet_shortcut A') as exc:
        load_state_dict_checked(generate_model(options(model_depth=18)), net_a.state_dict(),
                                'ckpt', options(model_depth=18))
    assert 'missing keys' in str(exc.value)


@pytest.mark.slow
def test_torchvision_weights_load_as_pretrained(tmp_path):
    """--model r3d_18 --pretrain_path <torchvision's .pth> (a bare state_dict)."""
    torch.manual_seed(0)
    tv = torchvision.models.video.r3d_18()
    path = tmp_path / 'r3d_18-b3b3357e.pth'
    torch.save(tv.state_dict(), path)
    model = build_model(options(model='r3d_18', pretrain_path=path, n_pretrain_classes=400), 7)
    assert model.fc.out_features == 7
    assert torch.equal(model.stem[0].weight, tv.stem[0].weight)


def test_s3d_classifier_is_replaced():
    from models import torchvision_video
    if 's3d' not in torchvision_video.TORCHVISION_MODELS:
        pytest.skip('s3d not offered')
    with torch.device('meta'):
        net = generate_model(options(model='s3d', n_classes=400))
        net = replace_classifier(net, 's3d', 9)
    assert net.classifier[1].out_channels == 9


def test_ft_begin_module_names_for_densenet():
    net = generate_model(options(model='densenet', model_depth=121))
    frozen = freeze_before(net, 'denseblock4')
    assert frozen[:2] == ('conv1', 'norm1') and 'transition3' in frozen
    assert not net.features.denseblock3.denselayer1.conv1.weight.requires_grad
    assert net.features.denseblock4.denselayer1.conv1.weight.requires_grad
    assert net.classifier.weight.requires_grad


def test_synthetic_presets_yield_to_explicit_options():
    opt = parse_opts(['--dataset', 'synthetic', '--result_path', 'r', '--model_depth', '18'])
    assert opt.model_depth == 18 and opt.n_classes is None and opt.no_hflip  # the annotation's 6
    opt = parse_opts(['--dataset', 'ucf101', '--result_path', 'r', '--video_path', 'v',
                      '--annotation_path', 'a.json'])
    assert opt.n_classes is None and opt.model_depth == 18 and not opt.no_hflip  # 400 before


def test_predecessor_defaults_and_aliases():
    opt = parse_opts(['--result_path', 'r', '--video-path', 'v', '--annotation_path', 'a.json',
                      '--root_path', '/data'])
    assert str(opt.video_path) == '/data/v' and str(opt.result_path) == '/data/r'
    assert (opt.learning_rate, opt.momentum, opt.weight_decay, opt.batch_size, opt.n_epochs,
            opt.sample_size, opt.sample_duration, opt.n_val_samples, opt.checkpoint,
            opt.multistep_milestones, opt.train_crop_min_scale, opt.inference_stride,
            opt.output_topk, opt.dist_url, opt.world_size) == \
        (0.1, 0.9, 1e-3, 128, 200, 112, 16, 3, 10, [50, 100, 150], 0.25, 16, 5,
         'tcp://127.0.0.1:23456', -1)
