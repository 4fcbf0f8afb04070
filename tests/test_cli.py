"""The command lines answer -h, an unknown option and option errors before
torch, torchvision or av are imported; options are spelt out in full, and a
misspelt one is refused in one line naming the option it most likely means."""
import subprocess
import sys
from pathlib import Path

import pytest

import predict
from datasets.spatial_transforms import EVAL_CROPS
from opts import build_parser, parse_opts
from utils.cli import Parser

ROOT = Path(__file__).resolve().parents[1]
HEAVY = {'torch', 'torchvision', 'av', 'numpy', 'h5py'}


def imported_modules(*args):
    """(exit status, stdout, stderr without the import lines, top-level
    modules imported) of `python -X importtime ARGS` in the project root."""
    proc = subprocess.run([sys.executable, '-X', 'importtime', *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    lines = proc.stderr.splitlines()
    modules = {line.rsplit('|', 1)[-1].strip().split('.')[0]
               for line in lines if line.startswith('import time:')}
    other = [line for line in lines if not line.startswith('import time:')]
    return proc.returncode, proc.stdout, other, modules


@pytest.mark.parametrize('command', [
    ['main.py', '-h'],
    ['predict.py', '-h'],
    ['-m', 'util_scripts.export', '-h'],
])
def test_help_imports_no_torch(command):
    code, out, _, modules = imported_modules(*command)
    assert code == 0 and 'usage:' in out
    assert 'argparse' in modules  # the import lines were read
    assert modules & HEAVY == set()


@pytest.mark.parametrize('command, needle', [
    (['main.py', '--n_epoch', '1'], 'did you mean --n_epochs?'),
    (['main.py', '--dataset', 'synthetic', '--result_path', 'x', '--sample_size', '0'],
     '--sample_size must be at least 1'),
    (['main.py', '--dataset', 'kinetic'], "invalid choice: 'kinetic'"),
    (['predict.py', '--topkk', '3', 'save_1.pth', 'video.mp4'], 'did you mean --topk?'),
    (['-m', 'util_scripts.export', 'save_1.pth', '--outptu', 'x.onnx'], 'did you mean --output?'),
    (['-m', 'util_scripts.export', 'save_1.pth', '--output', 'x.onnx', '--quantize', 'int8'],
     '--quantize int8 needs --calibration ANNOTATION'),
])
def test_option_errors_answer_in_one_line_before_torch(command, needle):
    code, out, err, modules = imported_modules(*command)
    assert code == 2 and out == ''
    assert len(err) == 1 and err[0].startswith('error: ') and needle in err[0]
    assert modules & HEAVY == set()


def test_a_misspelt_option_is_not_taken_for_another(capsys):
    # before: allow_abbrev took --n_epoch 1 as --n_epochs 1 and trained one epoch
    with pytest.raises(SystemExit) as stop:
        parse_opts(['--dataset', 'synthetic', '--result_path', 'x', '--n_epoch', '1'])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err == ('error: unrecognized option --n_epoch: did you mean --n_epochs? '
                   f'({build_parser().prog} -h lists every option)\n')


def test_the_parser_tells_options_from_values(capsys):
    p = Parser(prog='tool')
    p.add_argument('--atol', type=float)
    p.add_argument('--name')
    p.add_argument('rest', nargs='*')
    args = p.parse_args(['--atol', '-1', '--name=-.5', '--', '--not-an-option'])
    assert args.atol == -1 and args.name == '-.5' and args.rest == ['--not-an-option']
    with pytest.raises(SystemExit):
        p.parse_args(['--nmae=x'])
    assert capsys.readouterr().err == \
        'error: unrecognized option --nmae: did you mean --name? (tool -h lists every option)\n'
    with pytest.raises(SystemExit):
        p.parse_args(['--zzz'])
    assert capsys.readouterr().err == 'error: unrecognized option --zzz (tool -h lists every option)\n'


def test_predict_crops_are_the_evaluation_crops():
    assert predict.CROPS == EVAL_CROPS
    inference_crop = next(a for a in build_parser()._actions if a.dest == 'inference_crop')
    assert tuple(inference_crop.choices) == EVAL_CROPS
