"""One process-wide lock for what fxquant does to process-wide state.

Some state is process-wide by nature: torch.fx tracing patches ``nn.Module.__call__`` and
``__getattr__`` for the whole process while it runs, anomaly mode is global, and the
linter's anomaly-mode watcher replaces ``torch.set_anomaly_enabled`` while a forward runs.
fxquant's tracing and linting therefore run one at a time behind :data:`PROCESS_LOCK`
(re-entrant, so a lint may trace). Other threads' own forwards must not run while fxquant
traces or lints: they would see torch.fx's patches.
"""

from __future__ import annotations

import threading
from typing import Final

__all__ = ["PROCESS_LOCK"]

#: Held while fxquant traces a model or runs a forward under its lint modes.
PROCESS_LOCK: Final = threading.RLock()
