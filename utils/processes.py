"""Processes found through /proc (Linux), without pgrep or ps: the self-check
and the tests run where those tools may be missing; ending a process's whole
tree; Python commands run as __main__ in this process or in a fork of it."""
import os
import runpy
import signal
import subprocess
import sys
import time
import traceback


def _stat_fields(pid):
    """/proc/<pid>/stat after the command name (which may hold spaces and ')')."""
    with open(f'/proc/{pid}/stat') as f:
        return f.read().rsplit(')', 1)[1].split()


def child_pids(parent):
    """The pids of parent's living children, in increasing order."""
    children = []
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        try:
            fields = _stat_fields(entry)
        except OSError:  # ended meanwhile
            continue
        if int(fields[1]) == parent and fields[0] != 'Z':
            children.append(int(entry))
    return sorted(children)


def alive(pid):
    """True while pid runs (a zombie has exited). Without /proc (macOS), while
    kill(pid, 0) finds it, zombie or not."""
    if not os.path.isdir('/proc/self'):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    try:
        return _stat_fields(pid)[0] != 'Z'
    except OSError:
        return False


def descendants(pid):
    """pid and every process below it (children of children), parents first."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        found.append(p)
        todo += child_pids(p)
    return found


def kill_tree(pid, sig=signal.SIGKILL):
    """Sends sig to pid and every process below it, found first (a killed
    parent's children are handed to init and no longer found). torchrun starts
    each worker in a session of its own, out of reach of killpg on the agent.
    pid must be running or an unreaped child: once a child is reaped, its pid
    may be any new process's (end_tree kills a child's tree before reaping it)."""
    for p in descendants(pid):
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


def exited(proc):
    """True once proc (a subprocess.Popen) has exited, without reaping it: until
    proc.wait() reaps it, its pid, and the process group id it leads, are its own."""
    if proc.returncode is not None:
        return True
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped meanwhile (by another thread's proc.wait())
        return True


def end_tree(proc, timeout=None):
    """Waits up to `timeout` seconds (None: no limit) for proc to exit, then
    SIGKILLs it, every process below it and its process group (where it leads
    one: start_new_session), and only then reaps it, so that no pid signalled
    can belong to another process yet. Also on an exception meanwhile (Ctrl-C).
    True when proc exited by itself in time; a proc already reaped is left alone."""
    deadline = None if timeout is None else time.monotonic() + timeout
    in_time = True
    try:
        while not exited(proc):
            if deadline is not None and time.monotonic() >= deadline:
                in_time = False
                break
            time.sleep(0.02)
    finally:
        if proc.returncode is None:  # unreaped: pid and group id still proc's
            kill_tree(proc.pid)
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # what it left in its group
            except ProcessLookupError:  # it leads no group
                pass
            proc.wait()
    return in_time


def run_as_main(argv):
    """`python ARGV...` run as python runs it, in this process: `SCRIPT ARGS` or
    `-m MODULE ARGS`, sys.argv set and the script's folder first on sys.path
    (callers restore both), the code as __main__."""
    if argv[0] == '-m':
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name='__main__', alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name='__main__')


class ForkedPython:
    """`python SCRIPT ARGS...` or `python -m MODULE ARGS...` run in a fork of this
    process instead of a new interpreter: the 3-5 s a fresh one spends importing
    torch, torchvision and the project are skipped. Like subprocess.Popen with
    start_new_session=True, stdout and stderr to files: pid, returncode, poll(),
    wait(), send_signal(). For CPU runs of a process that has started no CUDA
    context; the fork runs torch on one intra-op thread (OpenMP's threads of this
    process do not exist in a fork), the way loader workers do."""

    def __init__(self, cmd, stdout, stderr, env=None):
        self.args, self.returncode = cmd, None
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # else the fork would write this process's pending output again
        self.pid = os.fork()
        if self.pid == 0:
            self._child(cmd[1:], stdout.fileno(), stderr.fileno(), env)

    @staticmethod
    def _child(argv, out_fd, err_fd, env):
        code = 1
        try:
            os.setsid()
            os.dup2(out_fd, 1)
            os.dup2(err_fd, 2)
            # sys.stdout may not write to fd 1 here (pytest's capture, for one)
            sys.stdout = open(1, 'w', buffering=1, closefd=False)
            sys.stderr = open(2, 'w', buffering=1, closefd=False)
            if env is not None:
                os.environ.clear()
                os.environ.update(env)
            import torch
            torch.set_num_threads(1)
            run_as_main(argv)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - the traceback, as a new interpreter prints it
            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)

    def poll(self):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.01)
        return self.returncode

    def send_signal(self, sig):
        if self.poll() is None:
            os.kill(self.pid, sig)
