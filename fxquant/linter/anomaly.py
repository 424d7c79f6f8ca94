"""The one anomaly-mode watcher both lints use.

``torch.autograd.set_detect_anomaly(True)`` inside a forward switches anomaly detection on
for the whole process. A TorchFunctionMode does not see the call, so to name its line
:func:`watching_anomaly` watches ``torch.set_anomaly_enabled`` while the block runs
(:func:`~fxquant.linter.torch_internals.anomaly_switches_watched`), holding
:data:`fxquant.fx.serial.PROCESS_LOCK`. Whatever the forward did, the anomaly state is
restored from what it was before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from fxquant.fx.locations import Location, caller_location
from fxquant.fx.serial import PROCESS_LOCK
from fxquant.linter.torch_internals import anomaly_switches_watched

__all__ = ["watching_anomaly"]


@contextlib.contextmanager
def watching_anomaly(on_enable: Callable[[Location | None], None]) -> Iterator[None]:
    """Call ``on_enable(location)`` whenever code in the block switches anomaly mode on."""
    with PROCESS_LOCK:
        state = (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled())
        try:
            with anomaly_switches_watched(lambda: on_enable(caller_location())):
                yield
        finally:
            if torch.is_anomaly_enabled() != state[0] or \
                    torch.is_anomaly_check_nan_enabled() != state[1]:
                torch.set_anomaly_enabled(*state)


