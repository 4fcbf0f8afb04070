"""The clip loaders' cache of open files (hdf5 files, video containers), one per process.

A handle is never shared between processes: a cache is emptied when it is
pickled (DataLoader workers started by spawn) and in a forked child. What a
child inherits is set aside, unused, for the child's lifetime, never closed:
freeing a decoder or scaler whose parent ran it with threads waits for those
threads, which the child does not have (a DataLoader worker hung so when the
main process had decoded before forking it), nor is the garbage it
inherited collected (tests/test_video_workers.py).
"""
from __future__ import annotations

import gc
import os
import weakref
from collections import OrderedDict
from typing import Callable

__all__ = ['OpenFiles']

_CACHES: weakref.WeakSet = weakref.WeakSet()
_INHERITED: list = []  # what forked children keep of their parent's caches


class OpenFiles:
    """At most ``max_open`` open files of this process, by path; the least
    recently used is closed first.  ``local(make)``: one more object per
    process that lives as the files do (the video loader's scaler)."""

    def __init__(self, max_open: int):
        self.max_open = max_open
        self._files: OrderedDict = OrderedDict()
        self._local = None
        self._pid = None
        _CACHES.add(self)

    def __getstate__(self):
        return {'max_open': self.max_open}

    def __setstate__(self, state):
        self.__init__(state['max_open'])

    def __len__(self) -> int:
        return len(self._files)

    def _set_aside(self) -> None:
        if self._files or self._local is not None:
            _INHERITED.append((self._files, self._local))
        self._files, self._local = OrderedDict(), None

    def _own(self) -> None:
        if self._pid != os.getpid():  # fresh process: never use a parent's handles
            self._set_aside()
            self._pid = os.getpid()

    def get(self, path: str, open_file: Callable):
        """The open file of ``path``, opened by ``open_file(path)`` if it is not."""
        self._own()
        handle = self._files.get(path)
        if handle is not None:
            self._files.move_to_end(path)
            return handle
        handle = open_file(path)
        self._files[path] = handle
        if len(self._files) > self.max_open:
            self._files.popitem(last=False)[1].close()
        return handle

    def local(self, make: Callable):
        """This process's object made by ``make()`` (on the first call here)."""
        self._own()
        if self._local is None:
            self._local = make()
        return self._local

    def discard(self, path: str) -> None:
        """Close and forget the file of ``path`` (one whose reading failed)."""
        handle = self._files.pop(path, None)
        if handle is not None:
            handle.close()

    def close(self) -> None:
        for handle in self._files.values():
            try:
                handle.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
        self._files.clear()


def _after_fork_in_child() -> None:
    for cache in list(_CACHES):  # also caches of loaders that are garbage not yet collected
        cache._set_aside()


# Garbage the parent had not collected yet (a container a traceback's frames held
# in a cycle) is inherited too: everything is frozen for the fork, so the child's
# collector, even one that runs inside the fork hooks, leaves what the child
# inherited alone and collects only what it allocates itself; the parent's
# collector takes its objects back at once.
os.register_at_fork(before=gc.freeze, after_in_parent=gc.unfreeze,
                    after_in_child=_after_fork_in_child)
