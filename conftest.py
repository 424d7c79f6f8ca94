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


def pytest_collection_modifyitems(config, items):
    """Docstring examples that load a Planetoid dataset skip without the files."""
    if _HAS_DATA:
        return
    skip = pytest.mark.skip(reason="FXQUANT_DATA does not hold the Planetoid raw files")
    for item in items:
        test = getattr(item, "dtest", None)
        if test is not None and any("load_planetoid(" in ex.source for ex in test.examples):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _doctest_torch(doctest_namespace):
    """Docstring examples use `torch` like the modules they document."""
    doctest_namespace["torch"] = torch
