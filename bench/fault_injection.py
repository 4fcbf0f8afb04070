"""Fault injection: kill -9 a small training at random moments and resume it.

    python -m bench.fault_injection [--kills 20] [--seed 0] [--no_torchrun]

Single process: --kills trainings of the built-in synthetic set (tiny model,
a checkpoint every epoch), each SIGKILLed once (only the main process, as a
user's kill -9 or an OOM kill does: its DataLoader worker dies on its own) at a
moment aimed in turn inside a step, during a checkpoint write, during
validation, or anywhere, then resumed with --auto_resume to the end. Each is
compared with one uninterrupted run. torchrun (2 CPU processes, gloo): one
worker SIGKILLed (torchrun restarts the group, which resumes), and one worker
frozen with SIGSTOP (the other must exit after --dist_timeout, then torchrun
restarts the group). Prints how many runs finished (all must), the
unloadable checkpoints, stale temporary files and duplicated or missing log
rows (none may be), the most work a kill lost, and how many runs ended at the
uninterrupted run's weights (all must).
"""
import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from datasets.synthetic import prepare_synthetic
from utils.checkpoint import TEMPORARY_RE, list_checkpoints, load_checkpoint
from utils.distributed import free_port
from utils.errors import CheckpointError
from utils.logs import read_tsv
from utils.processes import alive, child_pids, end_tree

ROOT = Path(__file__).resolve().parents[1]
N_EPOCHS = 4
LOGS = {'train.log': ('epoch',), 'val.log': ('epoch',), 'train_batch.log': ('epoch', 'iter')}
TIMING_COLUMNS = {'clips_per_s', 'data_wait'}
KINDS = ('step', 'checkpoint', 'validation', 'anywhere')
DIST_TIMEOUT = 15


def train_command(data, result, distributed=False):
    video_path, annotation_path = data
    args = ['--dataset', 'ucf101', '--video_path', str(video_path),
            '--annotation_path', str(annotation_path), '--result_path', str(result),
            '--n_classes', '6', '--model', 'resnet', '--model_depth', '10',
            '--resnet_widen_factor', '0.25', '--sample_size', '32', '--sample_duration', '8',
            '--batch_size', '4', '--learning_rate', '0.01', '--n_val_samples', '2',
            '--no_hflip', '--mean_dataset', '0.5', '--no_progress', '--log_interval', '1',
            '--n_epochs', str(N_EPOCHS), '--checkpoint', '1', '--auto_resume']
    if not distributed:
        return [sys.executable, str(ROOT / 'main.py'), *args, '--n_threads', '1']
    return [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node=2',
            '--max-restarts=2', '--monitor-interval=0.5', f'--master_port={free_port()}',
            str(ROOT / 'main.py'), *args, '--n_threads', '0', '--distributed',
            '--dist_timeout', str(DIST_TIMEOUT)]


def launch(cmd, log_path):
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1')
    env['PYTHONPATH'] = str(ROOT) + os.pathsep + env.get('PYTHONPATH', '')
    for key in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT'):
        env.pop(key, None)
    with open(log_path, 'ab') as log:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def finish(proc, log_path, timeout=600):
    # Leftovers of this run only (torchrun's workers have sessions of their
    # own), killed before proc is reaped: its pid cannot be another's yet.
    rc = proc.returncode if end_tree(proc, timeout) else 'timeout'
    if rc != 0:
        tail = Path(log_path).read_text(errors='replace')[-1500:]
        print(f'  run failed (exit {rc}), end of {log_path}:\n{tail}', flush=True)
    return rc == 0


def steps_logged(result):
    try:
        with open(result / 'train_batch.log', 'rb') as f:
            return max(0, f.read().count(b'\n') - 1)
    except OSError:
        return 0


def epochs_logged(result, name):
    try:
        return sum(1 for _ in read_tsv(result / name))
    except (OSError, ValueError):
        return 0


def temporaries(result):
    return [n for n in os.listdir(result) if TEMPORARY_RE.match(n)] if result.is_dir() else []


def wait_for_moment(kind, proc, result, rng, reference):
    """Sleeps until the moment aimed at (or the run's end); True if still running."""
    deadline = time.time() + 300
    if kind == 'anywhere':
        time.sleep(rng.uniform(0, 0.8 * reference['seconds']))  # runs vary in length
        return proc.poll() is None
    per_epoch = reference['steps_per_epoch']
    step = rng.choice([s for s in range(1, reference['steps']) if s % per_epoch])  # mid-epoch
    epoch = rng.randint(1, N_EPOCHS)

    def reached():
        if kind == 'step':
            return steps_logged(result) >= step
        if kind == 'validation':
            return epochs_logged(result, 'train.log') >= epoch
        # the write of epoch's checkpoint (its epoch's rows are logged first)
        return bool(temporaries(result)) and steps_logged(result) >= epoch * per_epoch

    while not reached():
        if proc.poll() is not None or time.time() > deadline:
            return False
        time.sleep(0.0005 if kind == 'checkpoint' else 0.002)
    if kind == 'step':
        time.sleep(rng.uniform(0, reference['seconds_per_step']))
    return proc.poll() is None


def phase_at_kill(result, n_train_rows, n_val_rows):
    if temporaries(result):
        return 'checkpoint'
    if n_train_rows > n_val_rows:
        return 'validation'
    return 'step' if steps_logged(result) else 'start-up'


def checkpoint_steps(result, steps_per_epoch):
    epochs = [e for e, p in list_checkpoints(result) if _loads(p)]
    return max(epochs, default=0) * steps_per_epoch


def _loads(path):
    try:
        load_checkpoint(path)
        return True
    except (CheckpointError, OSError):
        return False


def unloadable(result):
    return sum(not _loads(p) for _, p in list_checkpoints(result))


def log_differences(result, reference):
    """(duplicated, missing, differing) rows of the three logs against the reference's."""
    dup = missing = differing = 0
    for name, key_cols in LOGS.items():
        rows = read_tsv(result / name)
        ref = read_tsv(reference / name)
        keys = [tuple(r[c] for c in key_cols) for r in rows]
        ref_by_key = {tuple(r[c] for c in key_cols): r for r in ref}
        dup += len(keys) - len(set(keys))
        missing += len(set(ref_by_key) - set(keys))
        for key, row in zip(keys, rows):
            want = ref_by_key.get(key)
            if want is not None and any(row[c] != want[c] for c in row
                                        if c not in TIMING_COLUMNS):
                differing += 1
    return dup, missing, differing


def final_weights_equal(result, reference):
    name = f'save_{N_EPOCHS}.pth'
    try:
        a = load_checkpoint(result / name)['state_dict']
    except (CheckpointError, FileNotFoundError):
        return False
    b = load_checkpoint(reference / name)['state_dict']
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def reference_run(data, root, distributed=False):
    result = root / ('reference_ddp' if distributed else 'reference')
    log = root / f'{result.name}.out'
    t0 = time.time()
    ok = finish(launch(train_command(data, result, distributed), log), log)
    seconds = time.time() - t0
    steps = steps_logged(result)
    if not ok:
        sys.exit(f'the uninterrupted {"torchrun " if distributed else ""}run failed')
    return {'result': result, 'seconds': seconds, 'steps': steps,
            'steps_per_epoch': steps // N_EPOCHS, 'seconds_per_step': seconds / max(1, steps)}


def one_kill(i, kind, data, root, rng, reference, totals):
    result = root / f'run_{i:02d}'
    log = root / f'run_{i:02d}.out'
    proc = launch(train_command(data, result), log)
    if not wait_for_moment(kind, proc, result, rng, reference):
        totals['missed'] += 1
    n_train, n_val = epochs_logged(result, 'train.log'), epochs_logged(result, 'val.log')
    phase = phase_at_kill(result, n_train, n_val)
    done = steps_logged(result)
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)  # the main process only
    proc.wait()
    lost = max(0, done - checkpoint_steps(result, reference['steps_per_epoch']))
    totals['unloadable'] += unloadable(result)
    finished = finish(launch(train_command(data, result), log), log)
    totals['finished'] += finished
    totals['unloadable'] += unloadable(result)
    totals['stale'] += len(temporaries(result))
    dup, missing, differing = log_differences(result, reference['result'])
    totals['duplicated'] += dup
    totals['missing'] += missing
    totals['differing'] += differing
    equal = final_weights_equal(result, reference['result'])
    totals['equal'] += equal
    totals['lost'] = max(totals['lost'], lost)
    totals['phases'][phase] = totals['phases'].get(phase, 0) + 1
    print(f'  kill {i + 1:2d} aimed at {kind:<10} landed in {phase:<10} after {done:2d} steps: '
          f'lost {lost} steps, resumed run {"finished" if finished else "FAILED"}, '
          f'weights {"equal" if equal else "DIFFER"}', flush=True)


def single_process(data, root, n_kills, rng):
    reference = reference_run(data, root)
    print(f'uninterrupted run: {reference["steps"]} steps in {reference["seconds"]:.1f}s',
          flush=True)
    totals = {'finished': 0, 'unloadable': 0, 'stale': 0, 'duplicated': 0, 'missing': 0,
              'differing': 0, 'equal': 0, 'lost': 0, 'missed': 0, 'phases': {}}
    for i in range(n_kills):
        one_kill(i, KINDS[i % len(KINDS)], data, root, rng, reference, totals)
    n = n_kills
    print(f'runs finished: {totals["finished"]}/{n}')
    print(f'unloadable checkpoints: {totals["unloadable"]}')
    print(f'stale temp files: {totals["stale"]}')
    print(f'duplicated or missing log rows: {totals["duplicated"] + totals["missing"]} '
          f'({totals["duplicated"]} duplicated, {totals["missing"]} missing; '
          f'{totals["differing"]} rows with other values than the uninterrupted run)')
    print(f'most work lost: {totals["lost"]} steps (an epoch is '
          f'{reference["steps_per_epoch"]} steps, checkpoint every epoch)')
    print(f'final weights equal to the uninterrupted run: {totals["equal"]}/{n}')
    phases = ', '.join(f'{k} {v}' for k, v in sorted(totals['phases'].items()))
    print(f'kills landed in: {phases}; run ended before the aimed moment: {totals["missed"]}')


def torchrun_fault(fault, data, root, rng, reference):
    """fault 'kill' or 'freeze' one of the two workers after the first checkpoint."""
    result = root / f'ddp_{fault}'
    log = root / f'ddp_{fault}.out'
    proc = launch(train_command(data, result, distributed=True), log)
    target = rng.randint(reference['steps_per_epoch'], reference['steps'] - 2)
    while steps_logged(result) < target and proc.poll() is None:
        time.sleep(0.01)
    workers = child_pids(proc.pid)
    victim = rng.choice(workers) if workers else None
    exit_seconds = None
    if victim is not None and fault == 'kill':
        os.kill(victim, signal.SIGKILL)
    elif victim is not None:
        os.kill(victim, signal.SIGSTOP)
        t0 = time.time()
        others = [w for w in workers if w != victim]
        while any(alive(w) for w in others) and time.time() - t0 < 600:
            time.sleep(0.05)
        exit_seconds = time.time() - t0
    finished = finish(proc, log)
    dup, missing, _ = log_differences(result, reference['result'])
    return {'finished': finished, 'unloadable': unloadable(result),
            'stale': len(temporaries(result)), 'rows': dup + missing,
            'equal': final_weights_equal(result, reference['result']),
            'exit_seconds': exit_seconds}


def torchrun_faults(data, root, rng):
    reference = reference_run(data, root, distributed=True)
    print(f'uninterrupted torchrun run (2 processes): {reference["steps"]} steps in '
          f'{reference["seconds"]:.1f}s', flush=True)
    for fault in ('kill', 'freeze'):
        r = torchrun_fault(fault, data, root, rng, reference)
        what = 'SIGKILL of one worker' if fault == 'kill' else 'SIGSTOP of one worker'
        line = (f'torchrun, {what}: run finished {r["finished"]}, unloadable checkpoints '
                f'{r["unloadable"]}, stale temp files {r["stale"]}, duplicated or missing log '
                f'rows {r["rows"]}, final weights equal {r["equal"]}')
        if fault == 'freeze':
            line += (f'; seconds to exit after a frozen rank: {r["exit_seconds"]:.1f} '
                     f'(--dist_timeout {DIST_TIMEOUT})' if r['exit_seconds'] is not None
                     else '; no worker was frozen (run ended first)')
        print(line, flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--kills', type=int, default=20)
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--no_torchrun', action='store_true')
    p.add_argument('--keep', type=Path, default=None, help='Work folder to keep (default: temp)')
    args = p.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        data = prepare_synthetic(root / 'data', seed=0, n_train_per_class=4, n_val_per_class=2,
                                 n_test=3, n_frames=12, frame_size=32)
        t0 = time.time()
        single_process(data, root, args.kills, rng)
        if not args.no_torchrun:
            torchrun_faults(data, root, rng)
        print(f'total {time.time() - t0:.0f}s')


if __name__ == '__main__':
    main()
