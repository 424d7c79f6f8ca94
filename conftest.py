"""Session-wide settings for tests and docstring examples."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

_SHARED = Path(__file__).resolve().parent.parent / "shared" / "datasets"
if _SHARED.is_dir():
    os.environ.setdefault("FXQUANT_DATA", str(_SHARED))
# Tests never write into the user's cache; the folder goes away with the session.
_CACHE = tempfile.mkdtemp(prefix="fxquant-test-cache-")
os.environ["FXQUANT_CACHE"] = _CACHE


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_CACHE, ignore_errors=True)


@pytest.fixture(autouse=True)
def _doctest_torch(doctest_namespace):
    """Docstring examples use `torch` like the modules they document."""
    doctest_namespace["torch"] = torch
