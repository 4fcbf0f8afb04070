"""Cleaning up after a child process (utils/processes.py and its callers in
bench/): once a child is reaped (Popen.wait / communicate returned), the
kernel may give its pid to any new process, so nothing may be signalled by
that pid any more. These tests make the kernel do so at once: the pid of a
reaped child goes to a bystander process (through
/proc/sys/kernel/ns_last_pid, which needs root), which must survive the
clean-up."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from utils import processes

ROOT = Path(__file__).resolve().parents[1]
NS_LAST_PID = Path('/proc/sys/kernel/ns_last_pid')
REAL_POPEN = subprocess.Popen


def start_at_pid(pid):
    """A `sleep` process with this pid, or None when another process took it first."""
    NS_LAST_PID.write_text(str(pid - 1))
    bystander = REAL_POPEN(['sleep', '60'])
    if bystander.pid == pid:
        return bystander
    bystander.kill()
    bystander.wait()
    return None


class PidReuse:
    """A child whose pid goes to a bystander process the moment it is reaped."""
    bystanders = []

    def wait(self, timeout=None):
        return self._reused_once_reaped(super().wait, timeout)

    def poll(self):
        return self._reused_once_reaped(super().poll)

    def _reused_once_reaped(self, reap, *args):
        reaped_before = self.returncode is not None
        code = reap(*args)
        if not reaped_before and code is not None:
            PidReuse.bystanders.append(start_at_pid(self.pid))
        return code


class PidReusedOnReaping(PidReuse, subprocess.Popen):
    pass


class ForkReusedOnReaping(PidReuse, processes.ForkedPython):
    """The CPU dry run's children and commands are forks (ForkedPython)."""


@pytest.fixture
def reused_pids(monkeypatch):
    """subprocess.Popen and the self-check's ForkedPython replaced by children
    whose pids are reused on reaping; yields the bystanders' list (each must
    still run after the code under test returned)."""
    from util_scripts import gpu_check
    from util_scripts.gpu_checks import common as gpu_checks_common
    try:
        NS_LAST_PID.write_text(NS_LAST_PID.read_text())
    except OSError:
        pytest.skip('/proc/sys/kernel/ns_last_pid is not writable (not root): pids cannot be steered')
    PidReuse.bystanders = []
    monkeypatch.setattr(subprocess, 'Popen', PidReusedOnReaping)
    for module in (gpu_check, gpu_checks_common):
        monkeypatch.setattr(module, 'ForkedPython', ForkReusedOnReaping)
    yield PidReuse.bystanders
    for bystander in PidReuse.bystanders:
        if bystander is not None:
            bystander.kill()
            bystander.wait()


def assert_bystanders_alive(bystanders):
    if not bystanders or None in bystanders:
        pytest.skip('another process took the freed pid first (a busy machine): nothing to check')
    time.sleep(0.2)  # a SIGKILL sent is delivered by now
    assert [b.poll() for b in bystanders] == [None] * len(bystanders), \
        'a process that took the pid of a reaped child was killed'


@pytest.mark.slow  # a child process that imports torch
def test_gpu_check_run_in_child_signals_no_reused_pid(reused_pids, tmp_path):
    from util_scripts import gpu_check
    result, _, timed_out = gpu_check.run_in_child(['--list'], tmp_path / 'list.log', 120, cpu=True)
    assert result is None and not timed_out  # --list prints no result line
    assert 'gpu_utilisation' in (tmp_path / 'list.log').read_text()
    assert_bystanders_alive(reused_pids)


def test_fault_injection_finish_signals_no_reused_pid(reused_pids, tmp_path):
    from bench import fault_injection
    proc = subprocess.Popen(['true'], start_new_session=True)
    assert fault_injection.finish(proc, tmp_path / 'log')
    assert_bystanders_alive(reused_pids)


def quick_exit_checker(work):
    """A Checker (util_scripts/gpu_checks/common.py) whose main.py exits at once on a
    bad option: the check's clean-up runs after a child that ended early."""
    from util_scripts.gpu_checks.common import Checker

    class QuickExit(Checker):
        def args(self, result, *extra):
            return ['--no_such_option']
    return QuickExit(work, cpu=True, check_name='quick')


def test_a_checks_clean_up_signals_no_reused_pid(reused_pids, tmp_path):
    from util_scripts.gpu_checks.common import Failed
    from util_scripts.gpu_checks.single import check_stop_signal
    with pytest.raises(Failed, match='did not happen'):
        check_stop_signal(quick_exit_checker(tmp_path))
    assert_bystanders_alive(reused_pids)


def session_with_grandchild(tmp_path):
    """A shell in a session of its own that starts a `sleep` in another session
    (as torchrun starts its workers) and writes its pid."""
    pid_file = tmp_path / 'grandchild'
    script = (f'{sys.executable} -c "import os, time; os.setsid(); '
              f"open('{pid_file}', 'w').write(str(os.getpid())); time.sleep(60)\" & wait")
    proc = REAL_POPEN(['sh', '-c', script], start_new_session=True)
    deadline = time.time() + 30
    while not (pid_file.exists() and pid_file.read_text()):
        assert time.time() < deadline, 'the grandchild did not start'
        time.sleep(0.05)
    return proc, int(pid_file.read_text())


def test_end_tree_kills_a_running_tree_across_sessions_after_the_timeout(tmp_path):
    proc, grandchild = session_with_grandchild(tmp_path)
    t0 = time.time()
    assert processes.end_tree(proc, timeout=0.5) is False  # still running: killed
    assert 0.5 <= time.time() - t0 < 10
    assert proc.returncode == -signal.SIGKILL
    deadline = time.time() + 10
    while processes.alive(grandchild) and time.time() < deadline:
        time.sleep(0.05)
    assert not processes.alive(grandchild)


def test_end_tree_returns_the_exit_of_a_child_that_ended(tmp_path):
    proc = REAL_POPEN([sys.executable, '-c', 'import sys; sys.exit(3)'], start_new_session=True)
    assert processes.end_tree(proc, timeout=60) is True
    assert proc.returncode == 3
    assert processes.end_tree(proc, timeout=0) is True  # reaped already: nothing is signalled


def test_end_tree_kills_what_stays_in_the_childs_process_group(tmp_path):
    """The child ends but leaves a process of its group (a loader worker, say):
    the group is killed before the child is reaped."""
    pid_file = tmp_path / 'left'
    proc = REAL_POPEN(['sh', '-c', f'sleep 60 & echo $! > {pid_file}'], start_new_session=True)
    deadline = time.time() + 30
    while not (pid_file.exists() and pid_file.read_text().strip()):
        assert time.time() < deadline
        time.sleep(0.05)
    left = int(pid_file.read_text())
    assert processes.end_tree(proc, timeout=60) is True and proc.returncode == 0
    deadline = time.time() + 10
    while processes.alive(left) and time.time() < deadline:
        time.sleep(0.05)
    assert not processes.alive(left)


def test_a_forked_python_command_runs_like_a_new_interpreter(tmp_path):
    """ForkedPython: a script's argv, its output to the files, its exit status
    (SystemExit's text to stderr, as python prints it), in a session of its own;
    `-m module` the same; an exception is a traceback and status 1."""
    script = tmp_path / 'script.py'
    script.write_text('import os, sys\nprint(sys.argv[1:], os.getsid(0) == os.getpid())\n'
                      'print("to stderr", file=sys.stderr)\n'
                      'sys.exit(int(sys.argv[1]) if sys.argv[1].isdigit() else sys.argv[1])\n')
    (tmp_path / 'failing.py').write_text('raise ValueError("bad input")\n')
    (tmp_path / 'sleeper.py').write_text('import time\ntime.sleep(60)\n')
    runs = {}
    for name, cmd in {'status': [sys.executable, str(script), '3'],
                      'text': [sys.executable, str(script), 'a message'],
                      'module': [sys.executable, '-m', 'failing'],
                      'killed': [sys.executable, str(tmp_path / 'sleeper.py')]}.items():
        out, err = (tmp_path / f'{name}.out').open('w+'), (tmp_path / f'{name}.err').open('w+')
        sys.path.insert(0, str(tmp_path))
        try:
            proc = processes.ForkedPython(cmd, out, err, env={'PATH': '/bin'})
        finally:
            sys.path.remove(str(tmp_path))
        if name == 'killed':
            time.sleep(0.3)
            proc.send_signal(signal.SIGKILL)
        runs[name] = (proc.wait(timeout=30), (tmp_path / f'{name}.out').read_text(),
                      (tmp_path / f'{name}.err').read_text())
    assert runs['status'] == (3, "['3'] True\n", 'to stderr\n')
    assert runs['text'] == (1, "['a message'] True\n", 'to stderr\na message\n')
    assert runs['module'][0] == 1 and 'ValueError: bad input' in runs['module'][2]
    assert runs['killed'][0] == -signal.SIGKILL
    assert os.environ.get('PATH') != '/bin'  # the env given is the fork's, not this process's
