"""A torch/torchvision pair not built for each other is one line at start."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from utils.install_check import installed, matching_torchvision, mismatch_line

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize('torch_version, expected', [
    ('2.14.1+cu130', '0.29'), ('2.6.0', '0.21'), ('2.9.1+cpu', '0.24'), ('3.0.0', None), ('nonsense', None)])
def test_matching_torchvision(torch_version, expected):
    assert matching_torchvision(torch_version) == expected


def test_the_line_names_both_versions_and_the_fix():
    line = mismatch_line(RuntimeError('operator torchvision::nms does not exist\nmore'))
    assert line.startswith(f'error: torchvision {installed("torchvision")} does not work with torch '
                           f'{installed("torch")} (operator torchvision::nms does not exist): pip install ')
    assert '\n' not in line


@pytest.mark.parametrize('entry', [['main.py', '--dataset', 'synthetic', '--result_path', 'unused'],
                                   ['predict.py', 'unused.pth', 'unused.mp4']])
def test_a_broken_torchvision_is_one_line(tmp_path, entry):
    fake = tmp_path / 'torchvision'
    fake.mkdir()  # raises as a torchvision built for another torch does, at import
    (fake / '__init__.py').write_text("raise RuntimeError('operator torchvision::nms does not exist')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    proc = subprocess.run([sys.executable, str(ROOT / entry[0]), *entry[1:]], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count('\n') == 1 and 'Traceback' not in proc.stderr
    assert proc.stderr.startswith('error: torchvision ') and 'operator torchvision::nms' in proc.stderr
    assert not (tmp_path / 'unused').exists()
