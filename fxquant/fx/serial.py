"""One process-wide lock for what fxquant does to process-wide state.

Some state is process-wide by nature: torch.fx tracing patches ``nn.Module.__call__`` and
``__getattr__`` for the whole process while it runs, anomaly mode is global, and the
linter's anomaly-mode watcher replaces ``torch.set_anomaly_enabled`` while a forward runs.
fxquant's tracing and linting therefore run one at a time behind :data:`PROCESS_LOCK`
(re-entrant, so a lint may trace). Other threads' own forwards must not run while fxquant
traces or lints: they would see torch.fx's patches.

A process forked while another thread holds the lock (a ``DataLoader`` starting its
workers while a thread lints) gets a copy of the lock in the state it had, held by a
thread that does not exist in the child: every lint or trace there would wait forever. The
child therefore gets the lock back free (or still held by the forking thread itself, as
often as it held it, where that thread was the owner): :func:`os.register_at_fork`.
"""

from __future__ import annotations

import os
import threading
from types import TracebackType
from typing import Final

__all__ = ["PROCESS_LOCK", "ProcessLock"]


class ProcessLock:
    """A re-entrant lock that a forked child inherits free of the parent's other threads.

    Example:
        >>> lock = ProcessLock()
        >>> with lock, lock:  # re-entrant
        ...     lock.held_here()
        True
        >>> lock.held_here()
        False
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._owner: int | None = None
        self._count = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Take the lock (again, for its owner); False where it timed out."""
        if not self._lock.acquire(blocking, timeout):
            return False
        self._owner = threading.get_ident()
        self._count += 1
        return True

    def release(self) -> None:
        """Give back one hold of the lock (only its owner may)."""
        self._count -= 1
        if self._count == 0:
            self._owner = None
        self._lock.release()

    def held_here(self) -> bool:
        """Whether the calling thread holds the lock."""
        return self._owner == threading.get_ident()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.release()

    def after_fork_in_child(self) -> None:
        """In a forked child: a fresh lock, held as often as before where the forking
        thread (the child's only thread) held it, else free."""
        count = self._count if self._owner == threading.get_ident() else 0
        self._lock = threading.RLock()
        self._owner, self._count = None, 0
        for _ in range(count):
            self.acquire()


#: Held while fxquant traces a model or runs a forward under its lint modes.
PROCESS_LOCK: Final = ProcessLock()

if hasattr(os, "register_at_fork"):  # (POSIX)
    os.register_at_fork(after_in_child=PROCESS_LOCK.after_fork_in_child)
