"""Processes found through /proc (Linux), without pgrep or ps: the self-check
and the tests run where those tools may be missing."""
import os
import signal
import time


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
    """True while pid runs (a zombie has exited)."""
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
