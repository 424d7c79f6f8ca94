"""One forward that leaves no trace: what :func:`fxquant.summary` and
:func:`fxquant.bit_report` run on example inputs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn

#: a module's own containers: changed in place by hooks and registration, never replaced
#: by a forward; they are left as they are
_CONTAINERS = frozenset({"_parameters", "_buffers", "_modules"})


#: whether a probe's forward runs: what it rounds is counted, not used (a learned step
#: not fitted yet does not warn)
PROBING: ContextVar[bool] = ContextVar("fxquant_probing", default=False)


@contextmanager
def probe(model: nn.Module) -> Iterator[None]:
    """Run the body (a forward on other inputs) in evaluation mode without gradients, and
    put back what it changed: every module's mode and plain attributes (what the last
    forward recorded for :func:`fxquant.bit_penalty`, a ``GCNConv(cached=True)`` layer's
    normalised graph) and the random number generators (stochastic rounding draws from
    them). Parameters and buffers are not written in evaluation."""
    saved = [(m, {k: v for k, v in vars(m).items() if k not in _CONTAINERS})
             for m in model.modules()]
    devices = sorted({t.device.index or 0 for t in (*model.parameters(), *model.buffers())
                      if t.device.type == "cuda"})
    token = PROBING.set(True)
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            model.eval()
            yield
    finally:
        PROBING.reset(token)
        for module, attributes in saved:
            state = vars(module)
            for key in [k for k in state if k not in attributes and k not in _CONTAINERS]:
                del state[key]
            state.update(attributes)
