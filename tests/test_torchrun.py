"""main.py under real launchers: torchrun on one node, a two-node rendezvous on
loopback, an elastic restart after a killed worker, the deprecated
torch.distributed.launch, and main.py's own spawner. CPU, gloo, 2 processes."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import main
from tests.conftest import tiny_args
from utils.checkpoint import load_checkpoint
from utils.distributed import free_port
from utils.logs import read_tsv
from utils.processes import child_pids

# every test starts main.py under a launcher, in processes of its own
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures('one_torch_thread')]

ROOT = Path(__file__).resolve().parents[1]
MAIN = str(ROOT / 'main.py')


def env():
    e = dict(os.environ, OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1')
    e['PYTHONPATH'] = str(ROOT) + os.pathsep + e.get('PYTHONPATH', '')
    e.pop('RANK', None)
    e.pop('WORLD_SIZE', None)
    return e


def torchrun(*args):
    return [sys.executable, '-m', 'torch.distributed.run', *args]


def check_run(cmd, timeout=240):
    proc = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def test_torchrun_two_processes_train_validate_resume_infer(tiny_synthetic, tmp_path):
    result = tmp_path / 'r'
    args = tiny_args(*tiny_synthetic, result, '--distributed', '--batchnorm_sync',
                     '--checkpoint', '1', '--n_threads', '0')
    base = torchrun('--nproc_per_node=2', f'--master_port={free_port()}', MAIN)
    out = check_run(base + args + ['--n_epochs', '1'])
    assert out.count('epoch 1/1 train') == 1  # rank 0 alone prints
    assert 'model resnet-10' in out and '2 process(es)' in out
    out = check_run(torchrun('--nproc_per_node=2', f'--master_port={free_port()}', MAIN)
                    + args + ['--n_epochs', '2', '--resume_path', str(result / 'save_1.pth'),
                              '--inference', '--inference_stride', '4'])
    assert 'epoch 1/' not in out and 'epoch 2/2 train' in out
    assert [r['epoch'] for r in read_tsv(result / 'train.log')] == ['1', '2']
    assert [r['epoch'] for r in read_tsv(result / 'val.log')] == ['1', '2']
    assert load_checkpoint(result / 'save_2.pth')['epoch'] == 2
    results = json.loads((result / 'val.json').read_text())['results']
    assert len(results) == 12  # every validation video, once
    opts = json.loads((result / 'opts.json').read_text())
    assert opts['run']['world_size'] == 2 and opts['run']['batch_per_process'] == 4
    # One process scoring the same checkpoint writes the same results.
    single = tmp_path / 'single'
    main.main(tiny_args(*tiny_synthetic, single, '--no_train', '--no_val', '--inference',
                        '--inference_stride', '4', '--resume_path', str(result / 'save_2.pth')))
    expected = json.loads((single / 'val.json').read_text())['results']
    assert list(results) == list(expected)  # annotation order
    for vid, entries in expected.items():
        assert [e['label'] for e in results[vid]] == [e['label'] for e in entries]
        assert [e['score'] for e in results[vid]] == pytest.approx(
            [e['score'] for e in entries], abs=1e-5)


# One epoch on 2 processes, no validation: the job each launcher below trains.
ONE_EPOCH_JOB = ('--distributed', '--n_epochs', '1', '--n_threads', '0', '--no_val')


@pytest.fixture(scope='module')
def two_node_job(tiny_synthetic, tmp_path_factory):
    """ONE_EPOCH_JOB under two torchrun agents (--nnodes=2) on loopback:
    (result folder, the agents' return codes, their outputs). The launches
    of the same job by srun and torch.distributed.launch compare their weights
    with its."""
    port = free_port()
    result = tmp_path_factory.mktemp('two_node') / 'r'
    args = tiny_args(*tiny_synthetic, result, *ONE_EPOCH_JOB)
    procs = [subprocess.Popen(
        torchrun('--nnodes=2', f'--node_rank={rank}', '--nproc_per_node=1',
                 '--master_addr=127.0.0.1', f'--master_port={port}', MAIN) + args,
        cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank in (0, 1)]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    return result, [p.returncode for p in procs], outs


def test_two_node_rendezvous_on_loopback(two_node_job):
    result, codes, outs = two_node_job
    assert codes == [0, 0], outs
    assert '2 process(es)' in outs[0]
    assert (result / 'save_1.pth').exists()


def _same_weights(a, b):
    a, b = load_checkpoint(a)['state_dict'], load_checkpoint(b)['state_dict']
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in b)


def _worker_pids(parent_pid):
    return child_pids(parent_pid)


# The static rendezvous's restart: test_a_peer_killed_mid_epoch_is_one_line_on_the_surviving_rank.
@pytest.mark.parametrize('rendezvous', ['c10d'])
def test_elastic_restart_resumes_after_a_killed_worker(tiny_synthetic, tmp_path, rendezvous):
    result = tmp_path / 'r'
    n_epochs = 4
    args = tiny_args(*tiny_synthetic, result, '--distributed', '--n_epochs', str(n_epochs),
                     '--checkpoint', '1', '--auto_resume', '--n_threads', '0', '--no_val')
    port = free_port()
    launch = [f'--master_port={port}'] if rendezvous == 'static' else \
        ['--rdzv_backend=c10d', f'--rdzv_endpoint=127.0.0.1:{port}']
    proc = subprocess.Popen(
        torchrun('--nproc_per_node=2', '--max-restarts=1', *launch, MAIN) + args,
        cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)  # so a failure can take every worker down with it
    try:
        deadline = time.time() + 120
        while not (result / 'save_1.pth').exists():
            assert proc.poll() is None and time.time() < deadline, proc.communicate()[0]
            time.sleep(0.05)
        workers = _worker_pids(proc.pid)
        assert len(workers) == 2
        os.kill(workers[1], signal.SIGKILL)  # one worker dies mid-run
        out = proc.communicate(timeout=240)[0]
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, out[-4000:]
    assert 'auto-resume from' in out
    ckpt = load_checkpoint(result / f'save_{n_epochs}.pth')
    assert ckpt['epoch'] == n_epochs
    epochs = [int(r['epoch']) for r in read_tsv(result / 'train.log')]
    assert epochs[-1] == n_epochs and set(epochs) == set(range(1, n_epochs + 1))
    # Not all epochs ran after the restart: it resumed, not started over.
    assert len(epochs) < 2 * n_epochs


def test_a_peer_killed_mid_epoch_is_one_line_on_the_surviving_rank(tiny_synthetic, tmp_path):
    """--n_threads 1: torchrun ends the surviving rank's process group after its
    peer died. Before: two chained tracebacks (the collective's 'Connection reset
    by peer', then 'DataLoader worker (pid N) is killed by signal: Terminated');
    now one line naming the collective and why, and the job restarts (static
    rendezvous) and resumes from its last checkpoint to the end."""
    result = tmp_path / 'r'
    n_epochs = 3
    args = tiny_args(*tiny_synthetic, result, '--distributed', '--n_epochs', str(n_epochs),
                     '--checkpoint', '1', '--auto_resume', '--n_threads', '1', '--no_val',
                     '--batch_size', '4', '--log_interval', '1')
    proc = subprocess.Popen(
        torchrun('--nproc_per_node=2', '--max-restarts=2', '--monitor-interval=0.5',
                 f'--master_port={free_port()}', MAIN) + args,
        cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        deadline = time.time() + 180
        while _batch_rows(result) < 8:  # epoch 2, batch 2 of 6
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.02)
        workers = _worker_pids(proc.pid)
        assert len(workers) == 2
        os.kill(workers[1], signal.SIGKILL)
        out, err = proc.communicate(timeout=240)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    assert 'Traceback' not in err, err
    lines = [line for line in err.splitlines() if line.startswith('error:')]
    assert len(lines) == 1, err
    # The collective that failed; rarely, torchrun's SIGTERM to the process group
    # comes first, while the rank is between steps.
    assert lines[0].startswith(('error: rank 0: ', 'error: rank 1: ')) and \
        '--auto_resume' in lines[0], err
    assert 'another process of the job died' in lines[0] or \
        'sent to the whole process group' in lines[0], err
    assert load_checkpoint(result / f'save_{n_epochs}.pth')['epoch'] == n_epochs
    assert 'auto-resume from' in out + err
    epochs = [int(r['epoch']) for r in read_tsv(result / 'train.log')]
    assert epochs[-1] == n_epochs and set(epochs) == set(range(1, n_epochs + 1))
    assert len(epochs) < 2 * n_epochs  # resumed, not started over


def test_sigterm_to_torchrun_with_loader_workers_still_checkpoints(tiny_synthetic, tmp_path):
    """scancel or a terminal's kill ends torchrun, which passes SIGTERM to each
    worker's whole process group, loader workers included. Before, those died
    of it and the ranks failed with 'DataLoader worker ... is killed by signal:
    Terminated' (no checkpoint); now they leave it to the ranks, which stop at
    the same step with a checkpoint."""
    result = tmp_path / 'r'
    args = tiny_args(*tiny_synthetic, result, '--distributed', '--n_epochs', '3',
                     '--n_threads', '1', '--no_val', '--batch_size', '4', '--log_interval', '1')
    proc = subprocess.Popen(
        torchrun('--nproc_per_node=2', f'--master_port={free_port()}', MAIN) + args,
        cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        deadline = time.time() + 180
        while _batch_rows(result) < 3:
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGTERM)  # the agent
        out, err = proc.communicate(timeout=120)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert 'stopped by SIGTERM: state saved in' in out, out[-2000:] + err[-3000:]
    assert 'DataLoader worker' not in err, err
    assert list(result.glob('save_*_*.pth')), sorted(p.name for p in result.iterdir())


def _batch_rows(result):
    try:
        return len(read_tsv(result / 'train_batch.log'))
    except (OSError, ValueError):
        return 0


def test_deprecated_launch_passes_local_rank(tiny_synthetic, tmp_path, two_node_job):
    result = tmp_path / 'r'
    args = tiny_args(*tiny_synthetic, result, *ONE_EPOCH_JOB)
    check_run([sys.executable, '-m', 'torch.distributed.launch', '--nproc_per_node=2',
               f'--master_port={free_port()}', MAIN] + args)
    assert (result / 'save_1.pth').exists()
    assert _same_weights(result / 'save_1.pth', two_node_job[0] / 'save_1.pth')


def test_main_spawns_its_own_processes_without_a_launcher(tiny_synthetic, tmp_path):
    """The predecessor's way: python main.py --distributed --dist_url ... --world_size 1
    (one node); on CPU it runs one process."""
    result = tmp_path / 'r'
    args = tiny_args(*tiny_synthetic, result, '--distributed', '--n_epochs', '1',
                     '--n_threads', '0', '--no_val', '--dist_url',
                     f'tcp://127.0.0.1:{free_port()}', '--world_size', '1')
    out = check_run([sys.executable, MAIN] + args)
    assert '1 process(es)' in out
    assert torch.load(result / 'save_1.pth', weights_only=True)['epoch'] == 1


def test_two_agent_elastic_restart_recovers(tiny_synthetic, tmp_path):
    """Two torchrun agents (two 'nodes') on loopback, c10d rendezvous, a fresh
    store per round (the multi-node setting): one worker is killed, both agents
    restart their workers, and the job resumes and finishes. The node whose
    worker survived sees a membership change, which its agent does not count as
    a restart: a key prefix from the restart count would split the ranks."""
    result = tmp_path / 'r'
    n_epochs = 3
    args = tiny_args(*tiny_synthetic, result, '--distributed', '--n_epochs', str(n_epochs),
                     '--checkpoint', '1', '--auto_resume', '--n_threads', '0', '--no_val')
    port = free_port()
    e = dict(env(), TORCH_DISABLE_SHARE_RDZV_TCP_STORE='1')
    agents = [subprocess.Popen(
        torchrun('--nnodes=2', '--nproc_per_node=1', '--rdzv_backend=c10d',
                 f'--rdzv_endpoint=127.0.0.1:{port}', '--rdzv_id=two_agents', '--max-restarts=2',
                 '--monitor-interval=0.5', MAIN) + args,
        cwd=ROOT, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True) for _ in range(2)]
    try:
        deadline = time.time() + 180
        while not (result / 'save_1.pth').exists():
            assert all(a.poll() is None for a in agents) and time.time() < deadline, \
                [a.communicate()[0][-3000:] for a in agents]
            time.sleep(0.05)
        victim = _worker_pids(agents[1].pid)
        assert len(victim) == 1
        os.kill(victim[0], signal.SIGKILL)
        outs = [a.communicate(timeout=300)[0] for a in agents]
    finally:
        # Workers run in sessions of their own: end them too if the job hangs.
        for pid in [w for a in agents for w in _worker_pids(a.pid)] + [a.pid for a in agents]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert [a.returncode for a in agents] == [0, 0], [o[-4000:] for o in outs]
    assert 'auto-resume from' in ''.join(outs)
    assert load_checkpoint(result / f'save_{n_epochs}.pth')['epoch'] == n_epochs
    epochs = [int(r['epoch']) for r in read_tsv(result / 'train.log')]
    assert set(epochs) == set(range(1, n_epochs + 1)) and len(epochs) < 2 * n_epochs


def _free_port_in(low, high):
    """A free port in [low, high): SLURM-style runs derive theirs from the job id."""
    import random
    import socket
    for _ in range(200):
        port = random.randrange(low, high)
        with socket.socket() as s:
            try:
                s.bind(('127.0.0.1', port))
            except OSError:
                continue
            return port
    raise RuntimeError('no free port')


def test_srun_style_start_trains_the_same_job_as_torchrun(tiny_synthetic, tmp_path, two_node_job):
    """`srun python main.py --distributed` without torchrun: rank, world size,
    local rank and the master address come from SLURM's variables (faked here
    for two CPU processes); the job is the one torchrun trains (two_node_job),
    weight for weight."""
    args = ONE_EPOCH_JOB
    via_torchrun = two_node_job[0]
    via_srun = tmp_path / 'srun'
    job_id = _free_port_in(20000, 40000) - 20000  # the port main.py derives: 20000 + id
    procs = []
    for rank in (0, 1):
        e = env()
        e.update(SLURM_JOB_ID=str(job_id), SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank),
                 SLURM_STEP_NUM_TASKS='2', SLURM_NTASKS='2', SLURM_STEP_NODELIST='127.0.0.1',
                 SLURM_JOB_NODELIST='127.0.0.1')
        for key in ('MASTER_ADDR', 'MASTER_PORT', 'LOCAL_RANK'):
            e.pop(key, None)
        procs.append(subprocess.Popen([sys.executable, MAIN] + tiny_args(*tiny_synthetic, via_srun, *args),
                                      cwd=ROOT, env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[-3000:] for o in outs]
    assert '2 process(es)' in outs[0] and outs[1].count('epoch 1/1 train') == 0
    a = load_checkpoint(via_srun / 'save_1.pth')['state_dict']
    b = load_checkpoint(via_torchrun / 'save_1.pth')['state_dict']
    assert all(torch.equal(a[k], b[k]) for k in b)


def _fake_slurm_bin(tmp_path):
    """srun that runs its command once (one node), scontrol that knows the
    node list and records requeue requests."""
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    (bin_dir / 'srun').write_text(
        '#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\n'
        'export SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_STEP_NUM_TASKS=1\nexec "$@"\n')
    (bin_dir / 'scontrol').write_text(
        '#!/bin/bash\nif [ "$1" = show ]; then echo 127.0.0.1; '
        f'else echo "$@" >> {tmp_path}/scontrol.calls; fi\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return bin_dir


def test_sbatch_script_trains_stops_on_sigusr1_requeues_and_resumes(tiny_synthetic, tmp_path):
    """scripts/slurm/train.sbatch under a fake srun/scontrol, 2 CPU processes:
    SIGUSR1 (SLURM's warning before the time limit) reaches the workers through
    torchrun; they checkpoint mid-epoch and exit 75, rank 0 requeues the job,
    and the requeued script continues from the checkpoint."""
    result = tmp_path / 'r'
    e = env()
    e.update(PATH=f'{_fake_slurm_bin(tmp_path)}{os.pathsep}{Path(sys.executable).parent}'
                  f'{os.pathsep}{e["PATH"]}',
             SLURM_JOB_ID=str(_free_port_in(20000, 40000) - 20000), SLURM_NNODES='1',
             SLURM_JOB_NODELIST='127.0.0.1', GPUS_PER_NODE='2', OMP_NUM_THREADS='1')
    cmd = ['bash', str(ROOT / 'scripts/slurm/train.sbatch')] + tiny_args(
        *tiny_synthetic, result, '--n_epochs', '2', '--batch_size', '4', '--n_threads', '0',
        '--no_val', '--checkpoint_steps', '1')
    proc = subprocess.Popen(cmd, cwd=ROOT, env=e, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.time() + 180
        while not (result / 'save_1_2.pth').exists():
            assert proc.poll() is None and time.time() < deadline, proc.communicate()[0][-3000:]
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGUSR1)  # the torchrun agent: the script exec'd it
        out = proc.communicate(timeout=120)[0]
    finally:
        for pid in _worker_pids(proc.pid) + [proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert 'stopped by SIGUSR1' in out, out[-3000:]
    assert (tmp_path / 'scontrol.calls').read_text().split() == ['requeue', e['SLURM_JOB_ID']]
    assert not (result / 'save_2.pth').exists()
    out = subprocess.run(cmd, cwd=ROOT, env=e, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert 'auto-resume from' in out.stdout + out.stderr
    batches = [(r['epoch'], r['batch']) for r in read_tsv(result / 'train_batch.log')]
    assert batches == [(str(ep), str(b)) for ep in (1, 2) for b in range(1, 7)]
