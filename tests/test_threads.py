"""Intra-op threads chosen from the CPUs a process may use (utils/threads.py), and
the live keep-up line that tells threads from the model."""
import os
import re

import pytest
import torch

import live
from utils import threads as th


@pytest.fixture
def restore_threads(monkeypatch):
    n = torch.get_num_threads()
    yield monkeypatch
    torch.set_num_threads(n)


def test_cgroup_v2_quota_is_read_and_rounded_up(tmp_path, monkeypatch):
    (tmp_path / 'cpu.max').write_text('150000 100000\n')
    assert th.cgroup_cpu_quota(tmp_path) == 1.5
    monkeypatch.setattr(th, 'affinity_cpus', lambda: 16)
    assert th.usable_cpus(tmp_path) == 2  # 1.5 CPUs of time: two threads can run
    (tmp_path / 'cpu.max').write_text('max 100000\n')
    assert th.cgroup_cpu_quota(tmp_path) is None
    assert th.usable_cpus(tmp_path) == 16


def test_cgroup_v1_quota_and_no_quota(tmp_path, monkeypatch):
    monkeypatch.setattr(th, 'affinity_cpus', lambda: 8)
    assert th.usable_cpus(tmp_path) == 8  # nothing readable: the affinity mask
    (tmp_path / 'cpu').mkdir()
    (tmp_path / 'cpu' / 'cpu.cfs_period_us').write_text('100000\n')
    (tmp_path / 'cpu' / 'cpu.cfs_quota_us').write_text('-1\n')
    assert th.cgroup_cpu_quota(tmp_path) is None
    (tmp_path / 'cpu' / 'cpu.cfs_quota_us').write_text('300000\n')
    assert th.usable_cpus(tmp_path) == 3


def test_the_affinity_mask_caps_a_larger_quota(tmp_path, monkeypatch):
    (tmp_path / 'cpu.max').write_text('800000 100000\n')
    monkeypatch.setattr(th, 'affinity_cpus', lambda: 2)
    assert th.usable_cpus(tmp_path) == 2


@pytest.mark.parametrize('cpus, ranks, decoders, expected', [
    (2, 1, 2, 1),    # the demo here: two workers decode, the model gets the rest (at least one)
    (2, 1, 0, 2),    # no workers: the process decodes between steps
    (96, 8, 4, 8),   # an 8-GPU node: 12 CPUs a rank, 4 of them for its workers
    (16, 1, 1, 15),  # a live stream: one reader thread
    (4, 8, 4, 1),    # more ranks than CPUs
])
def test_default_threads(cpus, ranks, decoders, expected):
    assert th.default_threads(ranks, decoders, cpus) == expected


def test_set_threads_precedence(restore_threads):
    monkeypatch = restore_threads
    monkeypatch.setattr(th, 'usable_cpus', lambda root=th.CGROUP: 6)
    monkeypatch.delenv('OMP_NUM_THREADS', raising=False)
    assert th.set_threads(0, 1, 2) == (4, '6 usable CPUs - 2 decoding')
    assert torch.get_num_threads() == 4
    monkeypatch.setenv('OMP_NUM_THREADS', '3')  # the user's own setting beats the default
    assert th.set_threads(0, 2, 2) == (3, 'OMP_NUM_THREADS')
    assert th.set_threads(2, 1, 0) == (2, '--threads')  # and the option beats both
    assert torch.get_num_threads() == 2


def test_usable_cpus_on_this_machine():
    assert 1 <= th.usable_cpus() <= (os.cpu_count() or 1)


def test_keep_up_line_says_when_threads_lose_the_time():
    assert live.keep_up_line(0.05, 8, 25.0).startswith('keeps up: 0.050 s per window')
    line = live.keep_up_line(0.33, 8, 25.0)  # measured with one thread, or threads no better
    assert line.endswith('use --stride 9 or more, or a smaller model')
    line = live.keep_up_line(0.33, 8, 25.0, one_thread=0.007)
    assert 'the time is lost to threads, not the model (0.007 s per window with one)' in line
    assert line.endswith('use --threads 1')
    line = live.keep_up_line(0.9, 8, 25.0, one_thread=0.5)  # one thread helps, not enough
    assert line.endswith('use --threads 1 and --stride 13 or more, or a smaller model')
    assert live.keep_up_line(0.33, 8, 25.0, one_thread=0.30).endswith('use --stride 9 or more, or a smaller model')


def test_one_thread_time_restores_the_pool(restore_threads):
    class Scorer:
        def time_per_window(self, shape):
            return float(torch.get_num_threads())
    torch.set_num_threads(2)
    assert live.one_thread_time(Scorer(), (48, 64)) == 1.0
    assert torch.get_num_threads() == 2
    torch.set_num_threads(1)
    assert live.one_thread_time(Scorer(), (48, 64)) is None


def test_bench_threads_prints_a_row_a_workload(capsys):
    from bench import threads as bench
    assert bench.main(['--busy', '0', '--threads', '1', '--workloads', 'live window', '--seconds', '0.05']) == 0
    out = capsys.readouterr().out
    assert 'usable CPUs; load average before:' in out
    assert re.search(r'^\| live window \| 0 \| \d+\.\d \(\d+\.\d\) \|$', out, re.M)
