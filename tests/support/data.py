"""The shared Planetoid data, and a marker for tests that need it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED = os.environ.get("FXQUANT_DATA", "")
needs_data = pytest.mark.skipif(
    not (Path(SHARED) / "Cora" / "raw" / "ind.cora.x").is_file(),
    reason="FXQUANT_DATA does not hold the Planetoid raw files",
)
