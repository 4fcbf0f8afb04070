"""Network definitions: checkpoint compatibility with the predecessor and
torchvision, the type-A shortcut, small/odd inputs, memory formats, autocast,
torch.compile and FLOP counting.

tests/data/peer_models.json.gz holds, per predecessor configuration, its options,
parameter count and ordered state_dict [key, shape] list (plus torchvision's
r3d_18, mc3_18 and r2plus1d_18), derived from the project spec.
"""
import argparse
import gzip
import json
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

import model as model_builder
from models import densenet, pre_act_resnet, resnet, resnet2p1d, resnext, torchvision_video, wide_resnet, x3d
from models.resnet import ZeroPadShortcut
from tests.conftest import OneStageResNet
from utils.flops import count_gflops, count_parameters

PEER = json.loads(gzip.decompress((Path(__file__).parent / 'data' / 'peer_models.json.gz').read_bytes()))


@pytest.fixture(autouse=True, scope='module')
def single_thread():
    # The tensors here are tiny: one thread is as fast, and far faster when other processes
    # load the CPU (OpenMP threads waiting on each other); restored for other test modules.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def build_from_options(o: dict) -> nn.Module:
    """Build a network from the predecessor's options (the same names as ours) through
    model.py's family table, the path a run takes."""
    return model_builder.generate_model(argparse.Namespace(**o))


def key_shapes(model: nn.Module) -> list:
    return [[k, list(v.shape)] for k, v in model.state_dict().items()]


# --- checkpoint compatibility ----------------------------------------------------------------

@pytest.mark.parametrize('config', sorted(PEER['configs']))
def test_state_dict_matches_predecessor(config):
    """Ordered keys and shapes (BN buffers included) and parameter count equal the
    predecessor's, so its checkpoints load with strict=True."""
    expected = PEER['configs'][config]
    with torch.device('meta'):  # shapes only: no allocation, no init
        model = build_from_options(expected['options'])
    assert key_shapes(model) == expected['state_dict']
    assert count_parameters(model) == expected['n_params']


@pytest.mark.parametrize('name', sorted(PEER['torchvision']))
def test_torchvision_state_dict(name):
    expected = PEER['torchvision'][name]
    with torch.device('meta'):
        model = torchvision_video.generate_model(name)
    assert key_shapes(model) == expected['state_dict']
    assert count_parameters(model) == expected['n_params']


@pytest.mark.slow
def test_torchvision_r3d_18_weights_load_strict():
    torch.manual_seed(0)
    reference = torchvision.models.video.r3d_18()
    ours = torchvision_video.generate_model('r3d_18')
    ours.load_state_dict(reference.state_dict(), strict=True)
    x = torch.randn(1, 3, 4, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(x), reference.eval()(x))


def test_top_level_names_and_classifiers():
    # The lead's --ft_begin_module freezes top-level children before a named one and
    # fine-tuning replaces `fc` / `classifier`.
    with torch.device('meta'):
        r = resnet.generate_model(18, no_max_pool=True)
        r2 = resnet2p1d.generate_model(18)
        d = densenet.generate_model(121)
    assert list(r._modules) == ['conv1', 'bn1', 'relu', 'maxpool', 'layer1', 'layer2', 'layer3', 'layer4',
                                'avgpool', 'fc']
    assert list(r2._modules) == ['conv1_s', 'bn1_s', 'conv1_t', 'bn1_t', 'relu', 'maxpool',
                                 'layer1', 'layer2', 'layer3', 'layer4', 'avgpool', 'fc']
    assert list(d._modules) == ['features', 'classifier']
    assert list(d.features._modules) == [
        'conv1', 'norm1', 'relu1', 'pool1', 'denseblock1', 'transition1', 'denseblock2', 'transition2',
        'denseblock3', 'transition3', 'denseblock4', 'norm5']
    for model in (r, r2):
        assert isinstance(model.fc, nn.Linear)
    assert isinstance(d.classifier, nn.Linear)


@pytest.mark.parametrize('name', torchvision_video.TORCHVISION_MODELS)
def test_torchvision_classifier_name(name):
    with torch.device('meta'):
        model = torchvision_video.generate_model(name, n_classes=7)
    head = model.get_submodule(torchvision_video.classifier_name(name))
    assert isinstance(head, (nn.Linear, nn.Conv3d))
    assert (head.out_features if isinstance(head, nn.Linear) else head.out_channels) == 7


def test_unknown_depth_or_name_raises():
    with pytest.raises(ValueError):
        resnet.generate_model(19)
    with pytest.raises(ValueError):
        wide_resnet.generate_model(18)
    with pytest.raises(ValueError):
        resnet.generate_model(18, shortcut_type='C')
    for family in (resnet, resnet2p1d, pre_act_resnet, wide_resnet, resnext, densenet):
        # The stem arguments pass through **kwargs: a misspelt one is still refused, by name.
        with pytest.raises(TypeError, match='no_maxpool'), torch.device('meta'):
            family.generate_model(121 if family is densenet else 50, no_maxpool=True)
    with pytest.raises(ValueError):
        torchvision_video.generate_model('r3d_34')


def test_init():
    torch.manual_seed(0)
    model = resnet.generate_model(10, widen_factor=0.25)
    w = model.layer1[0].conv1.weight  # 16 -> 16, 3x3x3: kaiming fan_out std sqrt(2 / (16 * 27))
    assert abs(w.std().item() / (2 / (16 * 27)) ** 0.5 - 1) < 0.1
    for m in model.modules():
        if isinstance(m, nn.BatchNorm3d):
            assert torch.all(m.weight == 1) and torch.all(m.bias == 0)


# --- shortcut A ----------------------------------------------------------------------------------

def test_shortcut_a_values_and_gradient():
    """Equals the predecessor's avg_pool3d(kernel 1, stride) + zero channels, and passes gradients."""
    x = torch.randn(2, 4, 5, 6, 7, requires_grad=True)
    out = ZeroPadShortcut(out_planes=10, stride=2)(x)
    expected = F.avg_pool3d(x.detach(), kernel_size=1, stride=2)
    assert out.shape == (2, 10, 3, 3, 4)
    torch.testing.assert_close(out[:, :4], expected)
    assert torch.all(out[:, 4:] == 0)
    out.sum().backward()
    mask = torch.zeros_like(x)
    mask[:, :, ::2, ::2, ::2] = 1
    torch.testing.assert_close(x.grad, mask)
    assert list(ZeroPadShortcut(10, 2).state_dict()) == []


@pytest.mark.parametrize('family,depth', [('resnet', 18), ('resnet', 50), ('resnet2p1d', 18),
                                          ('preresnet', 18), ('preresnet', 50)])
def test_shortcut_a_gradient_reaches_stem(family, depth):
    """With every residual branch zeroed, the stem only reaches the output through the
    shortcuts (type A where width changes): its gradient must not vanish."""
    module = {'resnet': resnet, 'resnet2p1d': resnet2p1d, 'preresnet': pre_act_resnet}[family]
    model = module.generate_model(depth, n_classes=5, widen_factor=0.125, shortcut_type='A')
    assert any(isinstance(m, ZeroPadShortcut) for m in model.modules())
    with torch.no_grad():
        for name in ('layer1', 'layer2', 'layer3', 'layer4'):
            for p in getattr(model, name).parameters():
                p.zero_()
    model(torch.randn(2, 3, 8, 32, 32)).sum().backward()
    stem = model.conv1 if family != 'resnet2p1d' else model.conv1_s
    assert stem.weight.grad is not None and stem.weight.grad.abs().sum() > 0


def test_shortcut_a_follows_device_and_dtype():
    x = torch.randn(1, 4, 4, 4, 4, dtype=torch.float64)
    assert ZeroPadShortcut(8, 2)(x).dtype == torch.float64
    y = ZeroPadShortcut(8, 2)(torch.empty(1, 4, 4, 4, 4, device='meta'))
    assert y.device.type == 'meta' and y.shape == (1, 8, 2, 2, 2)

    model = resnet.generate_model(10, n_classes=5, widen_factor=0.125, shortcut_type='A').eval()
    out = model.double()(torch.randn(2, 3, 8, 32, 32, dtype=torch.float64))
    assert out.dtype == torch.float64 and out.shape == (2, 5)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = model.float()(torch.randn(2, 3, 8, 32, 32))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()
    with torch.device('meta'):
        meta_model = resnet.generate_model(34, n_classes=5, shortcut_type='A')
        assert meta_model(torch.empty(2, 3, 16, 112, 112)).shape == (2, 5)


# --- forward on small clips ------------------------------------------------------------------------

SMALL_MODELS = {
    'resnet-10': lambda **kw: resnet.generate_model(10, widen_factor=0.25, **kw),
    'resnet-18_A': lambda **kw: resnet.generate_model(18, widen_factor=0.125, shortcut_type='A', **kw),
    'resnet-50_t3_nomaxpool': lambda **kw: resnet.generate_model(
        50, widen_factor=0.125, conv1_t_size=3, no_max_pool=True, **kw),
    'resnet2p1d-18': lambda **kw: resnet2p1d.generate_model(18, widen_factor=0.125, **kw),
    'resnet2p1d-50_A': lambda **kw: resnet2p1d.generate_model(50, widen_factor=0.125, shortcut_type='A', **kw),
    'preresnet-18': lambda **kw: pre_act_resnet.generate_model(18, widen_factor=0.125, **kw),
    'preresnet-50_A': lambda **kw: pre_act_resnet.generate_model(50, widen_factor=0.125, shortcut_type='A', **kw),
    'wideresnet-50': lambda **kw: wide_resnet.generate_model(50, k=0.125, **kw),
    'resnext-50_c8': lambda **kw: resnext.generate_model(50, cardinality=8, **kw),
    'densenet-121': lambda **kw: densenet.generate_model(121, **kw),
    'r3d_18': lambda **kw: torchvision_video.generate_model('r3d_18', **kw),
    'mc3_18': lambda **kw: torchvision_video.generate_model('mc3_18', **kw),
    'r2plus1d_18': lambda **kw: torchvision_video.generate_model('r2plus1d_18', **kw),
    's3d': lambda **kw: torchvision_video.generate_model('s3d', **kw),
    'swin3d_t': lambda **kw: torchvision_video.generate_model('swin3d_t', **kw),
    'x3d-xs': lambda **kw: x3d.generate_model('xs', **kw),  # full width: 0.1 GFLOPs at 8x32x32
}


# Full-width networks take seconds a forward pass here: CI runs them, `pytest -m "not slow"` skips them.
HEAVY_MODELS = {'r3d_18', 'mc3_18', 'r2plus1d_18', 's3d', 'swin3d_t', 'resnext-50_c8', 'densenet-121'}


@pytest.mark.parametrize('name', [pytest.param(n, marks=pytest.mark.slow) if n in HEAVY_MODELS else n
                                  for n in sorted(SMALL_MODELS)])
def test_small_clip_forward(name):
    """8x32x32 clips (stages shrink T to 1) give (N, n_classes) logits; channels_last_3d gives
    the same result as contiguous input; bf16 autocast works, on one 8x16x16 clip (s3d's
    pooling needs 32): a CPU without bf16 instructions takes 8 s an 8x32x32 clip through
    a full-width network, 50 times fp32's time."""
    torch.manual_seed(0)
    model = SMALL_MODELS[name](n_classes=5).eval()
    x = torch.randn(2, 3, 8, 32, 32)
    with torch.no_grad():
        out = model(x)
        assert out.shape == (2, 5) and torch.isfinite(out).all()
        out_cl = model.to(memory_format=torch.channels_last_3d)(x.to(memory_format=torch.channels_last_3d))
        torch.testing.assert_close(out_cl, out, rtol=1e-4, atol=1e-4 * out.abs().max().item())
        with torch.autocast('cpu', dtype=torch.bfloat16):
            out_bf16 = model(x[:1] if name == 's3d' else x[:1, :, :, :16, :16])
    assert out_bf16.shape == (1, 5) and torch.isfinite(out_bf16.float()).all()


def test_training_step_updates_all_parameters():
    model = resnet2p1d.generate_model(10, n_classes=5, widen_factor=0.125, shortcut_type='A')
    model(torch.randn(2, 3, 8, 32, 32)).logsumexp(1).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


@pytest.mark.parametrize('name', [pytest.param(n, marks=pytest.mark.slow) if n in HEAVY_MODELS else n
                                  for n in ['resnet-10', 'resnet2p1d-18', 'preresnet-18', 'densenet-121', 'x3d-xs',
                                            'r3d_18', 'r2plus1d_18', 's3d', 'swin3d_t']])
def test_flow_input(name):
    """Two-channel (optical flow) input."""
    model = SMALL_MODELS[name](n_classes=5, n_input_channels=2).eval()
    with torch.no_grad():
        assert model(torch.randn(2, 2, 8, 32, 32)).shape == (2, 5)


def test_flow_resnet2p1d_stem_width_as_predecessor():
    # The predecessor sizes the stem's mid width for 3 channels whatever the input is.
    with torch.device('meta'):
        model = resnet2p1d.generate_model(18, n_input_channels=2)
    assert model.conv1_s.weight.shape == (110, 2, 1, 7, 7)


def test_mvit_v2_s_fixed_size_forward_on_meta():
    with torch.device('meta'):
        model = torchvision_video.generate_model('mvit_v2_s', n_classes=5).eval()
        assert model(torch.empty(1, 3, 16, 224, 224)).shape == (1, 5)


# --- torch.compile ------------------------------------------------------------------------------------

needs_dynamo = pytest.mark.skipif(not torch._dynamo.is_dynamo_supported(),
                                  reason='torch.compile is not supported on this Python')


@needs_dynamo
@pytest.mark.parametrize('name', ['resnet-18_A', 'resnet2p1d-18', 'preresnet-18', 'densenet-121'])
@pytest.mark.slow
def test_compiles_without_graph_breaks(name):
    """fullgraph=True fails on any graph break; the eager backend keeps this to Dynamo's
    tracing (inductor code generation takes minutes on a small CPU)."""
    torch._dynamo.reset()
    model = SMALL_MODELS[name](n_classes=5).eval()
    x = torch.randn(2, 3, 8, 32, 32)
    compiled = torch.compile(model, backend='eager', fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    torch._dynamo.reset()


@needs_dynamo
@pytest.mark.slow
@pytest.mark.usefixtures('inductor_in_process')
def test_inductor_compile_train_step():
    """Inductor's code generation on the network pieces, the type-A shortcut included, in one
    graph; a one-stage network at 4 and 8 channels keeps it to seconds (resnet-18: minutes)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = OneStageResNet(n_classes=5, shortcut_type='A')
    assert isinstance(model.layer1[0].downsample, ZeroPadShortcut)
    x = torch.randn(2, 3, 4, 16, 16)
    out = torch.compile(model, fullgraph=True)(x)
    out.sum().backward()
    assert out.shape == (2, 5) and model.conv1.weight.grad is not None
    torch._dynamo.reset()


# --- FLOPs -----------------------------------------------------------------------------------------------

def test_gflops_single_conv_exact():
    conv = nn.Conv3d(3, 8, 3, padding=1)
    # Every output element (8 x 4x8x8) takes 3 * 27 multiply-adds, counted as 2 FLOPs each.
    expected = 2 * 8 * 4 * 8 * 8 * 3 * 27
    assert round(count_gflops(conv, (3, 4, 8, 8)) * 1e9) == expected
    assert round(count_gflops(conv, (1, 3, 4, 8, 8)) * 1e9) == expected


def test_gflops_networks():
    # torchvision publishes multiply-adds: 40.697 "GFLOPS" for r3d_18 at 16x112x112; we count 2 per MAC.
    with torch.device('meta'):
        r3d = torchvision_video.generate_model('r3d_18')
    assert count_gflops(r3d, (3, 16, 112, 112)) == pytest.approx(2 * 40.697, rel=1e-4)

    # A real model is counted on fake tensors: same number, mode restored, nothing computed.
    model = resnet.generate_model(18)
    gflops = count_gflops(model, (3, 16, 112, 112))
    assert 10 < gflops < 30 and model.training
    with torch.device('meta'):
        assert count_gflops(resnet.generate_model(18), (3, 16, 112, 112)) == gflops
    with pytest.raises(ValueError):
        count_gflops(model, (2, 3, 16, 112, 112))
