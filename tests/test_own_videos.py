"""docs/own-videos.md's commands, as the page writes them, on a generated tree of
.mp4 files of 3 classes of 4 (the small set of issue 38): annotation, training,
fine-tuning, the small set's fine-tuning, predict, export, predict on the
exported file. Each command is expanded by bash (the
page's `$(nproc)` included) and run as `python` runs it (the script or module
as __main__) in a folder of its own, in this process: a new interpreter would
spend more seconds importing torch than the tiny command takes. The training
commands get the options that make them tiny (a depth-10 network on 8x32x32
clips, 2 epochs) appended, which override the page's since the last value of
an option wins; the small set's command keeps the page's batch size, which
must fit its 9 training videos."""
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from datasets.synthetic import CLASSES as SYNTHETIC_CLASSES
from datasets.synthetic import render_video
from tests.video_files import write_video
from utils.logs import read_tsv
from utils.processes import run_as_main

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / 'docs' / 'own-videos.md'
# Batches of 2 at the page's learning rate diverge (validation loss 1.3e7 after 2 epochs).
TINY_NET = ('--model_depth 10 --resnet_widen_factor 0.5 --sample_size 32 --sample_duration 8 '
            '--n_epochs 2 --learning_rate 0.01 --no_progress')
TINY = f'{TINY_NET} --batch_size 2'
CLASSES = ['grow', 'move_left', 'move_right']
# Two epochs of 3 steps leave the network's logits in the hundreds (validation loss 218),
# where float32 rounding between ONNX Runtime and PyTorch reached 1.07e-4: the check's
# bound grows with the logits (--rtol), so the page's command runs as written.
EXPORT_TINY = ''
PUBLISHED = 'r3d18_K_200ep.pth'  # the page's published checkpoint; here the first run's


def page_commands(section='The commands'):
    """The commands of the page's ```bash blocks under '## <section>', in order,
    continuation lines joined, comments dropped."""
    text = PAGE.read_text().split(f'\n## {section}\n', 1)[1].split('\n## ', 1)[0]
    commands = []
    for block in re.findall(r'```bash\n(.*?)```', text, re.S):
        for line in block.replace('\\\n', ' ').splitlines():
            line = line.split('  #')[0].strip()
            if line and not line.startswith('#'):
                commands.append(re.sub(r'\s+', ' ', line))
    return commands


def small_tree(root, per_class=4):
    """CLASSES, per_class videos each, 16 frames of 32x32, H.264."""
    for name in CLASSES:
        class_index = SYNTHETIC_CLASSES.index(name)
        for i in range(per_class):
            frames, _ = render_video(np.random.default_rng([class_index, i]), class_index,
                                     n_frames=16, frame_size=32)
            write_video(root / name / f'{name}_{i:02d}.mp4', width=32, height=32, gop=4,
                        images=list(frames))


def shell_words(command, cwd):
    """The words bash makes of `command` in `cwd`."""
    proc = subprocess.run(['bash', '-c', f"printf '%s\\0' {command}"], cwd=cwd, capture_output=True,
                          text=True, check=True)
    return proc.stdout.split('\0')[:-1]


def run(command, cwd, monkeypatch, capsys):
    """`python [-m] target args`, as the python command would run it; its output."""
    words = shell_words(command, cwd)
    assert words[0] == 'python', command
    monkeypatch.chdir(cwd)
    capsys.readouterr()
    code = 0
    with monkeypatch.context() as patch, warnings.catch_warnings():
        # runpy's note that the module was imported before (by other tests)
        warnings.filterwarnings('ignore', '.*found in sys.modules', RuntimeWarning)
        patch.setattr(sys, 'argv', sys.argv)  # restored after
        patch.setattr(sys, 'path', list(sys.path))
        try:
            run_as_main(words[1:])
        except SystemExit as stop:
            code = stop.code
    printed = capsys.readouterr()
    assert code in (None, 0), f'{command}\nexit {code}\n{printed.out}\n{printed.err}'
    return printed.out + printed.err


def test_the_page_has_the_steps_in_order():
    steps = [c.split()[2] if c.startswith('python -m') else c.split()[1] for c in page_commands()]
    assert steps == ['util_scripts.folder_json', 'main.py', 'main.py', 'predict.py',
                     'util_scripts.export', 'predict.py'], steps
    assert [c.split()[1] for c in page_commands('A few videos a class')] == ['main.py']


@pytest.mark.slow
@pytest.mark.usefixtures('one_torch_thread')
def test_own_videos_from_annotation_to_export(tmp_path, monkeypatch, capsys, no_curves):
    small_tree(tmp_path / 'my_videos')
    for script in ('main.py', 'predict.py'):
        (tmp_path / script).symlink_to(ROOT / script)
    annotate, train, finetune, predict, export, predict_onnx = page_commands()
    [small_finetune] = page_commands('A few videos a class')

    def run_here(command):
        return run(command, tmp_path, monkeypatch, capsys)

    out = run_here(annotate)
    annotation = json.loads((tmp_path / 'my_videos.json').read_text())
    assert annotation['labels'] == CLASSES
    subsets = sorted(v['subset'] for v in annotation['database'].values())
    assert subsets == ['training'] * 9 + ['validation'] * 3, out

    run_here(f'{train} {TINY}')
    result = tmp_path / 'results' / 'my_videos'
    assert [row['epoch'] for row in read_tsv(result / 'train.log')] == ['1', '2']
    assert (result / 'best.pth').is_file() and (result / 'save_2.pth').is_file()

    assert PUBLISHED in finetune
    run_here(f'{finetune.replace(PUBLISHED, str(result / "best.pth"))} {TINY}'.replace(
        '--n_pretrain_classes 700', '--n_pretrain_classes 3'))
    assert (tmp_path / 'results' / 'my_videos_ft' / 'best.pth').is_file()

    # the small set's command as the page gives it (its batch size too), over the first
    assert PUBLISHED in small_finetune and '--overwrite' not in small_finetune
    out = run_here(f'{small_finetune.replace(PUBLISHED, str(result / "best.pth"))} {TINY_NET} '
                   '--overwrite')
    assert 'batch 3 per process' in out, out
    assert [row['epoch'] for row in read_tsv(tmp_path / 'results' / 'my_videos_ft' / 'train.log')] \
        == ['1', '2']

    out = run_here(predict)
    assert len(re.findall(r'^(grow|move_left|move_right)_\d\d: (grow|move_)', out, re.M)) == 12, out
    assert 'top-1 accuracy' in out

    out = run_here(f'{export} {EXPORT_TINY}')
    assert (tmp_path / 'my_videos.onnx').is_file(), out
    out = run_here(predict_onnx)
    assert re.search(r'^move_left_00: (grow|move_left|move_right) \(', out, re.M), out
