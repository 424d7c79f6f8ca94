"""Forking while another thread lints: the child's lints and traces do not wait on the lock
the parent's thread holds (a DataLoader starting its workers during a lint)."""

from __future__ import annotations

import multiprocessing
import os
import threading

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import fxquant
from fxquant.fx.serial import PROCESS_LOCK, ProcessLock

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")


class _Blocking(nn.Module):
    """A forward that waits (inside fxquant.lint) until it is let go."""

    def __init__(self, entered: threading.Event, leave: threading.Event) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.entered, self.leave = entered, leave

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.entered.set()
        self.leave.wait(120)
        return self.lin(x)


class _Lints(Dataset):
    """Each item lints a small model with an error in it: the rules found."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> str:
        class Model(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.lin = nn.Linear(3, 3)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                y = self.lin(x).sigmoid()
                y *= 2  # sigmoid saved y
                return y

        report = fxquant.lint(Model(), torch.randn(2, 3))
        return ",".join(f.rule for f in report.errors) + f";{int(PROCESS_LOCK.held_here())}"


@pytest.fixture
def linting_thread():
    """Another thread, inside fxquant.lint, holding the process-wide lock."""
    entered, leave = threading.Event(), threading.Event()
    thread = threading.Thread(
        target=fxquant.lint, args=(_Blocking(entered, leave), torch.randn(2, 3)), daemon=True)
    thread.start()
    assert entered.wait(60)
    yield
    leave.set()
    thread.join(60)
    assert not thread.is_alive()


def test_dataloader_workers_forked_during_a_lint_can_lint(linting_thread):
    """The workers lint (and find the error) although a thread of the parent holds the lock."""
    loader = DataLoader(_Lints(), batch_size=None, num_workers=1, timeout=60,
                        multiprocessing_context=multiprocessing.get_context("fork"))
    assert list(loader) == ["FXQ001;0", "FXQ001;0"]


def test_a_child_forked_by_the_lock_holder_still_holds_it():
    """The thread that forked while holding the lock holds it in the child as often as
    before (its `with` blocks release it there)."""
    read, write = os.pipe()
    with PROCESS_LOCK, PROCESS_LOCK:
        pid = os.fork()
        if pid == 0:  # the child: report, then leave without running the test's code
            ok = PROCESS_LOCK.held_here() and PROCESS_LOCK._count == 2
            PROCESS_LOCK.release()
            PROCESS_LOCK.release()
            ok = ok and not PROCESS_LOCK.held_here() and PROCESS_LOCK.acquire(timeout=5)
            os.write(write, b"1" if ok else b"0")
            os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1" and status == 0
    os.close(read)


@pytest.mark.parametrize("holds", [1, 3])
def test_a_child_gets_free_a_lock_another_thread_held(holds):
    """A lock another thread of the parent held (re-entered ``holds`` times) is free in the
    child."""
    lock, taken, done = ProcessLock(), threading.Event(), threading.Event()
    os.register_at_fork(after_in_child=lock.after_fork_in_child)

    def hold() -> None:
        for _ in range(holds):
            lock.acquire()
        taken.set()
        done.wait(60)
        for _ in range(holds):
            lock.release()

    thread = threading.Thread(target=hold)
    thread.start()
    assert taken.wait(60)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        ok = lock.acquire(timeout=5) and lock.held_here()
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    done.set()
    thread.join(60)
    assert os.read(read, 1) == b"1"
    os.close(read)
