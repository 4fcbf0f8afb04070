"""The GPU self-check's checks on 2 GPUs or more (SKIPped on fewer; on a CPU dry
run 2 gloo processes stand in)."""
import json
import os
import shutil
import signal
import sys
import time

from util_scripts.gpu_checks.common import (
    MAIN,
    Failed,
    Sampler,
    Skip,
    batch_rows,
    count_graph_breaks,
    finish,
    finite_losses,
    gpu_processes,
    last_rate,
    max_weight_diff,
    new_registry,
    ok,
    read_log,
    train_losses,
    wait_for,
)
from utils.processes import alive, child_pids, descendants, end_tree, exited

CHECKS, check = new_registry()  # {name: Check} in the order defined, and @check

# cuDNN and cuBLAS pick TF32 kernels by shape (convolutions use TF32 by default):
# comparisons of 1 and 2 processes turn it off, with --deterministic.
NO_TF32 = {'NVIDIA_TF32_OVERRIDE': '0'}
FROZEN_TIMEOUT = 20  # --dist_timeout of the frozen-rank check
# On CPU: the same freeze and exit, without 15 s of waiting for it (the timeout is set once
# training started, so start-up is not cut short; tests/test_dist_timeout.py uses 2 s)
CPU_FROZEN_TIMEOUT = 5


def no_tf32(c):
    """The environment with TF32 off on a GPU; on a CPU dry run none of its own
    (TF32 is a GPU setting), so that the command runs in a fork."""
    return None if c.cpu else c.env(**NO_TF32)


@check(300, '--compile under DDP with accumulation, channels_last, grad checkpointing, '
       'SyncBatchNorm', gpus=2, quick=True)
def check_compile_ddp_2gpu(c):
    """--compile under DDP with --accumulation_steps 2 (no_sync), --channels_last,
    --grad_checkpointing and --batchnorm_sync: it trains; graph breaks counted
    over both ranks (SyncBatchNorm may break the graph at every layer); speed
    against eager."""
    extra = ['--n_epochs', c.epochs(2, on_cpu=1), '--no_val', '--accumulation_steps', '2',
             '--channels_last', '--grad_checkpointing', '--batchnorm_sync']
    runs = {}
    for mode in ('eager', 'compile'):
        result = c.result_path(mode)
        flag = ['--compile'] if mode == 'compile' else []
        out = ok(c.torchrun(2, result, *extra, *flag, timeout=1800,
                            env=c.env(TORCH_LOGS='graph_breaks')), f'{mode} on 2 processes')
        finite_losses(result)
        runs[mode] = (last_rate(result)[0], count_graph_breaks(out))
    ratio = runs['compile'][0] / runs['eager'][0]
    return (f'{runs["compile"][1]} graph breaks over 2 ranks; last epoch at {runs["compile"][0]:.0f} '
            f'clips/s compiled vs {runs["eager"][0]:.0f} eager ({ratio:.2f}x)')


@check(120, "--grad_checkpointing with --batchnorm_sync: weights equal to a plain run's", gpus=2, quick=True)
def check_gradckpt_syncbn_2gpu(c):
    """--grad_checkpointing with --batchnorm_sync on 2 GPUs (SyncBatchNorm's
    all_gathers run again in the recomputed backward): weights equal to the
    plain run's within 1e-4 (--deterministic, TF32 off)."""
    extra = ['--n_epochs', '1', '--no_val', '--batchnorm_sync', '--deterministic']
    results = {}
    for mode in ('plain', 'checkpointed'):
        results[mode] = c.result_path(mode)
        flag = ['--grad_checkpointing'] if mode == 'checkpointed' else []
        ok(c.torchrun(2, results[mode], *extra, *flag, env=no_tf32(c)), f'{mode} run')
    a, b = results['plain'] / 'save_1.pth', results['checkpointed'] / 'save_1.pth'
    params = max_weight_diff(a, b, parameters_only=True)
    everything = max_weight_diff(a, b)
    if everything > 1e-4:
        raise Failed(f'weights differ by up to {params:.2e}, with BatchNorm statistics '
                     f'{everything:.2e}')
    return f'max difference {params:.2e} (weights), {everything:.2e} (with BatchNorm statistics)'


@check(90, '--precise_bn with --batchnorm_sync runs', gpus=2, quick=True)
def check_precise_bn_syncbn_2gpu(c):
    """--precise_bn with --batchnorm_sync on 2 GPUs: the statistics pass runs and
    validation follows."""
    result = c.result_path('precise_bn')
    ok(c.torchrun(2, result, '--n_epochs', c.epochs(2, on_cpu=1), '--batchnorm_sync',
                  '--precise_bn', '4'),
       '--precise_bn 4 --batchnorm_sync')
    rows = read_log(result / 'val.log')
    if not rows:
        raise Failed('no validation after the precise BN pass')
    last = rows[-1]
    return (f'val loss {float(last["loss"]):.4f}, video acc {float(last["acc"]):.4f} after '
            f'{len(rows)} epoch(s)')


@check(120, "main.py's own spawner: one CUDA context per GPU", gpus=2, quick=True)
def check_spawn_2gpu(c):
    """--distributed without a launcher (main.py's mp.spawn) on 2 GPUs: the job
    trains, and each GPU holds one CUDA context of it (processes per GPU)."""
    from utils.distributed import free_port
    result = c.result_path('spawn')
    env = None if c.cpu else c.env(CUDA_VISIBLE_DEVICES='0,1')
    # A spawned rank's loader workers are spawned too (mp.spawn makes spawn the default start
    # method there), each importing torch and main anew: on CPU one worker per loader still
    # pickles the data sets and loads through them, at half the imports.
    workers = ['--n_threads', '1'] if c.cpu else []
    cmd = [sys.executable, MAIN, *c.args(result, '--distributed', '--n_epochs',
                                          c.epochs(2, on_cpu=1), '--dist_url',
                                          f'tcp://127.0.0.1:{free_port()}', '--world_size', '1',
                                          *workers)]
    proc = c.popen(cmd, env=env)
    try:  # the job's processes, read while its pid is still its own (until finish reaps it)
        with Sampler(lambda: None if exited(proc) else (set(descendants(proc.pid)), gpu_processes()),
                     0.5) as sampler:
            sampler.active.set()
            out, err, in_time = finish(proc, 900)
    finally:
        end_tree(proc, 0)
    if not in_time:
        raise Failed(f'the job ran past 900 s: {(out + err).strip()[-400:]}')
    if proc.returncode != 0:
        raise Failed(f'exit {proc.returncode}: {(out + err).strip()[-400:]}')
    n = 1 if c.cpu else 2
    if f'{n} process(es)' not in out:
        raise Failed(f'expected {n} processes: {out.strip()[-300:]}')
    counts = {}
    for ours, per_gpu in sampler.samples:
        for gpu, pids in (per_gpu or {}).items():
            counts[gpu] = max(counts.get(gpu, 0), len(pids & ours))
    if c.cpu:
        return f'trained on {n} process (CPU: main.py spawns one per GPU; none here)'
    if not any(counts.values()):
        raise Skip('the job trained on 2 processes, but pynvml/nvidia-smi list none of its '
                   'pids (a PID namespace?): contexts per GPU not counted')
    if any(counts.get(g, 0) != 1 for g in (0, 1)):
        raise Failed(f'processes of the job per GPU (most at once): {counts}')
    return f'trained on 2 processes; processes of the job per GPU: {counts}'


@check(150, 'a frozen rank under NCCL: the other exits after --dist_timeout', gpus=2, quick=True)
def check_dist_timeout_nccl(c):
    """--dist_timeout under NCCL: one rank frozen with SIGSTOP mid-epoch, the other
    exits within about the timeout, with one line."""
    limit = CPU_FROZEN_TIMEOUT if c.cpu else FROZEN_TIMEOUT
    result = c.result_path('frozen')
    cmd = c.torchrun_cmd(2, result, '--n_epochs', '50', '--no_val', '--dist_timeout',
                         str(limit), '--log_interval', '1')
    proc = c.popen(cmd)
    try:
        wait_for(lambda: batch_rows(result) >= 4, proc, 'four training steps', 300)
        workers = child_pids(proc.pid)
        if len(workers) != 2:
            raise Failed(f'expected 2 ranks under torchrun, found {workers}')
        os.kill(workers[1], signal.SIGSTOP)
        t0 = time.time()
        while alive(workers[0]) and time.time() - t0 < 10 * limit + 60:
            time.sleep(0.1)
        seconds = time.time() - t0
        print(f'the other rank ended {seconds:.1f} s after the freeze', flush=True)
    finally:
        out, err, _ = finish(proc, 0)  # the frozen rank killed too: SIGKILL reaches a stopped process
    lines = [line for line in err.splitlines() if line.startswith('error: rank')]
    if seconds > 3 * limit + 30:
        raise Failed(f'the other rank was still running {seconds:.0f} s after the freeze '
                     f'(--dist_timeout {limit})')
    return (f'the other rank exited {seconds:.0f} s after the freeze (--dist_timeout '
            f'{limit}); {len(lines)} error line(s), {err.count("Traceback")} '
            f'traceback(s): {lines[0][:160] if lines else err.strip()[-160:]}')


# ----------------------------------------------------------------------------- the rest

@check(120, 'SyncBatchNorm on 2 GPUs = 1 GPU on the global batch', gpus=2)
def check_syncbn_2_vs_1(c):
    """One epoch on the same global batches: 2 GPUs with SyncBatchNorm against 1.
    A small learning rate, so that rounding differences are not amplified."""
    # Batches of 16 (the dry run's are 4): on CPU, without SyncBatchNorm, each
    # rank's BatchNorm sees half a batch, and 2 clips are too few to agree.
    extra = ['--n_epochs', '1', '--batchnorm_sync', '--no_val', '--deterministic',
             '--learning_rate', '0.001', '--batch_size', '16']
    one, two = c.result_path('sync_1'), c.result_path('sync_2')
    ok(c.torchrun(1, one, *extra, env=no_tf32(c)), '1 GPU')
    ok(c.torchrun(2, two, *extra, env=no_tf32(c)), '2 GPUs')
    a, b = train_losses(one)[0], train_losses(two)[0]
    if abs(a - b) > 2e-3 * max(1.0, abs(a)):
        raise Failed(f'epoch loss {a:.6f} on 1 GPU, {b:.6f} on 2')
    return f'epoch loss {a:.6f} (1 GPU) vs {b:.6f} (2 GPUs), --deterministic, TF32 off'


def last_validation(result):
    rows = read_log(result / 'val.log') if (result / 'val.log').exists() else []
    if not rows:
        raise Failed(f'no validation in {result / "val.log"}')
    return tuple(float(rows[-1][k]) for k in ('loss', 'acc', 'clip_acc'))


@check(120, 'validation on 2 processes = 1', gpus=2)
def check_nccl_validation(c):
    """Validation on 1 and 2 processes within 1e-4: --deterministic and
    NVIDIA_TF32_OVERRIDE=0 (cudnn.benchmark and TF32 otherwise choose kernels
    by batch shape, and the two runs see different batch shapes)."""
    if c.cpu:  # this very training is the shared checkpoint's, made once a dry run
        weights = c.trained_checkpoint()
    else:
        trained = c.result_path('val_source')
        ok(c.main_py(trained, '--n_epochs', '1', '--no_val'), 'training')
        weights = trained / 'save_1.pth'
    results = [c.result_path(f'val_{n}') for n in (1, 2)]
    for n, result in zip((1, 2), results):
        ok(c.torchrun(n, result, '--no_train', '--deterministic', '--resume_path',
                      str(weights), env=no_tf32(c)), f'{n} process(es)')
    one, two = (last_validation(r) for r in results)
    if any(abs(x - y) > 1e-4 for x, y in zip(one, two)):
        raise Failed(f'loss/video acc/clip acc {one} on 1 process, {two} on 2')
    return f'loss, video acc, clip acc {one} on 1 and 2 processes (--deterministic, TF32 off)'


@check(150, 'one rank fails: the job exits', gpus=2)
def check_exit_after_rank_failure(c):
    """A video whose frames are corrupt fails on the one rank that loads it;
    the job must exit (not hang in destroy_process_group)."""
    data = c.work / 'data_corrupt'
    if not data.exists():
        shutil.copytree(c.data, data)
        from datasets.synthetic import ANNOTATION_NAME
        annotation = json.loads((data / ANNOTATION_NAME).read_text())
        video, entry = next((k, v) for k, v in annotation['database'].items()
                            if v['subset'] == 'training')
        for frame in (data / 'jpg' / entry['annotations']['label'] / video).glob('*.jpg'):
            frame.write_bytes(b'not a jpeg')  # one training video: one rank fails
    result = c.result_path('rank_failure')
    cmd = [a.replace(str(c.data), str(data)) if a.startswith(str(c.data)) else a
           for a in c.torchrun_cmd(2, result, '--n_epochs', '1')]
    proc = c.run(cmd, timeout=600)
    if proc.returncode == 0:
        raise Failed('the job succeeded on corrupt frames')
    if proc.seconds > 120:
        raise Failed(f'the job took {proc.seconds:.0f} s to exit after one rank failed')
    return f'exited {proc.returncode} after {proc.seconds:.0f} s'


@check(300, 'bench.ddp_scaling on the GPUs', gpus=2)
def check_ddp_scaling(c):
    n = 2 if c.cpu else min(c.n_gpus, 8)
    size = ['--model_depth', '10', '--sample_size', '32', '--sample_duration', '8', '--steps',
            '3'] if c.cpu else ['--model_depth', '18', '--sample_size', '112',
                                '--sample_duration', '16', '--steps', '10']
    out = ok(c.run([sys.executable, '-m', 'bench.ddp_scaling', '--device',
                    'cpu' if c.cpu else 'cuda', '--nprocs', '1', str(n), '--global_batch',
                    str(8 * n), *size], 900), 'bench.ddp_scaling')
    return ' | '.join(line.strip() for line in out.strip().splitlines()[-3:])
