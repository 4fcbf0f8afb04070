"""--inflate_from (utils/inflate.py): a 3D ResNet started from a 2D ImageNet ResNet.
The I3D property (a static clip gives the 2D network's features: exactly with
replicate padding, in the interior frames with the real zero padding), copied
BatchNorm, the refusals and the one-line summary, and a main.py run from a
2D file, then resumed (the checkpoint wins). The 2D networks are torchvision's builders, randomly initialised."""
import argparse
import copy
import sys

import pytest
import torch
import torch.nn as nn
import torchvision
from torchvision.models.resnet import BasicBlock as BasicBlock2d
from torchvision.models.resnet import Bottleneck as Bottleneck2d

import main
from datasets.spatial_transforms import get_mean_std
from model import build_model
from models import resnet, resnext, wide_resnet
from opts import parse_opts
from tests.conftest import tiny_args
from utils.checkpoint import load_checkpoint
from utils.errors import CheckpointError, OptionError
from utils.inflate import depth_of_2d, inflate_into, inflate_kernel, load_2d_state_dict


def options(**kw):
    base = dict(model='resnet', model_depth=18, n_classes=5, n_input_channels=3, conv1_t_size=7,
                conv1_t_stride=1, no_max_pool=False, resnet_shortcut='B', resnet_widen_factor=1.0,
                wide_resnet_k=2, resnext_cardinality=32, pretrain_path=None, n_pretrain_classes=0,
                inflate_from=None, mean_dataset='imagenet')
    base.update(kw)
    return argparse.Namespace(**base)


def perturbed(net):
    """Random BN weights and running statistics: an initialised BN (1, 0, mean 0,
    var 1) would pass a copy test whether or not anything was copied."""
    generator = torch.Generator().manual_seed(1)
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            for tensor, low, high in ((m.weight.data, 0.5, 1.5), (m.bias.data, -0.2, 0.2),
                                      (m.running_mean, -0.3, 0.3), (m.running_var, 0.5, 2.0)):
                tensor.copy_(torch.empty(tensor.shape).uniform_(low, high, generator=generator))
            m.num_batches_tracked.fill_(7)
    return net.eval()


def resnet10_2d():
    torch.manual_seed(0)
    return perturbed(torchvision.models.resnet.ResNet(BasicBlock2d, [1, 1, 1, 1]))


@pytest.fixture(scope='module')
def resnet18_file(tmp_path_factory):
    torch.manual_seed(0)
    net = perturbed(torchvision.models.resnet18(weights=None))
    path = tmp_path_factory.mktemp('inflate') / 'resnet18.pth'
    torch.save(net.state_dict(), path)
    return net, path


@pytest.fixture(scope='module')
def resnet10_file(tmp_path_factory):
    net = resnet10_2d()
    path = tmp_path_factory.mktemp('inflate') / 'resnet10.pth'
    torch.save({'model': net.state_dict(), 'epoch': 90}, path)  # timm-style wrapping
    return net, path


def static_clip(image, frames):
    return image.unsqueeze(2).expand(-1, -1, frames, -1, -1).contiguous()


def replicate_padding(*nets):
    """Every conv pads by repeating its border: the clip's first and last frames
    then see a static neighbourhood too, and the property holds at every frame."""
    for net in nets:
        for m in net.modules():
            if isinstance(m, (nn.Conv2d, nn.Conv3d)):
                m.padding_mode = 'replicate'


def pooled_2d(net, image):
    x = net.maxpool(net.relu(net.bn1(net.conv1(image))))
    x = net.layer4(net.layer3(net.layer2(net.layer1(x))))
    return torch.flatten(net.avgpool(x), 1)


def test_static_clip_gives_the_2d_features_and_bn_is_copied(resnet18_file):
    net2d, path = resnet18_file
    net3d = build_model(options(inflate_from=path), 5).eval()
    for key, value in net2d.state_dict().items():
        if 'bn' in key or 'downsample.1' in key:
            assert torch.equal(net3d.state_dict()[key], value), key
    net2d = copy.deepcopy(net2d)  # the module's file fixture stays as saved
    replicate_padding(net2d, net3d)
    net2d, net3d = net2d.double(), net3d.double()  # float32 rounding would hide no bug, but blurs the bound
    image = torch.randn(1, 3, 64, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        features_2d = pooled_2d(net2d, image)
        features_3d = torch.flatten(net3d.avgpool(net3d.forward_features(static_clip(image, 8))), 1)
    assert features_2d.abs().mean() > 0.1  # not a trivially small signal
    torch.testing.assert_close(features_3d, features_2d, rtol=0, atol=1e-4)


def test_zero_padding_keeps_the_property_away_from_the_temporal_edges(resnet18_file):
    net2d, path = resnet18_file
    net3d = build_model(options(inflate_from=path), 5).eval()
    image = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    clip = static_clip(image, 12)
    with torch.no_grad():
        stem_2d, stem_3d = net2d.relu(net2d.bn1(net2d.conv1(image))), net3d.stem(clip)
        block_2d, block_3d = net2d.layer1[0](stem_2d), net3d.layer1[0](static_clip(stem_2d, 12))
    # conv1 spans 7 frames: 3 at each end see zeros; the block's two 3x3x3 convs 1 each, twice.
    for out_3d, out_2d, edge in ((stem_3d, stem_2d, 3), (block_3d, block_2d, 2)):
        for t in range(edge, 12 - edge):
            torch.testing.assert_close(out_3d[:, :, t], out_2d, rtol=0, atol=1e-4)
        assert (out_3d[:, :, 0] - out_2d).abs().max() > 1e-2  # the edge caveat is real


def test_bottleneck_block_with_strided_shortcut_inflates_exactly():
    torch.manual_seed(0)
    shortcut_2d = nn.Sequential(nn.Conv2d(64, 64, 1, stride=2, bias=False), nn.BatchNorm2d(64))
    block_2d = perturbed(Bottleneck2d(64, 16, stride=2, downsample=shortcut_2d)).double()
    block_3d = resnet.Bottleneck(64, 16, stride=2, downsample=resnet.make_shortcut(64, 64, 2, 'B'))
    inflation = inflate_into(block_3d, block_2d.state_dict(), 'block', 'resnet')
    assert len(inflation.inflated) == 4 and inflation.new == ()
    block_3d = block_3d.double().eval()
    x = torch.randn(1, 64, 16, 16, dtype=torch.float64).relu()
    with torch.no_grad():
        out_2d, out_3d = block_2d(x), block_3d(static_clip(x, 8))
    for t in range(1, 4):  # 4 output frames (stride 2): only the first one's window reaches the padding
        torch.testing.assert_close(out_3d[:, :, t], out_2d, rtol=0, atol=1e-4)
    replicate_padding(block_2d, block_3d)
    with torch.no_grad():
        out_2d, out_3d = block_2d(x), block_3d(static_clip(x, 8))
    torch.testing.assert_close(out_3d, static_clip(out_2d, 4), rtol=0, atol=1e-4)


def test_kernels_are_repeated_and_divided_by_the_temporal_size():
    kernel = torch.randn(4, 3, 3, 3)
    inflated = inflate_kernel(kernel, 5)
    assert inflated.shape == (4, 3, 5, 3, 3)
    for t in range(5):
        assert torch.equal(inflated[:, :, t], kernel / 5)


def test_the_summary_line_counts_what_came_from_where(resnet10_file):
    _, path = resnet10_file
    lines = []
    build_model(options(model_depth=10, inflate_from=path, mean_dataset='kinetics'), 5, report=lines.append)
    assert lines == [f'--inflate_from {path}: 12 conv kernels inflated (3 1x1 to 1x1x1, 8 3x3 to 3x3x3, '
                     f'1 7x7 to 7x7x7: each repeated over time and divided by the temporal size), '
                     f'60 BatchNorm tensors copied, 2 left new (fc.weight, fc.bias); ImageNet weights '
                     f'expect ImageNet-normalised input: --mean_dataset imagenet']


def test_depth_mismatch_is_one_line_naming_both_depths(resnet10_file):
    _, path = resnet10_file
    with pytest.raises(OptionError) as error:
        build_model(options(model_depth=18, inflate_from=path), 5)
    assert str(error.value) == f'--inflate_from {path} is a ResNet-10; use --model_depth 10 (not 18)'


def test_depths_are_told_from_torchvisions_builders():
    with torch.device('meta'):
        for depth in (18, 34, 50, 101, 152):
            state = getattr(torchvision.models, f'resnet{depth}')().state_dict()
            assert depth_of_2d(state)[0] == depth
        assert depth_of_2d(torchvision.models.wide_resnet101_2().state_dict())[0] == 101


@pytest.mark.parametrize('model', ['resnet2p1d', 'preresnet', 'densenet', 'r2plus1d_18'])
def test_families_that_cannot_take_2d_weights_are_refused_before_reading(model, tmp_path):
    with pytest.raises(OptionError) as error:
        build_model(options(model=model, inflate_from=tmp_path / 'never-read.pth'), 5)
    message = str(error.value)
    expected = 'inflate into --model resnet' if model in ('resnet2p1d', 'preresnet') else f'not --model {model}'
    assert '\n' not in message and expected in message
    if model == 'resnet2p1d':
        assert 'R(2+1)D cannot hold 2D kernels exactly' in message and '--pretrain_path' in message


@pytest.mark.parametrize('name,ours,hint', [
    ('wide_resnet50_2', lambda: wide_resnet.generate_model(50, k=2), 'stem is 64 x k wide'),
    ('resnext50_32x4d', lambda: resnext.generate_model(50), '128-wide stem'),
    ('resnext101_32x8d', lambda: resnext.generate_model(101), '128-wide stem')])
def test_torchvisions_wide_and_resnext_layouts_do_not_fit_ours(name, ours, hint):
    """Checked on shapes alone (meta tensors): nothing is allocated or loaded."""
    family = 'wideresnet' if name.startswith('wide') else 'resnext'
    with torch.device('meta'):
        state_2d, model = getattr(torchvision.models, name)().state_dict(), ours()
    with pytest.raises(OptionError) as error:
        inflate_into(model, state_2d, name, family)
    assert f'{name} does not fit --model {family}: conv1.weight is (64, 3, 7, 7) there, (128, 3, 7, 7, 7) ' \
           f'here' in str(error.value) and hint in str(error.value)


def test_mismatched_options_get_a_hint(resnet10_file):
    _, path = resnet10_file
    for given, hint in ((dict(resnet_widen_factor=0.5), 'use --resnet_widen_factor 1'),
                        (dict(resnet_shortcut='A'), 'use --resnet_shortcut B'),
                        (dict(n_input_channels=2), 'use --input_type rgb')):
        with pytest.raises(OptionError, match=hint):
            build_model(options(model_depth=10, inflate_from=path, **given), 5)


def test_file_forms(tmp_path, monkeypatch):
    weights = {'conv1.weight': torch.ones(2, 3, 1, 1)}
    torch.save({'state_dict': {'module.' + k: v for k, v in weights.items()}}, tmp_path / 'ddp.pth')
    assert load_2d_state_dict(tmp_path / 'ddp.pth').keys() == weights.keys()
    torch.save([1, 2], tmp_path / 'list.pth')
    with pytest.raises(CheckpointError, match='holds no state dict'):
        load_2d_state_dict(tmp_path / 'list.pth')
    monkeypatch.setitem(sys.modules, 'safetensors', None)  # as if not installed
    monkeypatch.setitem(sys.modules, 'safetensors.torch', None)
    with pytest.raises(CheckpointError, match='safetensors package is not installed: pip install'):
        load_2d_state_dict(tmp_path / 'resnet.safetensors')


def test_safetensors_file_when_the_package_is_installed(tmp_path):
    save_file = pytest.importorskip('safetensors.torch').save_file
    weights = {'conv1.weight': torch.randn(2, 3, 1, 1)}
    save_file(weights, str(tmp_path / 'resnet.safetensors'))
    assert torch.equal(load_2d_state_dict(tmp_path / 'resnet.safetensors')['conv1.weight'],
                       weights['conv1.weight'])


def test_a_resumed_run_does_not_read_the_2d_file(tmp_path):
    model = build_model(options(model_depth=10, inflate_from=tmp_path / 'gone.pth'), 5, pretrained=False)
    assert model.fc.out_features == 5


def test_imagenet_normalisation_is_torchvisions():
    preset = torchvision.models.ResNet18_Weights.IMAGENET1K_V1.transforms()  # no download
    assert get_mean_std(1, 'imagenet') == (list(preset.mean), list(preset.std))


def test_inflate_from_with_pretrain_path_is_one_error_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_opts(['--dataset', 'synthetic', '--result_path', str(tmp_path),
                    '--inflate_from', 'a.pth', '--pretrain_path', 'b.pth'])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and err.startswith('error: --inflate_from and --pretrain_path both')


@pytest.mark.slow  # whole trainings
def test_a_run_trains_from_the_inflated_weights_and_resumes_from_its_checkpoint(
        tiny_synthetic, tmp_path, resnet10_file, capsys, no_curves, one_torch_thread):
    net2d, path = resnet10_file
    args = ('--no_val', '--resnet_widen_factor', '1', '--mean_dataset', 'imagenet', '--ft_begin_module', 'layer4')
    main.main(tiny_args(*tiny_synthetic, tmp_path, '--n_epochs', '1', *args, '--inflate_from', str(path)))
    assert f'--inflate_from {path}: 12 conv kernels inflated' in capsys.readouterr().out
    trained = load_checkpoint(tmp_path / 'save_1.pth')['state_dict']
    # frozen: exactly the inflated and copied tensors; layer4 trained from them
    assert torch.equal(trained['conv1.weight'], inflate_kernel(net2d.conv1.weight, 7))
    assert torch.equal(trained['layer3.0.bn1.running_var'], net2d.layer3[0].bn1.running_var)
    inflated = inflate_kernel(net2d.layer4[0].conv1.weight, 3)
    assert not torch.equal(trained['layer4.0.conv1.weight'], inflated)
    assert (trained['layer4.0.conv1.weight'] - inflated).abs().max() < 0.1
    # Resumed, the checkpoint wins: the 2D file (gone now) is not read.
    main.main(tiny_args(*tiny_synthetic, tmp_path, '--n_epochs', '2', *args, '--inflate_from',
                        str(tmp_path / 'gone.pth'), '--resume_path', str(tmp_path / 'save_1.pth')))
    assert '--inflate_from' not in capsys.readouterr().out
    assert torch.equal(load_checkpoint(tmp_path / 'save_2.pth')['state_dict']['conv1.weight'],
                       trained['conv1.weight'])
