"""Tests that need an optional extra: skipped without it for a user, failing in a CI cell
that installed it.

``CI=true`` marks a CI run; ``FXQUANT_CI_EXTRAS`` (comma-separated, e.g. ``scale,export``)
names the extras that cell installed. A CI run that does not name them has them all (the
main cell's contract before the version cells existed).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

#: what each extra installs, and how a user gets it
EXTRAS = {
    "scale": ("pip install --no-build-isolation torch-scatter torch-sparse",),
    "export": ("pip install 'fxquant[export]'",),
}


def ci_extras() -> set[str]:
    """The extras this CI cell installed (empty outside CI)."""
    if not os.environ.get("CI"):
        return set()
    named = os.environ.get("FXQUANT_CI_EXTRAS")
    if named is None:
        return set(EXTRAS)
    return {e.strip() for e in named.split(",") if e.strip()}


def require(extra: str, *modules: str) -> list[ModuleType]:
    """Import ``modules`` of ``extra``: skip the test without them, unless this CI cell
    installed the extra (then the ImportError fails the test)."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; known: {sorted(EXTRAS)}")
    try:
        return [importlib.import_module(m) for m in modules]
    except ImportError:
        if extra in ci_extras():
            raise
        pytest.skip(EXTRAS[extra][0])
