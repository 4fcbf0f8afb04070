"""--model x3d against PyTorchVideo's create_x3d as its hub builds x3d_xs/s/m/l:
equal state-dict keys and shapes, its weights loaded strict giving its output,
its checkpoints ({'model_state': ...}) through --pretrain_path, the per-size
defaults of parse_opts, --ft_begin_module, and a trained x3d exported to ONNX."""
import argparse
import contextlib
import io
import json
import warnings

import pytest
import torch
import torch.nn as nn

import main
import predict
from model import build_model, freeze_before, generate_model, keep_frozen_eval
from models import x3d
from opts import parse_opts
from tests.conftest import skip_curves, tiny_args
from util_scripts import export, model_summary
from utils.errors import OptionError
from utils.flops import count_parameters

pytestmark = pytest.mark.usefixtures('one_torch_thread')


@pytest.fixture(scope='module')
def create_x3d():
    """PyTorchVideo's builder (requirements-dev.txt): the reference network."""
    with warnings.catch_warnings():
        # pytorchvideo 0.1.5 calls torch.jit.script at import, a FutureWarning in torch 2.x
        warnings.simplefilter('ignore', FutureWarning)
        return pytest.importorskip('pytorchvideo.models.x3d').create_x3d


def reference(create_x3d, size, clip_length=None, crop_size=None):
    """PyTorchVideo's network as hub.x3d_<size> builds it (pooling sized for the
    clip given, by default the size's own), its BatchNorm randomised so that
    every block counts (its init zeroes each bottleneck's last BN), in eval mode."""
    spec = x3d.SIZES[size]
    net = create_x3d(input_clip_length=clip_length or spec.clip_length,
                           input_crop_size=crop_size or spec.crop_size, depth_factor=spec.depth_factor)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm3d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.1)
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
        net.blocks[-1].proj.weight.normal_(0, 0.1)
    return net.eval()


def shapes(model):
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def options(**kw):
    base = dict(model='x3d', x3d_size='xs', n_classes=5, n_input_channels=3, pretrain_path=None,
                n_pretrain_classes=0, inflate_from=None)
    return argparse.Namespace(**{**base, **kw})


@pytest.mark.parametrize('size', list(x3d.SIZES))
def test_keys_shapes_and_parameters_equal_pytorchvideo(create_x3d, size):
    spec = x3d.SIZES[size]
    with torch.device('meta'):
        theirs = create_x3d(input_clip_length=spec.clip_length, input_crop_size=spec.crop_size,
                            depth_factor=spec.depth_factor)
        ours = x3d.generate_model(size)
    assert list(shapes(ours).items()) == list(shapes(theirs).items())  # in order too
    # XS, S and M are one network (they differ in the clip); L is deeper
    assert count_parameters(ours) == count_parameters(theirs) == (6153384 if size == 'l' else 3794274)
    assert x3d.sizes_matching(ours.state_dict()) == (('l',) if size == 'l' else ('xs', 's', 'm'))


@pytest.mark.parametrize('size,clip_length,crop_size', [
    ('xs', 4, 64),  # reduced crops: fast
    ('l', 4, 64),
    ('xs', 4, 160),  # the sizes' own clips (0.2 s and 0.6 s a forward pass)
    ('s', 13, 160),
])
def test_pytorchvideo_weights_give_its_output(create_x3d, size, clip_length, crop_size):
    """Its state dict loads strict; our logits are its output before its softmax, and
    their softmax its output (eval mode, float32)."""
    torch.manual_seed(0)
    theirs = reference(create_x3d, size, clip_length, crop_size)
    ours = x3d.generate_model(size).eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    x = torch.randn(2, 3, clip_length, crop_size, crop_size)
    with torch.no_grad():
        logits = ours(x)
        probabilities = theirs(x)
        theirs.blocks[-1].activation = None
        their_logits = theirs(x)
    assert logits.shape == (2, 400) and their_logits.shape == (2, 400)
    assert logits.std() > 0.1  # the comparison sees differences
    assert (logits - their_logits).abs().max().item() <= 1e-5
    assert (torch.softmax(logits, 1) - probabilities).abs().max().item() <= 1e-6


def test_pytorchvideo_checkpoint_through_pretrain_path(create_x3d, tmp_path):
    """A file like X3D_XS.pyth ({'model_state': ...}, 400 classes): loaded strict, the
    classifier replaced by a fresh one with the run's classes, the rest its weights."""
    torch.manual_seed(0)
    theirs = reference(create_x3d, 'xs')
    path = tmp_path / 'X3D_XS.pyth'
    torch.save({'model_state': theirs.state_dict(), 'epoch': 300}, path)
    for given in (400, 0):  # 0: as many classes as its classifier has
        model = build_model(options(pretrain_path=path, n_pretrain_classes=given), 7)
        assert model.blocks[5].proj.out_features == 7
        own = model.state_dict()
        assert all(torch.equal(own[k], v) for k, v in theirs.state_dict().items() if 'proj' not in k)
    model.eval()
    x = torch.randn(1, 3, 4, 160, 160)
    with torch.no_grad():  # the features the new classifier reads are PyTorchVideo's
        features = model.blocks[5].pool(model.forward_features(x))
        their_features = x
        for block in theirs.blocks[:5]:
            their_features = block(their_features)
        their_features = theirs.blocks[5].pool(their_features)
    assert features.shape == (1, 2048, 1, 1, 1) and features.std() > 0.1
    torch.testing.assert_close(features, their_features, rtol=0, atol=1e-5)
    with pytest.raises(OptionError, match='400 classes: use --n_pretrain_classes 400'):
        build_model(options(pretrain_path=path, n_pretrain_classes=600), 7)


def test_wrong_size_names_the_right_one(tmp_path):
    path = tmp_path / 'X3D_XS.pyth'
    with torch.device('meta'):
        xs_state = x3d.generate_model('xs').state_dict()
    torch.save({'model_state': {k: torch.zeros(v.shape) for k, v in xs_state.items()}}, path)
    with pytest.raises(OptionError) as e:
        build_model(options(x3d_size='l', pretrain_path=path), 7)
    message = str(e.value)
    assert message.startswith(f'--pretrain_path {path} does not match --model x3d --x3d_size l:')
    assert 'missing keys: blocks.1.res_blocks.3.' in message
    assert 'use --x3d_size xs or s or m' in message and 'n_pretrain_classes' not in message


def test_per_size_defaults_of_parse_opts(tmp_path):
    paths = ['--result_path', 'r', '--video_path', 'v', '--annotation_path', 'a.json']
    for size, clip in (('xs', (4, 160, 12)), ('s', (13, 160, 6)), ('m', (16, 224, 5)), ('l', (16, 312, 5))):
        opt = parse_opts([*paths, '--model', 'x3d', '--x3d_size', size])
        assert (opt.sample_duration, opt.sample_size, opt.sample_t_stride, opt.arch) == (*clip, f'x3d-{size}')
    opt = parse_opts([*paths, '--model', 'x3d'])  # size s by default
    assert (opt.sample_duration, opt.sample_size, opt.arch) == (13, 160, 'x3d-s')
    opt = parse_opts([*paths, '--model', 'x3d', '--x3d_size', 'm', '--sample_size', '112'])  # given wins
    assert (opt.sample_duration, opt.sample_size, opt.sample_t_stride) == (16, 112, 5)
    opt = parse_opts(['--result_path', 'r', '--dataset', 'synthetic', '--model', 'x3d', '--x3d_size', 'l'])
    assert (opt.sample_duration, opt.sample_size, opt.sample_t_stride, opt.arch) == (8, 32, 1, 'x3d-l')
    opts_file = tmp_path / 'opts.json'
    opts_file.write_text(json.dumps({'model': 'x3d', 'x3d_size': 'xs', 'sample_size': 96}))
    opt = parse_opts([*paths, '--opts_file', str(opts_file)])  # the file's values win
    assert (opt.sample_duration, opt.sample_size, opt.sample_t_stride, opt.arch) == (4, 96, 12, 'x3d-xs')
    opt = parse_opts([*paths])
    assert (opt.sample_duration, opt.sample_size, opt.arch) == (16, 112, 'resnet-18')  # other models: none
    with pytest.raises(SystemExit):
        parse_opts([*paths, '--model', 'x3d', '--x3d_size', 'xl'])


def test_ft_begin_module_freezes_the_blocks_before():
    torch.manual_seed(0)
    model = generate_model(options())

    def trainable(prefix):
        return {p.requires_grad for name, p in model.named_parameters() if name.startswith(prefix)}

    assert freeze_before(model, 'blocks.4') == ('blocks.0', 'blocks.1', 'blocks.2', 'blocks.3')
    assert trainable('blocks.3') == {False} and trainable('blocks.4') == trainable('blocks.5') == {True}
    model = generate_model(options())
    assert freeze_before(model, 'blocks.5') == ('blocks.0', 'blocks.1', 'blocks.2', 'blocks.3', 'blocks.4')
    model = generate_model(options())
    frozen = freeze_before(model, 'blocks.5.proj')  # a linear probe
    assert frozen[-2:] == ('blocks.4', 'blocks.5.pool')
    assert trainable('blocks.5.pool') == {False} and trainable('blocks.5.proj') == {True}
    model.train()
    keep_frozen_eval(model, frozen)
    # frozen BN keeps its statistics; the probe's dropout stays on
    assert not model.blocks[5].pool.pre_norm.training and not model.blocks[1].training
    assert model.blocks[5].dropout.training and model.blocks[5].proj.training
    with pytest.raises(OptionError, match='--ft_begin_module layer4 is not a module of this model; '
                                          'choose one of blocks.0, .*, blocks.5.pool, blocks.5.proj$'):
        freeze_before(generate_model(options()), 'layer4')


def test_generate_model_refuses_an_unknown_size():
    with pytest.raises(ValueError, match="X3D size must be one of .*, got 'xl'"):
        x3d.generate_model('xl')
    assert x3d.X3D_CLIPS == {'xs': (4, 160), 's': (13, 160), 'm': (16, 224), 'l': (16, 312)}


@pytest.mark.slow
def test_trained_x3d_exports_to_onnx_and_predicts(tiny_synthetic, tmp_path, capsys):
    """One epoch of x3d-xs (3 steps) on 8x32x32 clips; its ONNX file, checked by
    export against PyTorch, says x3d-xs and classifies as the checkpoint does."""
    video_path, annotation_path = tiny_synthetic
    result = tmp_path / 'run'
    with pytest.MonkeyPatch.context() as patch:
        skip_curves(patch)
        main.main(tiny_args(video_path, annotation_path, result, '--model', 'x3d', '--x3d_size', 'xs',
                            '--n_epochs', '1', '--no_val'))
    checkpoint = result / 'save_1.pth'
    saved = torch.load(checkpoint, weights_only=True)
    assert saved['arch'] == 'x3d-xs' and saved['state_dict']['blocks.5.proj.weight'].shape == (6, 2048)
    assert not torch.equal(saved['state_dict']['blocks.5.proj.bias'], torch.zeros(6))  # it trained
    output = tmp_path / 'x3d.onnx'
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        difference = export.main([str(checkpoint), '--output', str(output)])
    assert difference <= 1e-4 and 'onnx, x3d-xs, 6 classes, input (batch, 3x8x32x32)' in printed.getvalue()
    args = [str(video_path / 'grow'), '--topk', '0', '--json', '--n_clips', '2', '--n_threads', '0',
            '--no_progress']
    capsys.readouterr()  # the run's log
    results = []
    for model in (checkpoint, output):
        assert predict.main([str(model), *args]) == 0
        results.append(json.loads(capsys.readouterr().out)['results'])
    mine, theirs = results
    assert mine.keys() == theirs.keys() and len(mine) >= 4
    assert max(abs(a['score'] - b['score']) for v in mine for a, b in zip(mine[v], theirs[v])) <= 1e-5


def test_model_summary_names_the_sizes(capsys):
    """util_scripts.model_summary (and bench/deploy.py through it) takes x3d-<size>;
    x3d-xs at its own clip gives docs/models.md's figures."""
    with torch.device('meta'):
        assert count_parameters(model_summary.build('x3d-l', 400, 3)) == 6153384
    with pytest.raises(SystemExit, match="unknown model 'x3d-xl': X3D sizes are x3d-xs, x3d-s, x3d-m, x3d-l"):
        model_summary.build('x3d-xl', 400, 3)
    model_summary.main(['--models', 'x3d-xs', '--sample_duration', '4', '--sample_size', '160'])
    assert capsys.readouterr().out.splitlines()[-1] == '| x3d-xs | 3.79 | 1.21 |'
