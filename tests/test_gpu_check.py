"""util_scripts/gpu_check.py: a check that exits, crashes or hangs is a FAIL line and
the run goes on to the summary (before, a SystemExit in a check ended the whole
self-check with no summary); every check's CPU dry run passes or SKIPs (one
test per check, one dry run for all of them: `-k gpu_utilisation` reruns one)."""
import subprocess
import sys
from pathlib import Path

import pytest

from util_scripts import gpu_check

ROOT = Path(__file__).resolve().parents[1]
# test_suite's dry run is the suite itself, this test included.
DRY_RUN_CHECKS = [name for name in gpu_check.all_checks(None) if name != 'test_suite']


@pytest.fixture(scope='module')
def dry_run(request, tmp_path_factory):
    """One `util_scripts.gpu_check --cpu_dry_run` over the checks this session selected
    (`-k gpu_utilisation` runs one): its lines by check name, and its work
    folder. One run, not one a check: the self-check's own process and its
    machine description start once, and the synthetic set is made once."""
    names = [item.callspec.params['name'] for item in request.session.items
             if item.originalname == 'test_every_check_passes_its_cpu_dry_run']
    work = tmp_path_factory.mktemp('gpu_check_dry_run')
    proc = subprocess.run(
        [sys.executable, '-m', 'util_scripts.gpu_check', '--cpu_dry_run', '--work', str(work),
         '--only', *names], cwd=ROOT, capture_output=True, text=True, timeout=3600)
    lines = {}
    for line in proc.stdout.splitlines():
        if line.split()[:1] in (['PASS'], ['FAIL'], ['SKIP']) and len(line.split()) > 1:
            lines.setdefault(line.split()[1], []).append(line)
    return lines, work, proc


@pytest.mark.slow
@pytest.mark.parametrize('name', DRY_RUN_CHECKS)
def test_every_check_passes_its_cpu_dry_run(name, dry_run):
    """Before a GPU machine's scarce minutes are spent on it, each check's
    plumbing runs on CPU: PASS, or SKIP with its reason (GPU memory, a GPU's
    compute capability), never FAIL."""
    lines, work, proc = dry_run
    log = work / 'logs' / f'{name}.log'
    detail = '\n'.join(lines.get(name, [])) + proc.stdout[-1500:] + proc.stderr[-1500:] + \
        (log.read_text(errors='replace')[-3000:] if log.exists() else '')
    assert len(lines.get(name, [])) == 1 and not lines[name][0].startswith('FAIL'), detail


@pytest.mark.slow
def test_failing_checks_end_in_the_summary(tmp_path):
    names = ['fake_user_error', 'fake_crash', 'fake_hang', 'device_normalisation']
    proc = subprocess.run(
        [sys.executable, '-m', 'util_scripts.gpu_check', '--cpu_dry_run', '--budget_scale', '1',
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


def test_help_and_list_say_what_checks_prove_not_which_issue_asked(capsys):
    with pytest.raises(SystemExit):
        gpu_check.parse_args(['-h'])
    assert gpu_check.main(['--list']) == 0
    text = capsys.readouterr().out
    assert '--quick' in text and 'ema_cost' in text
    assert 'issue ' not in text.lower(), [line for line in text.splitlines() if 'issue ' in line.lower()]


def test_the_old_name_says_the_new_one_and_runs_it():
    """The self-check moved out of bench/ (benchmarks only): `python -m
    bench.gpu_check` still runs it, after one line naming the new command."""
    proc = subprocess.run([sys.executable, '-m', 'bench.gpu_check', '--list'], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        'note: the GPU self-check is now `python -m util_scripts.gpu_check`; running it']
    assert 'gpu_utilisation' in proc.stdout and 'ddp_scaling' in proc.stdout


def test_the_dry_run_shortcuts_stay_in_the_dry_run(tmp_path, monkeypatch):
    """A CPU dry run runs 2 checks at a time, torchrun's ranks as forks of the
    launcher, and commands with TORCH_LOGS of their own in forks; on a GPU one
    check at a time, and ranks and such commands in new interpreters."""
    from util_scripts.gpu_checks import common as gpu_checks_common
    from util_scripts.gpu_checks.common import Checker
    monkeypatch.setattr(Checker, 'data', property(lambda self: tmp_path / 'data'))  # none generated
    monkeypatch.setattr(gpu_checks_common, 'thread_pool_made_at_fork', lambda: None)  # no hook here
    assert gpu_check.parse_args(['--cpu_dry_run']).jobs == 2
    assert gpu_check.parse_args(['--jobs', '4']).jobs == 1
    gpu, cpu = Checker(tmp_path, cpu=False), Checker(tmp_path, cpu=True)
    assert '--run-path' not in gpu.torchrun_cmd(2, tmp_path / 'r')
    assert '--run-path' in cpu.torchrun_cmd(2, tmp_path / 'r')
    assert cpu.forkable(None) and cpu.forkable(cpu.env(TORCH_LOGS='graph_breaks'))
    assert not cpu.forkable(cpu.env(OMP_NUM_THREADS='2'))
