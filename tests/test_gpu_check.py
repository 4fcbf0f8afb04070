"""bench/gpu_check.py: a check that exits, crashes or hangs is a FAIL line and
the run goes on to the summary (before, a SystemExit in a check ended the whole
self-check with no summary). The full CPU dry run is too slow for the suite:
python -m bench.gpu_check --cpu_dry_run."""
import subprocess
import sys
from pathlib import Path

import pytest

from bench import gpu_check

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_failing_checks_end_in_the_summary(tmp_path):
    names = ['fake_user_error', 'fake_crash', 'fake_hang', 'device_normalisation']
    proc = subprocess.run(
        [sys.executable, '-m', 'bench.gpu_check', '--cpu_dry_run', '--budget_scale', '1',
         '--extra_checks', 'tests.gpu_check_fakes', '--work', str(tmp_path), '--only', *names],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    summary = out[out.index('\nsummary (') + 1:].splitlines()
    rows = {line.split()[0]: line.split()[1] for line in summary[2:2 + len(names)]}
    assert rows == {'fake_user_error': 'FAIL', 'fake_crash': 'FAIL', 'fake_hang': 'FAIL',
                    'device_normalisation': 'PASS'}, out
    assert 'FAIL  fake_user_error' in out and 'exited with status 2' in out
    assert 'the check\'s process died' in out and 'over its time budget of 2 s' in out
    assert summary[-1] == '1 passed, 3 failed, 0 skipped'
    assert (tmp_path / 'logs' / 'fake_user_error.log').exists()


def test_selections_cover_every_check_once():
    checks = gpu_check.all_checks(None)
    quick = gpu_check.select(checks, gpu_check.parse_args(['--quick']))
    rest = gpu_check.select(checks, gpu_check.parse_args(['--rest']))
    assert sorted(quick + rest) == sorted(checks) and not set(quick) & set(rest)
    assert 'test_suite' not in gpu_check.select(checks, gpu_check.parse_args(['--skip_suite']))
    assert gpu_check.parse_args(['--quick']).total_budget == gpu_check.QUICK_BUDGET_S
    with pytest.raises(SystemExit):
        gpu_check.select(checks, gpu_check.parse_args(['--only', 'no_such_check']))
