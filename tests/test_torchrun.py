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


def test_two_node_rendezvous_on_loopback(tiny_synthetic, tmp_path):
    port = free_port()
    result = tmp_path / 'r'
    args = tiny_args(*tiny_synthetic, result, '--distributed', '--n_epochs', '1',
                     '--n_threads', '0', '--no_val')
    procs = [subprocess.Popen(
        torchrun('--nnodes=2', f'--node_rank={rank}', '--nproc_per_node=1',
                 '--master_addr=127.0.0.1', f'--master_port={port}', MAIN) + args,
        cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank in (0, 1)]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert '2 process(es)' in outs[0]
    assert (result / 'save_1.pth').exists()


def _worker_pids(parent_pid):
    out = subprocess.run(['pgrep', '-P', str(parent_pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


@pytest.mark.parametrize('rendezvous', ['static', 'c10d'])
def test_elastic_restart_resumes_after_a_killed_worker(tiny_synthetic, tmp_path, rendezvous):
    result = tmp_path / 'r'
    n_epochs = 8
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


def test_deprecated_launch_passes_local_rank(tiny_synthetic, tmp_path):
    result = tmp_path / 'r'
    args = tiny_args(*tiny_synthetic, result, '--distributed', '--n_epochs', '1',
                     '--n_threads', '0', '--no_val')
    check_run([sys.executable, '-m', 'torch.distributed.launch', '--nproc_per_node=2',
               f'--master_port={free_port()}', MAIN] + args)
    assert (result / 'save_1.pth').exists()


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


@pytest.mark.parametrize('share_store', [True, False], ids=['agent_store', 'fresh_store'])
def test_two_agent_elastic_restart_recovers(tiny_synthetic, tmp_path, share_store):
    """Two torchrun agents (two 'nodes') on loopback, c10d rendezvous: one worker is
    killed, both agents restart their workers, and the job resumes and finishes.
    The node whose worker survived sees a membership change, which its agent does
    not count as a restart: the restart counts of the two nodes then differ."""
    result = tmp_path / 'r'
    n_epochs = 6
    args = tiny_args(*tiny_synthetic, result, '--distributed', '--n_epochs', str(n_epochs),
                     '--checkpoint', '1', '--auto_resume', '--n_threads', '0', '--no_val')
    port = free_port()
    e = env()
    if not share_store:
        e['TORCH_DISABLE_SHARE_RDZV_TCP_STORE'] = '1'
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
