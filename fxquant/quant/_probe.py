"""One forward that leaves no trace: what :func:`fxquant.summary` and
:func:`fxquant.bit_report` run on example inputs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn

from fxquant.fx.module_state import ModuleState

#: whether a probe's forward runs: what it rounds is counted, not used (a learned step
#: not fitted yet does not warn)
PROBING: ContextVar[bool] = ContextVar("fxquant_probing", default=False)


@contextmanager
def probe(model: nn.Module) -> Iterator[None]:
    """Run the body (a forward on other inputs) in evaluation mode without gradients, and
    put the model back exactly as it was, also when the body raises: every parameter's
    and buffer's values (a forward that counts its calls in a buffer, keeps an EMA of its
    inputs, or writes any state, fxquant's running ranges and learned state included),
    every module's tables, mode and plain attributes, by identity (what the last forward
    recorded for :func:`fxquant.bit_penalty`, a ``GCNConv(cached=True)`` layer's
    normalised graph), and the random number generators (stochastic rounding draws from
    them) (:class:`~fxquant.fx.module_state.ModuleState`)."""
    state = ModuleState(model)
    devices = sorted({t.device.index or 0 for t in (*model.parameters(), *model.buffers())
                      if t.device.type == "cuda"})
    token = PROBING.set(True)
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            model.eval()
            yield
    finally:
        PROBING.reset(token)
        state.restore()
