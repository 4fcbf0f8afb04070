"""Processes found through /proc (Linux), without pgrep or ps: the self-check
and the tests run where those tools may be missing."""
import os
import signal


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
    each worker in a session of its own, out of reach of killpg on the agent."""
    for p in descendants(pid):
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass
