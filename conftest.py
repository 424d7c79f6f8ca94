"""Session-wide settings for tests and docstring examples.

Tests that need the Planetoid files read them from ``FXQUANT_DATA`` and skip without them
(``tests/support/data.py``); so do docstring examples that load a dataset.
"""

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

# Tests never write into the user's cache; the folder goes away with the session.
_CACHE = tempfile.mkdtemp(prefix="fxquant-test-cache-")
os.environ["FXQUANT_CACHE"] = _CACHE
_HAS_DATA = (Path(os.environ.get("FXQUANT_DATA", "")) / "Cora" / "raw" / "ind.cora.x").is_file()


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_CACHE, ignore_errors=True)


def _has_onnx() -> bool:
    """Whether the ``export`` extra is importable; a CI cell that installed it must have
    it (the examples then fail rather than skip)."""
    from tests.support.extras import ci_extras

    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        return "export" in ci_extras()
    return True


def pytest_collection_modifyitems(config, items):
    """Docstring examples that load a Planetoid dataset skip without the files; those
    that export to ONNX skip without the ``export`` extra."""
    no_data = pytest.mark.skip(reason="FXQUANT_DATA does not hold the Planetoid raw files")
    no_onnx = pytest.mark.skip(reason="pip install 'fxquant[export]'")
    has_onnx = None
    for item in items:
        test = getattr(item, "dtest", None)
        if test is None:
            continue
        sources = [ex.source for ex in test.examples]
        if not _HAS_DATA and any("load_planetoid(" in s for s in sources):
            item.add_marker(no_data)
        if any("export_onnx(" in s for s in sources):
            has_onnx = _has_onnx() if has_onnx is None else has_onnx
            if not has_onnx:
                item.add_marker(no_onnx)


@pytest.fixture(autouse=True)
def _doctest_torch(doctest_namespace):
    """Docstring examples use `torch` like the modules they document."""
    doctest_namespace["torch"] = torch
