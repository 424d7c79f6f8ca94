"""Session-wide settings for tests and docstring examples."""

import os
import tempfile
from pathlib import Path

_SHARED = Path(__file__).resolve().parent.parent / "shared" / "datasets"
if _SHARED.is_dir():
    os.environ.setdefault("FXQUANT_DATA", str(_SHARED))
# Tests never write into the user's cache.
os.environ["FXQUANT_CACHE"] = tempfile.mkdtemp(prefix="fxquant-test-cache-")
