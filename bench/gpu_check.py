"""GPU self-check: run it once on a machine with NVIDIA GPUs before a long job.

    python -m bench.gpu_check                    # every check, a few minutes
    python -m bench.gpu_check --skip_suite       # without the test suite
    python -m bench.gpu_check --only amp_bf16 syncbn_2_vs_1
    python -m bench.gpu_check --cpu_dry_run      # the plumbing, on a machine without GPUs

One line per check: PASS / FAIL / SKIP, its name, and its figures; the exit
status is 1 when any check failed. Work files go to --work (default a fresh
temporary folder, kept when a check fails). Checks on one GPU: training with
--amp in bf16 and fp16, --channels_last, normalisation on the device equal to
the CPU's, GPU memory flat across epochs, a bf16 (or fp32) checkpoint resumed
under fp16, torchrun with --distributed --batchnorm_sync --amp --inference
--auto_resume, an elastic restart, a stop signal mid-epoch, two runs with
--deterministic giving equal weights, and the test suite. With two GPUs or
more: SyncBatchNorm on 2 GPUs against 1 GPU on the global batch, NCCL
validation against 1 process, how long the job takes to exit after one rank
fails, and bench/ddp_scaling.py on the GPUs.
"""
import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
MAIN = str(ROOT / 'main.py')


class Skip(Exception):
    """A check that does not apply here (the reason is printed)."""


class Failed(Exception):
    """A check that ran and failed (the reason is printed)."""


class Checker:
    """Runs main.py and torchrun in subprocesses on the synthetic data set."""

    def __init__(self, work, cpu):
        self.work = work
        self.cpu = cpu
        self.data = work / 'data'
        self.n_gpus = 0 if cpu else torch.cuda.device_count()
        self._runs = 0

    def env(self, **extra):
        e = dict(os.environ, PYTHONUNBUFFERED='1', **extra)
        e['PYTHONPATH'] = str(ROOT) + os.pathsep + e.get('PYTHONPATH', '')
        for key in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT'):
            e.pop(key, None)
        if self.cpu:
            e['CUDA_VISIBLE_DEVICES'] = ''
        return e

    def result_path(self, name):
        self._runs += 1
        return self.work / f'{self._runs:02d}_{name}'

    def args(self, result, *extra):
        """A short run on the synthetic set (6 classes, 32x32 clips, ResNet-10)."""
        return ['--dataset', 'synthetic', '--video_path', str(self.data), '--result_path',
                str(result), '--n_epochs', '3', '--checkpoint', '1', '--no_progress',
                '--n_threads', '4', *extra]

    def main_py(self, result, *extra, timeout=300):
        return self.run([sys.executable, MAIN, *self.args(result, *extra)], timeout)

    def torchrun(self, nproc, result, *extra, launcher=(), timeout=300):
        from utils.distributed import free_port
        cmd = [sys.executable, '-m', 'torch.distributed.run', f'--nproc_per_node={nproc}',
               f'--master_port={free_port()}', *launcher, MAIN, '--distributed',
               *self.args(result, *extra)]
        return self.run(cmd, timeout)

    def run(self, cmd, timeout):
        t0 = time.time()
        proc = subprocess.run(cmd, cwd=ROOT, env=self.env(), capture_output=True, text=True,
                              timeout=timeout)
        proc.seconds = time.time() - t0
        return proc


def ok(proc, what):
    if proc.returncode != 0:
        raise Failed(f'{what} exited {proc.returncode}: {tail(proc)}')
    return proc.stdout + proc.stderr


def tail(proc, n=600):
    text = (proc.stdout + proc.stderr).strip()
    return text[-n:].replace('\n', ' | ')


def read_log(path):
    lines = Path(path).read_text().splitlines()
    keys = lines[0].split('\t')
    return [dict(zip(keys, line.split('\t'))) for line in lines[1:]]


def train_losses(result):
    return [float(r['loss']) for r in read_log(result / 'train.log')]


def has_option(name):
    from opts import build_parser
    return any(name in a.option_strings for a in build_parser()._actions)


def capability():
    return torch.cuda.get_device_capability(0)


def needs_gpus(checker, n):
    """Skips unless n GPUs are visible; a CPU dry run uses n gloo processes."""
    if not checker.cpu and checker.n_gpus < n:
        raise Skip(f'needs {n} GPU(s), {checker.n_gpus} visible')


def amp_args(checker, dtype):
    """--amp with the given dtype: --amp_dtype where this version has it, else
    the default (bf16 from compute capability 8.0, fp16 below)."""
    if has_option('--amp_dtype'):
        return ['--amp', '--amp_dtype', dtype]
    if checker.cpu:
        return ['--amp']
    native = 'bf16' if capability() >= (8, 0) else 'fp16'
    if native != dtype:
        raise Skip(f'{dtype} needs --amp_dtype (this GPU defaults to {native})')
    return ['--amp']


def check_amp(checker, dtype):
    """10 epochs: past the 3 warmup epochs, the loss falls."""
    result = checker.result_path(f'amp_{dtype}')
    proc = checker.main_py(result, '--n_epochs', '10', *amp_args(checker, dtype))
    ok(proc, 'training')
    losses = train_losses(result)
    if not all(math.isfinite(v) for v in losses) or losses[-1] >= losses[0]:
        raise Failed(f'train losses {losses}: not finite or not decreasing')
    rate = float(read_log(result / 'train.log')[-1]['clips_per_s'])
    return f'losses {" ".join(f"{v:.3f}" for v in losses)}, {rate:.0f} clips/s, ' \
           f'{proc.seconds:.0f} s'


def check_channels_last(checker):
    result = checker.result_path('channels_last')
    proc = checker.main_py(result, '--channels_last', *amp_args(checker, 'bf16'))
    ok(proc, 'training with --channels_last')
    losses = train_losses(result)
    if not all(math.isfinite(v) for v in losses):
        raise Failed(f'train losses {losses}')
    rate = float(read_log(result / 'train.log')[-1]['clips_per_s'])
    return f'losses {" ".join(f"{v:.3f}" for v in losses)}, {rate:.0f} clips/s'


def check_device_normalisation(checker):
    from datasets.spatial_transforms import NormalizeToInput
    device = torch.device('cpu' if checker.cpu else 'cuda')
    norm = NormalizeToInput([0.43, 0.40, 0.37], [0.23, 0.22, 0.22], value_scale=1)
    clips = torch.randint(0, 256, (4, 16, 3, 112, 112), dtype=torch.uint8)
    expected = norm(clips)
    got = norm(clips.to(device)).cpu()
    diff = (got - expected).abs().max().item()
    if got.shape != expected.shape or diff > 1e-5:
        raise Failed(f'shape {tuple(got.shape)} vs {tuple(expected.shape)}, max diff {diff:.2e}')
    return f'max |device - cpu| {diff:.2e} on {tuple(expected.shape)}'


def check_memory_flat(checker):
    """Peak memory of a 2-epoch run and of a 6-epoch run: equal when nothing
    accumulates from epoch to epoch. In this process (one CUDA context)."""
    if checker.cpu:
        raise Skip('GPU memory')
    import gc

    import main
    peaks = []
    for n_epochs in (2, 6):
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        result = checker.result_path(f'memory_{n_epochs}')
        main.main(checker.args(result, '--n_epochs', str(n_epochs), '--n_threads', '0'))
        peaks.append(torch.cuda.max_memory_allocated() / 2**20)
    gc.collect()
    retained = torch.cuda.memory_allocated() / 2**20
    if peaks[1] > peaks[0] * 1.05 + 16:
        raise Failed(f'peak {peaks[0]:.0f} MiB after 2 epochs, {peaks[1]:.0f} MiB after 6')
    return f'peak {peaks[0]:.0f} MiB (2 epochs), {peaks[1]:.0f} MiB (6 epochs), ' \
           f'{retained:.0f} MiB still allocated after both runs'


def check_resume_under_fp16(checker):
    result = checker.result_path('resume_fp16')
    first = ['--amp', '--amp_dtype', 'bf16'] if has_option('--amp_dtype') else []
    ok(checker.main_py(result, '--n_epochs', '1', *first), 'first epoch')
    fp16 = amp_args(checker, 'fp16')
    out = ok(checker.main_py(result, '--n_epochs', '2', '--resume_path',
                             str(result / 'save_1.pth'), *fp16), 'resume under fp16')
    if 'epoch 2/2 train' not in out:
        raise Failed('the resumed run did not train epoch 2')
    return f'{"bf16" if first else "fp32"} checkpoint resumed with {" ".join(fp16)}'


def check_torchrun_one_process(checker):
    result = checker.result_path('torchrun_1')
    extra = ['--batchnorm_sync', '--amp', '--inference', '--auto_resume']
    ok(checker.torchrun(1, result, *extra, '--n_epochs', '1'), 'first run')
    out = ok(checker.torchrun(1, result, *extra, '--n_epochs', '2'), 'resumed run')
    if 'auto-resume from' not in out or not (result / 'val.json').exists():
        raise Failed(f'no auto-resume or no val.json: {out[-400:]}')
    n = len(json.loads((result / 'val.json').read_text())['results'])
    return f'trained 1 + 1 epochs, {n} videos scored'


def check_elastic_restart(checker):
    from utils.distributed import free_port
    result = checker.result_path('elastic')
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node=1',
           '--max-restarts=1', f'--master_port={free_port()}', MAIN, '--distributed',
           *checker.args(result, '--n_epochs', '6', '--auto_resume')]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=checker.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.time() + 240
        while not (result / 'save_1.pth').exists():
            if proc.poll() is not None or time.time() > deadline:
                raise Failed(f'no save_1.pth: {proc.communicate()[0][-400:]}')
            time.sleep(0.1)
        workers = subprocess.run(['pgrep', '-P', str(proc.pid)], capture_output=True,
                                 text=True).stdout.split()
        t_kill = time.time()
        os.kill(int(workers[0]), signal.SIGKILL)
        out = proc.communicate(timeout=300)[0]
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if proc.returncode != 0 or 'auto-resume from' not in out:
        raise Failed(f'exit {proc.returncode}: {out[-400:]}')
    return f'worker killed after epoch 1, job finished {time.time() - t_kill:.0f} s later'


def check_stop_signal(checker):
    """SIGTERM mid-epoch: a checkpoint, exit code 75, and the same command
    continues from it."""
    from utils.preemption import EXIT_PREEMPTED
    result = checker.result_path('stop_signal')
    cmd = [sys.executable, MAIN, *checker.args(result, '--n_epochs', '2', '--auto_resume',
                                                '--checkpoint_steps', '1', '--batch_size', '4')]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=checker.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 240
    while not (result / 'save_1_2.pth').exists():
        if proc.poll() is not None or time.time() > deadline:
            raise Failed(f'no mid-epoch checkpoint: {proc.communicate()[0][-400:]}')
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    t0 = time.time()
    out = proc.communicate(timeout=120)[0]
    stopped = time.time() - t0
    if proc.returncode != EXIT_PREEMPTED:
        raise Failed(f'exit {proc.returncode} (expected {EXIT_PREEMPTED}): {out[-400:]}')
    out = ok(subprocess.run(cmd, cwd=ROOT, env=checker.env(), capture_output=True, text=True,
                            timeout=300), 'resumed run')
    if 'auto-resume from' not in out or not (result / 'save_2.pth').exists():
        raise Failed(f'the resumed run did not finish: {out[-400:]}')
    return f'exit {EXIT_PREEMPTED} {stopped:.1f} s after SIGTERM; resumed and finished'


def max_weight_diff(a, b):
    from utils.checkpoint import load_checkpoint
    sa, sb = load_checkpoint(a)['state_dict'], load_checkpoint(b)['state_dict']
    return max((sa[k].double() - sb[k].double()).abs().max().item() for k in sa)


def check_deterministic_repeat(checker):
    """Two identical 1-epoch runs: with --deterministic the weights must be
    equal; without it, the difference is printed (a figure, not a failure)."""
    diffs = {}
    for flag in ([], ['--deterministic']):
        runs = [checker.result_path('repeat') for _ in range(2)]
        for result in runs:
            ok(checker.main_py(result, '--n_epochs', '1', '--no_val', *flag), 'training')
        diffs[bool(flag)] = max_weight_diff(runs[0] / 'save_1.pth', runs[1] / 'save_1.pth')
    if diffs[True] != 0:
        raise Failed(f'--deterministic runs differ by up to {diffs[True]:.3g}')
    return f'max weight difference of two runs: {diffs[False]:.3g} by default, 0 with --deterministic'


def check_test_suite(checker):
    proc = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-x', '-p', 'no:cacheprovider'],
                          cwd=ROOT, env=checker.env(OMP_NUM_THREADS='2'), capture_output=True,
                          text=True, timeout=1800)
    summary = (proc.stdout.strip().splitlines() or [''])[-1]
    if proc.returncode != 0:
        raise Failed(f'{summary}: {tail(proc)}')
    return summary


def last_validation(result):
    rows = read_log(result / 'val.log') if (result / 'val.log').exists() else []
    if not rows:
        raise Failed(f'no validation in {result / "val.log"}')
    return tuple(float(rows[-1][k]) for k in ('loss', 'acc', 'clip_acc'))


def check_syncbn_2_vs_1(checker):
    """One epoch on the same global batches (the same clips: each has its own
    augmentation seed): 2 GPUs with SyncBatchNorm against 1. A small learning
    rate, so that rounding differences are not amplified by training."""
    needs_gpus(checker, 2)
    extra = ['--n_epochs', '1', '--batchnorm_sync', '--no_val', '--deterministic',
             '--learning_rate', '0.001']
    one, two = checker.result_path('sync_1'), checker.result_path('sync_2')
    ok(checker.torchrun(1, one, *extra), '1 GPU')
    ok(checker.torchrun(2, two, *extra), '2 GPUs')
    a, b = train_losses(one)[0], train_losses(two)[0]
    if abs(a - b) > 2e-3 * max(1.0, abs(a)):
        raise Failed(f'epoch loss {a:.6f} on 1 GPU, {b:.6f} on 2')
    return f'epoch loss {a:.6f} (1 GPU) vs {b:.6f} (2 GPUs)'


def check_nccl_validation(checker):
    needs_gpus(checker, 2)
    trained = checker.result_path('val_source')
    ok(checker.main_py(trained, '--n_epochs', '1', '--no_val'), 'training')
    ckpt = str(trained / 'save_1.pth')
    results = [checker.result_path(f'val_{n}') for n in (1, 2)]
    for n, result in zip((1, 2), results):
        ok(checker.torchrun(n, result, '--no_train', '--resume_path', ckpt), f'{n} process(es)')
    one, two = (last_validation(r) for r in results)
    if any(abs(x - y) > 1e-4 for x, y in zip(one, two)):
        raise Failed(f'loss/video acc/clip acc {one} on 1 process, {two} on 2')
    return f'loss, video acc, clip acc {one} on 1 and 2 processes'


def check_exit_after_rank_failure(checker):
    """A video whose frames are corrupt fails on the one rank that loads it;
    the job must exit (not hang in destroy_process_group)."""
    needs_gpus(checker, 2)
    data = checker.work / 'data_corrupt'
    if not data.exists():
        shutil.copytree(checker.data, data)
        from datasets.synthetic import ANNOTATION_NAME
        annotation = json.loads((data / ANNOTATION_NAME).read_text())
        video, entry = next((k, v) for k, v in annotation['database'].items()
                            if v['subset'] == 'training')
        for frame in (data / 'jpg' / entry['annotations']['label'] / video).glob('*.jpg'):
            frame.write_bytes(b'not a jpeg')  # one training video: one rank fails
    result = checker.result_path('rank_failure')
    args = [a if a != str(checker.data) else str(data) for a in
            checker.args(result, '--n_epochs', '1')]
    from utils.distributed import free_port
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node=2',
           f'--master_port={free_port()}', MAIN, '--distributed', *args]
    proc = checker.run(cmd, timeout=600)
    if proc.returncode == 0:
        raise Failed('the job succeeded on corrupt frames')
    if proc.seconds > 120:
        raise Failed(f'the job took {proc.seconds:.0f} s to exit after one rank failed')
    return f'exited {proc.returncode} after {proc.seconds:.0f} s'


def check_ddp_scaling(checker):
    needs_gpus(checker, 2)
    n = 2 if checker.cpu else min(checker.n_gpus, 8)
    proc = subprocess.run([sys.executable, '-m', 'bench.ddp_scaling', '--device',
                           'cpu' if checker.cpu else 'cuda',
                           '--nprocs', '1', str(n), '--global_batch', str(8 * n),
                           '--model_depth', '18', '--sample_size', '112',
                           '--sample_duration', '16', '--steps', '10'],
                          cwd=ROOT, env=checker.env(), capture_output=True, text=True,
                          timeout=600)
    out = ok(proc, 'bench.ddp_scaling')
    return ' | '.join(line.strip() for line in out.strip().splitlines()[-3:])


CHECKS = {
    'amp_bf16': lambda c: check_amp(c, 'bf16'),
    'amp_fp16': lambda c: check_amp(c, 'fp16'),
    'channels_last': check_channels_last,
    'device_normalisation': check_device_normalisation,
    'memory_flat': check_memory_flat,
    'resume_under_fp16': check_resume_under_fp16,
    'torchrun_1_process': check_torchrun_one_process,
    'elastic_restart': check_elastic_restart,
    'stop_signal': check_stop_signal,
    'deterministic_repeat': check_deterministic_repeat,
    'syncbn_2_vs_1': check_syncbn_2_vs_1,
    'nccl_validation': check_nccl_validation,
    'exit_after_rank_failure': check_exit_after_rank_failure,
    'ddp_scaling': check_ddp_scaling,
    'test_suite': check_test_suite,
}


def describe_machine(cpu):
    if cpu:
        return f'CPU dry run: torch {torch.__version__}'
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return (f'torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN '
            f'{torch.backends.cudnn.version()}, {len(names)} GPU(s): {", ".join(names)}, '
            f'compute capability {capability()}')


def run_checks(names, checker):
    failed = 0
    for name in names:
        t0 = time.time()
        try:
            figures = CHECKS[name](checker)
            status = 'PASS'
        except Skip as e:
            status, figures = 'SKIP', str(e)
        except Failed as e:
            status, figures = 'FAIL', str(e)
        except Exception as e:  # a check that crashed is a failed check, not the end
            status, figures = 'FAIL', f'{type(e).__name__}: {e}'
        failed += status == 'FAIL'
        print(f'{status}  {name:<24} {figures}  [{time.time() - t0:.0f} s]', flush=True)
    return failed


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--only', nargs='+', choices=list(CHECKS), help='run these checks only')
    p.add_argument('--skip_suite', action='store_true', help='leave out the test suite')
    p.add_argument('--work', type=Path, default=None, help='folder for data and runs')
    p.add_argument('--cpu_dry_run', action='store_true',
                   help='run the checks that can run on CPU (to test this script)')
    args = p.parse_args(argv)
    if not args.cpu_dry_run and not torch.cuda.is_available():
        print('FAIL  no CUDA device visible (use --cpu_dry_run to test the script on CPU)')
        return 1
    names = args.only or [n for n in CHECKS if not (args.skip_suite and n == 'test_suite')]
    work = args.work or Path(tempfile.mkdtemp(prefix='gpu_check_'))
    work.mkdir(parents=True, exist_ok=True)
    print(describe_machine(args.cpu_dry_run), f'| work folder {work}', flush=True)
    checker = Checker(work, args.cpu_dry_run)
    from datasets.synthetic import prepare_synthetic
    prepare_synthetic(checker.data, seed=0)
    failed = run_checks(names, checker)
    print(f'{failed} check(s) failed' if failed else 'all checks passed or skipped', flush=True)
    if not failed and args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
