"""docs/own-videos.md's commands, as the page writes them, on a generated tree of
.mp4 files in two class folders: annotation, training, fine-tuning, predict,
export, predict on the exported file. Each command runs in a shell (the page's
`$(nproc)` included) in a folder of its own; the training commands get the
options that make them tiny (a depth-10 network on 8x32x32 clips, 2 epochs)
appended, which override the page's since the last value of an option wins."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from datasets.synthetic import render_video
from tests.video_files import write_video
from utils.logs import read_tsv

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / 'docs' / 'own-videos.md'
# Batches of 2 at the page's learning rate diverge (validation loss 1.3e7 after 2 epochs).
TINY = ('--model_depth 10 --resnet_widen_factor 0.5 --sample_size 32 --sample_duration 8 '
        '--n_epochs 2 --batch_size 2 --learning_rate 0.01 --no_progress')
# Two epochs of 3 steps leave the network's logits in the hundreds (validation loss 218),
# where float32 rounding between ONNX Runtime and PyTorch reached 1.07e-4: the check's
# bound grows with the logits (--rtol), so the page's command runs as written.
EXPORT_TINY = ''
PUBLISHED = 'r3d18_K_200ep.pth'  # the page's published checkpoint; here the first run's


def page_commands():
    """The commands of the page's ```bash blocks under '## The commands', in order,
    continuation lines joined, comments dropped."""
    text = PAGE.read_text().split('## The commands', 1)[1].split('\n## ', 1)[0]
    commands = []
    for block in re.findall(r'```bash\n(.*?)```', text, re.S):
        for line in block.replace('\\\n', ' ').splitlines():
            line = line.split('  #')[0].strip()
            if line and not line.startswith('#'):
                commands.append(re.sub(r'\s+', ' ', line))
    return commands


def two_class_tree(root, per_class=4):
    """move_left and move_right, per_class videos each, 16 frames of 32x32, H.264."""
    for class_index, name in enumerate(['move_left', 'move_right']):
        for i in range(per_class):
            frames, _ = render_video(np.random.default_rng([class_index, i]), class_index,
                                     n_frames=16, frame_size=32)
            write_video(root / name / f'{name}_{i:02d}.mp4', width=32, height=32, gop=4,
                        images=list(frames))


def run(command, cwd):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS='1',
               PATH=f'{Path(sys.executable).parent}{os.pathsep}{os.environ["PATH"]}')
    proc = subprocess.run(['bash', '-c', command], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f'{command}\nexit {proc.returncode}\n{proc.stdout}\n{proc.stderr}'
    return proc.stdout + proc.stderr


def test_the_page_has_the_steps_in_order():
    steps = [c.split()[2] if c.startswith('python -m') else c.split()[1] for c in page_commands()]
    assert steps == ['util_scripts.folder_json', 'main.py', 'main.py', 'predict.py',
                     'util_scripts.export', 'predict.py'], steps


@pytest.mark.slow
def test_own_videos_from_annotation_to_export(tmp_path):
    two_class_tree(tmp_path / 'my_videos')
    for script in ('main.py', 'predict.py'):
        (tmp_path / script).symlink_to(ROOT / script)
    annotate, train, finetune, predict, export, predict_onnx = page_commands()

    out = run(annotate, tmp_path)
    annotation = json.loads((tmp_path / 'my_videos.json').read_text())
    assert annotation['labels'] == ['move_left', 'move_right']
    subsets = sorted(v['subset'] for v in annotation['database'].values())
    assert subsets == ['training'] * 6 + ['validation'] * 2, out

    run(f'{train} {TINY}', tmp_path)
    result = tmp_path / 'results' / 'my_videos'
    assert [row['epoch'] for row in read_tsv(result / 'train.log')] == ['1', '2']
    assert (result / 'best.pth').is_file() and (result / 'save_2.pth').is_file()

    assert PUBLISHED in finetune
    run(f'{finetune.replace(PUBLISHED, str(result / "best.pth"))} {TINY}'.replace(
        '--n_pretrain_classes 700', '--n_pretrain_classes 2'), tmp_path)
    assert (tmp_path / 'results' / 'my_videos_ft' / 'best.pth').is_file()

    out = run(predict, tmp_path)
    assert len(re.findall(r'^move_(left|right)_\d\d: move_', out, re.M)) == 8, out
    assert 'top-1 accuracy' in out

    out = run(f'{export} {EXPORT_TINY}', tmp_path)
    assert (tmp_path / 'my_videos.onnx').is_file(), out
    out = run(predict_onnx, tmp_path)
    assert re.search(r'^move_left_00: move_(left|right) \(', out, re.M), out
