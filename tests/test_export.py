"""util_scripts.export: ONNX (dynamo exporter), TorchScript and torch.export
files of a trained ResNet and R(2+1)D, each checked against the PyTorch model,
with the class names and input settings stored; predict.py on the .onnx file."""
import contextlib
import io
import json

import pytest
import torch

import main
import predict
from checkpoint import load_trained_model
from opts import option_defaults
from tests.conftest import skip_curves, tiny_args
from util_scripts import export
from utils.exported import OnnxClassifier

ARCHS = ('resnet', 'resnet2p1d')
# each test exports checkpoints that two trainings wrote
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures('one_torch_thread')]


@pytest.fixture(scope='module')
def checkpoints(tiny_synthetic, tmp_path_factory):
    """One epoch of each architecture at depth 10, width 0.5, on 8x32x32 clips."""
    video_path, annotation_path = tiny_synthetic
    out = {}
    with pytest.MonkeyPatch.context() as patch:
        skip_curves(patch)
        for arch in ARCHS:
            result = tmp_path_factory.mktemp(arch)
            main.main(tiny_args(video_path, annotation_path, result, '--model', arch,
                                '--resnet_widen_factor', '0.5', '--n_epochs', '1', '--no_val'))
            out[arch] = result / 'save_1.pth'
    return out


def _load(path, fmt):
    """(clips -> logits, class names, input settings) of an exported file, loaded once."""
    if fmt == 'onnx':
        model = OnnxClassifier(path)
        props = model.session.get_modelmeta().custom_metadata_map
        return model, json.loads(props['class_names']), json.loads(props['input'])
    files = {'metadata.json': ''}
    if fmt == 'torchscript':
        model = torch.jit.load(str(path), _extra_files=files)
    else:
        model = torch.export.load(str(path), extra_files=files).module()
    props = json.loads(files['metadata.json'])
    return model, json.loads(props['class_names']), json.loads(props['input'])


@pytest.fixture(scope='module')
def exports(checkpoints, tmp_path_factory):
    """{(arch, format): (file, largest difference, what export printed)}."""
    out = {}
    for arch in ARCHS:
        for fmt, suffix in export.FORMATS.items():
            folder = tmp_path_factory.mktemp(f'{arch}_{fmt}')
            with contextlib.redirect_stdout(io.StringIO()) as printed:
                difference = export.main([str(checkpoints[arch]), '--output',
                                          str(folder / f'model{suffix}')])
            out[(arch, fmt)] = (folder / f'model{suffix}', difference, printed.getvalue())
    return out


@pytest.mark.filterwarnings('ignore:`torch.jit.load` is deprecated:FutureWarning')
@pytest.mark.parametrize('fmt', list(export.FORMATS))
@pytest.mark.parametrize('arch', ARCHS)
def test_export_matches_pytorch(checkpoints, exports, arch, fmt):
    output, difference, printed = exports[(arch, fmt)]
    assert f'largest difference from PyTorch {difference:.2g}' in printed
    print(f'\n{arch} {fmt}: largest difference {difference:.3g}; {printed.strip()}')
    assert difference <= 1e-4
    assert [p.name for p in output.parent.iterdir()] == [output.name]  # no temporary left
    exported, class_names, settings = _load(output, fmt)
    stored = torch.load(checkpoints[arch], weights_only=True)
    assert class_names == stored['class_names']
    assert (settings['sample_size'], settings['sample_duration'], settings['shape']) == (
        32, 8, ['batch', 3, 8, 32, 32])
    assert settings['mean'] == [0.5] * 3 and settings['std'] == [0.5] * 3  # --mean_dataset 0.5
    # the batch axis is dynamic
    model, _, _ = load_trained_model(checkpoints[arch], option_defaults())
    clips = torch.randn(5, 3, 8, 32, 32)
    with torch.no_grad():
        assert (exported(clips) - model(clips)).abs().max().item() <= 1e-4


def test_check_failure_writes_nothing(checkpoints, tmp_path):
    output = tmp_path / 'model.pt'
    with pytest.raises(SystemExit, match='differs from the PyTorch model'):
        export.main([str(checkpoints['resnet']), '--output', str(output), '--atol', '-1',
                     '--rtol', '0'])
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(SystemExit):
        export.main([str(checkpoints['resnet']), '--output', str(tmp_path / 'model.bin')])
    with pytest.raises(SystemExit) as e:
        export.main([str(checkpoints['resnet']), '--output', str(output), '--weights', 'ema'])
    assert e.value.code == 2


def test_predict_runs_the_onnx_file(checkpoints, exports, tiny_synthetic, capsys):
    video_path, _ = tiny_synthetic
    onnx_file = exports[('resnet2p1d', 'onnx')][0]
    folder = video_path / 'move_left'
    args = [str(folder), '--topk', '0', '--json', '--n_clips', '2', '--crop', 'three',
            '--n_threads', '0', '--no_progress']
    assert predict.main([str(checkpoints['resnet2p1d']), *args]) == 0
    mine = json.loads(capsys.readouterr().out)
    assert predict.main([str(onnx_file), *args]) == 0
    theirs = json.loads(capsys.readouterr().out)
    assert mine['views'] == theirs['views'] and len(mine['results']) > 3
    worst = max(abs(a['score'] - b['score'])
                for v in mine['results'] for a, b in zip(mine['results'][v], theirs['results'][v]))
    print(f'\npredict, checkpoint vs .onnx: largest score difference {worst:.3g}')
    assert worst <= 1e-5
    assert all([e['label'] for e in mine['results'][v]] ==
               [e['label'] for e in theirs['results'][v]] for v in mine['results'])
