"""GPU self-check: run it once on a machine with NVIDIA GPUs before a long job.

    python -m util_scripts.gpu_check --quick            # the GPU-only paths never run before, within 480 s
    python -m util_scripts.gpu_check --rest --skip_suite  # the checks --quick leaves out
    python -m util_scripts.gpu_check                    # every check
    python -m util_scripts.gpu_check --only compile_1gpu ema_cost
    python -m util_scripts.gpu_check --list             # the checks, what each proves, their budgets
    python -m util_scripts.gpu_check --cpu_dry_run      # the plumbing, on a machine without GPUs

One line per check: PASS / FAIL / SKIP, its name, its figures; a summary table
at the end whatever happens; the exit status is 1 when any check failed.

Every check runs in a process of its own: its CUDA context and cached memory
end with it, and a check that exits (a user error in main.main is a
SystemExit), crashes or hangs is one FAIL line, not the end of the run. Each
has a time budget (seconds on one modern GPU, times --budget_scale; the
process group of a check over it is killed), and --total_budget bounds the
run: checks that no longer fit are SKIPped. Checks that need 2 GPUs SKIP
with the reason on a 1-GPU machine; in a CPU dry run 2 gloo processes stand
in, and 2 checks run at a time (--jobs; on a GPU always one). Work files go
to --work (default a fresh temporary folder, kept when a check fails), each
check's output to <work>/logs/<check>.log.
"""
import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from utils.processes import ForkedPython, end_tree, exited

ROOT = Path(__file__).resolve().parents[1]
RESULT_TAG = 'GPU_CHECK_RESULT '
QUICK_BUDGET_S = 480  # of the ~10 minutes a session gets on a lent GPU machine


def registry():
    """The checks, in the order they run (--quick's first: the GPU-only paths no GPU has run yet)."""
    from util_scripts.gpu_checks import distributed as d
    from util_scripts.gpu_checks import single as s
    from util_scripts.gpu_checks import throughput as t
    checks = {**s.CHECKS, **t.CHECKS, **d.CHECKS}
    return dict(sorted(checks.items(), key=lambda item: (not item[1].quick, item[0] == 'test_suite')))


# ----------------------------------------------------------------------------- child side

def run_child(name, work, cpu, checks):
    """Runs one check in this process and prints its result as the last line."""
    from util_scripts.gpu_checks.common import Checker, Failed, Skip
    t0 = time.time()
    try:
        figures, status = checks[name].fn(Checker(work, cpu, name)), 'PASS'
    except Skip as e:
        status, figures = 'SKIP', str(e)
    except Failed as e:
        status, figures = 'FAIL', str(e)
    except SystemExit as e:  # main.main's user errors: the check failed, the run goes on
        status, figures = 'FAIL', f'exited with status {e.code}'
    except BaseException as e:  # noqa: BLE001 - every failure is a result line
        traceback.print_exc()
        status, figures = 'FAIL', f'{type(e).__name__}: {e}'
    print('\n' + RESULT_TAG + json.dumps({'status': status, 'figures': figures,
                                          'seconds': time.time() - t0}), flush=True)


def describe_child(cpu):
    import torch
    if cpu:
        info = {'n_gpus': 0, 'line': f'CPU dry run: torch {torch.__version__}'}
    else:
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        cap = torch.cuda.get_device_capability(0) if names else None
        info = {'n_gpus': len(names), 'line': (
            f'torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN '
            f'{torch.backends.cudnn.version()}, {len(names)} GPU(s): {", ".join(names)}, '
            f'compute capability {cap}, {os.cpu_count()} CPU cores')}
    print(RESULT_TAG + json.dumps(info), flush=True)


# ----------------------------------------------------------------------------- parent side

def child_env(cpu):
    env = dict(os.environ, PYTHONUNBUFFERED='1')
    env['PYTHONPATH'] = str(ROOT) + os.pathsep + env.get('PYTHONPATH', '')
    if cpu:
        env['CUDA_VISIBLE_DEVICES'] = ''
    return env


def start_child(args, log_path, cpu):
    """`python -m util_scripts.gpu_check ARGS` in a session of its own (a fork in a CPU dry run:
    utils.processes.ForkedPython skips a new interpreter's imports), its output to log_path."""
    cmd = [sys.executable, '-m', 'util_scripts.gpu_check', *args]
    log = open(log_path, 'w')
    if cpu:
        proc = ForkedPython(cmd, log, log, env=child_env(cpu))
    else:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=child_env(cpu), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    proc.log, proc.log_path, proc.started = log, Path(log_path), time.time()
    return proc


def child_result(proc, timeout):
    """(result dict or None, seconds, timed out) of a start_child process once it
    exited or `timeout` seconds passed. Leftovers (loader workers, torchrun's
    ranks in sessions of their own) are killed before the child is reaped."""
    try:
        timed_out = not end_tree(proc, timeout)
    finally:
        proc.log.close()
    lines = proc.log_path.read_text(errors='replace').splitlines()
    results = [json.loads(line[len(RESULT_TAG):]) for line in lines if line.startswith(RESULT_TAG)]
    return (results[-1] if results else None), time.time() - proc.started, timed_out


def run_in_child(args, log_path, timeout, cpu):
    return child_result(start_child(args, log_path, cpu), timeout)


def last_lines(path, n=3):
    lines = [line.strip() for line in Path(path).read_text(errors='replace').splitlines()
             if line.strip()]
    return ' | '.join(lines[-n:])[-400:]


def start_one(name, check, options, state):
    """The child process of one check, its time limit set on it; or the SKIP row of
    a check that does not run here."""
    if check.gpus > state['n_gpus'] and not options.cpu_dry_run:
        return 'SKIP', f'needs {check.gpus} GPUs, {state["n_gpus"]} visible', 0.0
    budget = check.budget * options.budget_scale
    left = state['deadline'] - time.time()
    if left < min(budget, 30):
        return 'SKIP', f'the run\'s time budget is spent ({left:.0f} s left of --total_budget)', 0.0
    extra = ['--extra_checks', options.extra_checks] if options.extra_checks else []
    args = ['--child', name, '--work', str(options.work), *extra] + \
        (['--cpu_dry_run'] if options.cpu_dry_run else [])
    proc = start_child(args, options.work / 'logs' / f'{name}.log', options.cpu_dry_run)
    proc.limit = min(budget, left)
    return proc


def end_one(proc, timeout):
    """(status, figures, seconds) of a check's child process (start_one) once it
    ended, or `timeout` seconds from now (0: now)."""
    result, seconds, timed_out = child_result(proc, timeout)
    log_path = proc.log_path
    if timed_out:
        return 'FAIL', (f'over its time budget of {proc.limit:.0f} s, stopped '
                        f'(end of {log_path}: {last_lines(log_path)})'), seconds
    if result is None:
        return 'FAIL', f'the check\'s process died (end of {log_path}: {last_lines(log_path)})', \
            seconds
    return result['status'], result['figures'], seconds


def print_summary(rows, t0):
    width = max([len(r[0]) for r in rows] + [5])
    print(f'\nsummary ({len(rows)} checks, {time.time() - t0:.0f} s):')
    print(f'  {"check":<{width}}  status  seconds  figures')
    for name, status, figures, seconds in rows:
        short = figures if len(figures) <= 110 else figures[:107] + '...'
        print(f'  {name:<{width}}  {status:<6}  {seconds:7.0f}  {short}')
    counts = {s: sum(r[1] == s for r in rows) for s in ('PASS', 'FAIL', 'SKIP')}
    print(f'{counts["PASS"]} passed, {counts["FAIL"]} failed, {counts["SKIP"]} skipped', flush=True)
    return counts['FAIL']


def record(rows, i, name, row):
    rows[i] = (name, *row)
    print(f'{row[0]}  {name:<30} {row[1]}  [{row[2]:.0f} s]', flush=True)


def run_checks(names, checks, options, state):
    """Every check, --jobs of them at a time (one on a GPU), its line when it ends;
    the summary, in the checks' order, is printed however the run ends."""
    rows, running, todo, t0 = {}, {}, list(enumerate(names)), time.time()
    try:
        while todo or running:
            while todo and len(running) < options.jobs:
                i, name = todo.pop(0)
                proc = start_one(name, checks[name], options, state)
                if isinstance(proc, tuple):
                    record(rows, i, name, proc)
                else:
                    running[i] = name, proc
            for i, (name, proc) in list(running.items()):
                if exited(proc) or time.time() - proc.started >= proc.limit:
                    del running[i]
                    record(rows, i, name, end_one(proc, 0))
            time.sleep(0.02)
    except KeyboardInterrupt:
        rows[len(names)] = ('(interrupted)', 'FAIL', 'Ctrl-C: the remaining checks did not run', 0.0)
    finally:
        for _, proc in running.values():
            end_tree(proc, 0)
        failed = print_summary([rows[i] for i in sorted(rows)], t0)
    return failed


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--only', nargs='+', help='run these checks only')
    p.add_argument('--quick', action='store_true',
                   help=f'the GPU-only paths no GPU has run yet, within {QUICK_BUDGET_S} s')
    p.add_argument('--rest', action='store_true', help='the checks --quick leaves out')
    p.add_argument('--skip_suite', action='store_true', help='leave out the test suite')
    p.add_argument('--list', action='store_true', help='list the checks and exit')
    p.add_argument('--work', type=Path, default=None, help='folder for data and runs')
    p.add_argument('--cpu_dry_run', action='store_true',
                   help='run every check\'s plumbing on CPU (2 gloo processes for 2 GPUs)')
    p.add_argument('--jobs', type=int, default=None,
                   help='checks run at a time in a CPU dry run (default 2; on a GPU always 1)')
    p.add_argument('--budget_scale', type=float, default=None,
                   help='multiplies every check\'s budget (default 1; 10 in a CPU dry run)')
    p.add_argument('--total_budget', type=float, default=None,
                   help=f'seconds for the whole run (default {QUICK_BUDGET_S} with --quick or '
                        f'--rest, else none)')
    p.add_argument('--extra_checks', default=None, metavar='MODULE',
                   help='a module whose CHECKS dict adds checks (the tests inject failing ones)')
    p.add_argument('--child', default=None, help=argparse.SUPPRESS)
    p.add_argument('--describe', action='store_true', help=argparse.SUPPRESS)
    options = p.parse_args(argv)
    if options.budget_scale is None:
        options.budget_scale = 10.0 if options.cpu_dry_run else 1.0
    # A dry run's checks wait much of their time (loader workers, a frozen rank, a restart):
    # 2 at a time keep both cores busy. On a GPU one at a time, its memory and utilisation theirs.
    options.jobs = max(1, options.jobs or 2) if options.cpu_dry_run else 1
    if options.total_budget is None and (options.quick or options.rest):
        options.total_budget = QUICK_BUDGET_S * (10 if options.cpu_dry_run else 1)
    return options


def all_checks(extra_module):
    checks = registry()
    if extra_module:
        checks.update(importlib.import_module(extra_module).CHECKS)
    return checks


def select(checks, options):
    names = list(checks)
    if options.only:
        unknown = [n for n in options.only if n not in checks]
        if unknown:
            sys.exit(f'unknown check(s) {", ".join(unknown)}: --list shows them')
        names = list(options.only)
    elif options.quick or options.rest:
        names = [n for n in names if checks[n].quick == options.quick]
    return [n for n in names if not (options.skip_suite and n == 'test_suite')]


def list_checks(checks):
    for name, c in checks.items():
        flags = ('quick, ' if c.quick else '') + f'{c.gpus} GPU(s), {c.budget} s'
        print(f'{name:<30} [{flags}] {c.proves}')


def main(argv=None):
    options = parse_args(argv)
    if options.cpu_dry_run:
        # Before torch is imported, for every fork and child: on a small CPU,
        # inductor's pool of compile workers costs more to start than it saves.
        os.environ.setdefault('TORCHINDUCTOR_COMPILE_THREADS', '1')
    checks = all_checks(options.extra_checks)
    if options.cpu_dry_run:
        # Once, here: every child is a fork that has them (matplotlib draws each run's
        # confusion matrix: 0.4 s of imports a run otherwise).
        for module in ('main', 'matplotlib.figure', 'matplotlib.backends.backend_agg'):
            importlib.import_module(module)
    if options.list:
        list_checks(checks)
        return 0
    if options.describe:
        describe_child(options.cpu_dry_run)
        return 0
    if options.child:
        run_child(options.child, options.work, options.cpu_dry_run, checks)
        return 0
    names = select(checks, options)
    options.work = options.work or Path(tempfile.mkdtemp(prefix='gpu_check_'))
    (options.work / 'logs').mkdir(parents=True, exist_ok=True)
    # The machine is described by a child too: this process never holds a CUDA context.
    info, _, _ = run_in_child(['--describe'] + (['--cpu_dry_run'] if options.cpu_dry_run else []),
                              options.work / 'logs' / 'describe.log', 120, options.cpu_dry_run)
    if info is None or (not options.cpu_dry_run and info['n_gpus'] == 0):
        print('FAIL  no CUDA device visible (use --cpu_dry_run to test the script on CPU)')
        return 1
    print(info['line'], f'| work folder {options.work}', flush=True)
    state = {'n_gpus': info['n_gpus'],
             'deadline': time.time() + (options.total_budget or float('inf'))}
    failed = run_checks(names, checks, options, state)
    if not failed and not any(a.startswith('--work') for a in (argv or sys.argv[1:])):
        import shutil
        shutil.rmtree(options.work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
