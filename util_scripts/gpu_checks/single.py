"""The GPU self-check's checks on one GPU of what a run does: precision, resume,
inference, predict.py, torchrun and signals (util_scripts/gpu_check.py runs
each in a process of its own; the speed checks are in throughput.py)."""
import json
import math
import os
import re
import signal
import sys
import time

import torch

from util_scripts.gpu_checks.common import (
    MAIN,
    ROOT,
    Failed,
    Skip,
    capability,
    finish,
    finite_losses,
    json_results,
    last_rate,
    load_state,
    losses_text,
    max_weight_diff,
    new_registry,
    ok,
    tail,
    train_losses,
    wait_for,
)
from utils.processes import child_pids, end_tree

CHECKS, check = new_registry()  # {name: Check} in the order defined, and @check

DOWN_SCALE = 1024.0  # the GradScaler scale written into a checkpoint to see it restored


@check(60, 'fp16 with --clip_grad_norm, mixup/cutmix and --accumulation_steps 2: finite '
       'losses, a sane GradScaler scale', quick=True)
def check_fp16_recipe(c):
    """fp16 with --clip_grad_norm (unscaled before clipping), mixup and cutmix,
    and gradient accumulation: the losses stay finite, the scale is sane."""
    result = c.result_path('fp16_recipe')
    n = c.epochs(4, on_cpu=2)  # on CPU (no GradScaler) every step's recipe runs in 2 epochs as in 4
    ok(c.main_py(result, '--n_epochs', n, *c.amp_args('fp16'), '--clip_grad_norm', '1.0',
                 '--mixup_alpha', '0.8', '--cutmix_alpha', '1.0', '--accumulation_steps', '2'),
       'training')
    losses = finite_losses(result)
    scaler = load_state(result / f'save_{n}.pth')['scaler']
    if c.cpu:
        return f'losses {losses_text(losses)} (CPU: --amp is off, no GradScaler)'
    scale = scaler.get('scale')
    if scale is None or not math.isfinite(scale) or scale <= 0:
        raise Failed(f'GradScaler scale {scale} after {n} epochs (losses {losses_text(losses)})')
    return f'losses {losses_text(losses)}, GradScaler scale {scale:g} after {n} epochs'


@check(60, 'a mid-epoch fp16 checkpoint resumes with its GradScaler scale', quick=True)
def check_fp16_midepoch_resume(c):
    """A mid-epoch fp16 checkpoint whose scale is set to 1024 is resumed: the
    resumed epoch ends at that scale (or below it), not at a fresh scaler's
    65536 (its growth interval, 2000 steps, is far away)."""
    first = c.result_path('fp16_first')
    fp16 = c.amp_args('fp16')
    ok(c.main_py(first, '--n_epochs', '1', '--no_val', '--checkpoint_steps', '4', *fp16),
       'first run')
    state = load_state(first / 'save_1_4.pth')
    resumed = c.result_path('fp16_resumed')
    resumed.mkdir(parents=True)
    if state['scaler']:
        state['scaler']['scale'] = DOWN_SCALE
    torch.save(state, resumed / 'start.pth')
    ok(c.main_py(resumed, '--n_epochs', '1', '--no_val', '--resume_path',
                 str(resumed / 'start.pth'), *fp16), 'resumed run')
    end = load_state(resumed / 'save_1.pth')['scaler']
    if c.cpu:
        return 'CPU: --amp is off, no GradScaler state; the resume ran (plumbing only)'
    uninterrupted = load_state(first / 'save_1.pth')['scaler'].get('scale')
    if end.get('scale') is None or end['scale'] > DOWN_SCALE:
        raise Failed(f'the resumed epoch ended at scale {end.get("scale")}: the checkpoint\'s '
                     f'{DOWN_SCALE:g} was not restored (uninterrupted: {uninterrupted})')
    return (f'scale {DOWN_SCALE:g} in the checkpoint, {end["scale"]:g} at the end of the resumed '
            f'epoch (uninterrupted run: {uninterrupted:g})')


@check(60, '--normalize_on_device on vs off (pinned uint8, non_blocking, '
       'channels_last_3d): equal loss', quick=True)
def check_normalize_on_device(c):
    """--normalize_on_device on (uint8 pinned, copied non_blocking, normalized
    into channels_last_3d on the device) against off: the first epoch's loss
    is equal within 2e-3 (both --deterministic)."""
    losses = {}
    for mode in ('on', 'off'):
        result = c.result_path(f'normalize_{mode}')
        ok(c.main_py(result, '--n_epochs', '1', '--no_val', '--deterministic', '--channels_last',
                     '--normalize_on_device', mode), f'--normalize_on_device {mode}')
        losses[mode] = train_losses(result)[0]
    a, b = losses['on'], losses['off']
    if not (math.isfinite(a) and abs(a - b) <= 2e-3 * max(1.0, abs(b))):
        raise Failed(f'first epoch loss {a:.6f} normalized on the device, {b:.6f} in the workers')
    return f'first epoch loss {a:.6f} on the device vs {b:.6f} in the workers ({abs(a - b):.1e})'


@check(60, 'three-crop inference on the device: 6 views per video', quick=True)
def check_three_crop_inference(c):
    """--inference_crop three on the device: 2 clips x 3 crops = 6 views per video."""
    result = c.result_path('three_crop')
    out = ok(c.main_py(result, '--no_train', '--resume_path', str(c.trained_checkpoint()),
                       '--inference', '--inference_crop', 'three', '--inference_n_clips', '2'),
             'inference')
    m = re.search(r'\((\d+) videos, ([\d/]+) views each\)', out)
    if not m or m.group(2) != '6':
        raise Failed(f'expected 6 views per video: {out.strip()[-300:]}')
    top1 = re.search(r'top-1 video accuracy on \w+: ([\d.]+)', out)
    return f'{m.group(1)} videos, 6 views each, top-1 {top1.group(1) if top1 else "?"}'


@check(60, 'a mid-epoch resume with --deterministic: equal weights', quick=True)
def check_deterministic_midepoch_resume(c):
    """--deterministic: resumed from a mid-epoch checkpoint, the epoch ends at the
    uninterrupted run's weights exactly."""
    whole = c.result_path('whole')
    ok(c.main_py(whole, '--n_epochs', '1', '--no_val', '--deterministic', '--checkpoint_steps',
                 '5'), 'uninterrupted run')
    resumed = c.result_path('resumed')
    ok(c.main_py(resumed, '--n_epochs', '1', '--no_val', '--deterministic', '--resume_path',
                 str(whole / 'save_1_5.pth')), 'resumed run')
    diff = max_weight_diff(whole / 'save_1.pth', resumed / 'save_1.pth')
    if diff != 0:
        raise Failed(f'resumed after 5 steps: weights differ by up to {diff:.3g}')
    return 'resumed after 5 steps: weights equal to the uninterrupted run (max diff 0)'


@check(45, 'predict.py on CUDA scores as on CPU', quick=True)
def check_predict_cuda(c):
    """predict.py on the GPU scores the test videos as on the CPU (within 1e-3)."""
    ckpt = str(c.trained_checkpoint())
    videos = str(c.data / 'jpg' / 'test')
    scores = {}
    for device in ('cuda', 'cpu'):
        extra = ['--no_cuda'] if device == 'cpu' else []
        out = ok(c.run([sys.executable, str(ROOT / 'predict.py'), ckpt, videos, '--json',
                        '--n_clips', '2', '--n_threads', '2', *extra], 600), f'predict.py {device}')
        scores[device] = json.loads(out[out.index('{"results"'):].splitlines()[0])['results']
    diff, n = 0.0, len(scores['cpu'])
    for vid, entries in scores['cpu'].items():
        gpu = {e['label']: e['score'] for e in scores['cuda'][vid]}
        if gpu.keys() != {e['label'] for e in entries} or \
                scores['cuda'][vid][0]['label'] != entries[0]['label']:
            raise Failed(f'{vid}: labels {list(gpu)} on the GPU, {[e["label"] for e in entries]} on CPU')
        diff = max([diff] + [abs(gpu[e['label']] - e['score']) for e in entries])
    if diff > 1e-3:
        raise Failed(f'scores differ by up to {diff:.2e} between the GPU and the CPU')
    where = 'CPU (dry run)' if c.cpu else 'the GPU'
    return f'{n} videos on {where}, top-1 labels equal, max |score - CPU score| {diff:.1e}'


@check(30, '--amp_dtype bf16 refused in one line below compute capability 8.0', quick=True)
def check_bf16_below_sm80(c):
    """--amp_dtype bf16 below compute capability 8.0 is refused in one line."""
    if c.cpu:
        raise Skip('needs a GPU; tests/test_errors.py fakes a V100 on CPU')
    if capability() >= (8, 0):
        raise Skip(f'compute capability {capability()} runs bf16; the refusal below 8.0 is '
                   f'tested with a faked V100 (tests/test_errors.py)')
    proc = c.main_py(c.result_path('bf16'), *c.amp_args('bf16'), '--n_epochs', '1')
    err = proc.stderr.strip()
    if proc.returncode != 2 or len(err.splitlines()) != 1 or 'capability 8.0' not in err:
        raise Failed(f'exit {proc.returncode}, stderr: {err[-400:]}')
    return err


def check_amp(c, dtype):
    """10 epochs: past the 3 warmup epochs, the loss falls."""
    result = c.result_path(f'amp_{dtype}')
    proc = ok(c.main_py(result, '--n_epochs', c.epochs(10, on_cpu=2), *c.amp_args(dtype)),
              'training')
    losses = finite_losses(result)
    if losses[-1] >= losses[0] and not c.cpu:  # a dry run's 2 epochs of 48 clips: plumbing
        raise Failed(f'train losses {losses}: not decreasing')
    return f'losses {losses_text(losses)}, {last_rate(result)[0]:.0f} clips/s' + \
        (f' ({proc.count("Traceback")} tracebacks)' if 'Traceback' in proc else '')


@check(90, '--amp bf16 trains, the loss falls')
def check_amp_bf16(c):
    return check_amp(c, 'bf16')


@check(90, '--amp fp16 (GradScaler) trains')
def check_amp_fp16(c):
    return check_amp(c, 'fp16')


@check(60, '--channels_last trains')
def check_channels_last(c):
    result = c.result_path('channels_last')
    epochs = ['--n_epochs', '1'] if c.cpu else []  # args()' 3 on a GPU; on CPU the figures are not read
    ok(c.main_py(result, '--channels_last', *c.amp_args('bf16'), *epochs), 'training with --channels_last')
    losses = finite_losses(result)
    return f'losses {losses_text(losses)}, {last_rate(result)[0]:.0f} clips/s'


@check(30, "normalisation on the device equals the CPU's")
def check_device_normalisation(c):
    from datasets.spatial_transforms import NormalizeToInput
    device = torch.device('cpu' if c.cpu else 'cuda')
    norm = NormalizeToInput([0.43, 0.40, 0.37], [0.23, 0.22, 0.22], value_scale=1)
    clips = torch.randint(0, 256, (4, 16, 3, 112, 112), dtype=torch.uint8)
    expected = norm(clips)
    got = norm(clips.to(device)).cpu()
    diff = (got - expected).abs().max().item()
    if got.shape != expected.shape or diff > 1e-5:
        raise Failed(f'shape {tuple(got.shape)} vs {tuple(expected.shape)}, max diff {diff:.2e}')
    return f'max |device - cpu| {diff:.2e} on {tuple(expected.shape)}'


@check(90, 'GPU memory flat from 2 to 6 epochs')
def check_memory_flat(c):
    """Peak memory of a 2-epoch run and of a 6-epoch run, in this process (one
    CUDA context): equal when nothing accumulates from epoch to epoch."""
    if c.cpu:
        raise Skip('GPU memory')
    import gc

    import main
    peaks = []
    for n_epochs in (2, 6):
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        main.main(c.args(c.result_path(f'memory_{n_epochs}'), '--n_epochs', str(n_epochs),
                         '--n_threads', '0'))
        peaks.append(torch.cuda.max_memory_allocated() / 2**20)
    gc.collect()
    retained = torch.cuda.memory_allocated() / 2**20
    if peaks[1] > peaks[0] * 1.05 + 16:
        raise Failed(f'peak {peaks[0]:.0f} MiB after 2 epochs, {peaks[1]:.0f} MiB after 6')
    return f'peak {peaks[0]:.0f} MiB (2 epochs), {peaks[1]:.0f} MiB (6 epochs), ' \
           f'{retained:.0f} MiB still allocated after both runs'


@check(60, 'a bf16 checkpoint resumes under fp16')
def check_resume_under_fp16(c):
    result = c.result_path('resume_fp16')
    ok(c.main_py(result, '--n_epochs', '1', *c.amp_args('bf16')), 'first epoch')
    out = ok(c.main_py(result, '--n_epochs', '2', '--resume_path', str(result / 'save_1.pth'),
                       *c.amp_args('fp16')), 'resume under fp16')
    if 'epoch 2/2 train' not in out:
        raise Failed('the resumed run did not train epoch 2')
    return 'bf16 checkpoint resumed with --amp --amp_dtype fp16'


@check(90, 'torchrun with --batchnorm_sync --amp --inference --auto_resume', name='torchrun_1_process')
def check_torchrun_one_process(c):
    result = c.result_path('torchrun_1')
    extra = ['--batchnorm_sync', '--amp', '--inference', '--auto_resume']
    ok(c.torchrun(1, result, *extra, '--n_epochs', '1'), 'first run')
    out = ok(c.torchrun(1, result, *extra, '--n_epochs', '2'), 'resumed run')
    if 'auto-resume from' not in out or not (result / 'val.json').exists():
        raise Failed(f'no auto-resume or no val.json: {out[-400:]}')
    return f'trained 1 + 1 epochs, {len(json_results(result / "val.json"))} videos scored'


@check(120, 'a killed worker is restarted and resumes')
def check_elastic_restart(c):
    """torchrun --max-restarts 1: the worker SIGKILLed after epoch 1 is restarted
    and the job resumes and finishes (processes found through /proc)."""
    result = c.result_path('elastic')
    # On CPU 3 epochs: the kill still lands in epoch 2, 2 epochs before the end
    cmd = c.torchrun_cmd(1, result, '--n_epochs', c.epochs(6, on_cpu=3), '--auto_resume',
                         launcher=['--max-restarts=1'])
    proc = c.popen(cmd)
    try:
        wait_for(lambda: (result / 'save_1.pth').exists(), proc, 'save_1.pth', 240)
        workers = child_pids(proc.pid)
        if not workers:
            raise Failed('torchrun has no worker process')
        t_kill = time.time()
        os.kill(workers[0], signal.SIGKILL)
        out, err, in_time = finish(proc, 300)
    finally:
        end_tree(proc, 0)  # torchrun's workers run in sessions of their own
    if not in_time:
        raise Failed(f'the job did not finish within 300 s of the kill: {(out + err)[-400:]}')
    if proc.returncode != 0 or 'auto-resume from' not in out + err:
        raise Failed(f'exit {proc.returncode}: {(out + err)[-400:]}')
    return f'worker killed after epoch 1, job finished {time.time() - t_kill:.0f} s later'


@check(90, 'SIGTERM mid-epoch: checkpoint, exit 75, resume')
def check_stop_signal(c):
    """SIGTERM mid-epoch: a checkpoint, exit code 75, and the same command
    continues from it."""
    from utils.preemption import EXIT_PREEMPTED
    result = c.result_path('stop_signal')
    cmd = [sys.executable, MAIN, *c.args(result, '--n_epochs', '2', '--auto_resume',
                                          '--checkpoint_steps', '1', '--batch_size', '4')]
    proc = c.popen(cmd)
    try:
        wait_for(lambda: (result / 'save_1_2.pth').exists(), proc, 'a mid-epoch checkpoint', 240)
        proc.send_signal(signal.SIGTERM)
        t0 = time.time()
        out, err, in_time = finish(proc, 120)
        stopped = time.time() - t0
    finally:
        end_tree(proc, 0)
    if not in_time:
        raise Failed(f'still running 120 s after SIGTERM: {(out + err)[-400:]}')
    if proc.returncode != EXIT_PREEMPTED:
        raise Failed(f'exit {proc.returncode} (expected {EXIT_PREEMPTED}): {(out + err)[-400:]}')
    out = ok(c.run(cmd, 300), 'resumed run')
    if 'auto-resume from' not in out or not (result / 'save_2.pth').exists():
        raise Failed(f'the resumed run did not finish: {out[-400:]}')
    return f'exit {EXIT_PREEMPTED} {stopped:.1f} s after SIGTERM; resumed and finished'


@check(120, 'two --deterministic runs: equal weights')
def check_deterministic_repeat(c):
    """Two identical 1-epoch runs: with --deterministic the weights must be
    equal; without it, the difference is printed (a figure, not a failure)."""
    diffs = {}
    for flag in ([], ['--deterministic']):
        runs = [c.result_path('repeat') for _ in range(2)]
        if c.cpu and not flag:  # the shared checkpoint is this very command's: one run fewer on CPU
            runs[0] = c.trained_checkpoint().parent
        for result in runs:
            if not (result / 'save_1.pth').exists():
                ok(c.main_py(result, '--n_epochs', '1', '--no_val', *flag), 'training')
        diffs[bool(flag)] = max_weight_diff(runs[0] / 'save_1.pth', runs[1] / 'save_1.pth')
    if diffs[True] != 0:
        raise Failed(f'--deterministic runs differ by up to {diffs[True]:.3g}')
    return f'max weight difference of two runs: {diffs[False]:.3g} by default, 0 with --deterministic'


@check(1800, 'the test suite (CPU)')
def check_test_suite(c):
    proc = c.run([sys.executable, '-m', 'pytest', '-q', '-x', '-p', 'no:cacheprovider'], 3600,
                 env=c.env(OMP_NUM_THREADS='2'))
    summary = (proc.stdout.strip().splitlines() or [''])[-1]
    if proc.returncode != 0:
        raise Failed(f'{summary}: {tail(proc)}')
    return summary
