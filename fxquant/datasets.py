"""Planetoid datasets (Cora, CiteSeer, PubMed) that load offline from read-only folders.

PyG's :class:`~torch_geometric.datasets.Planetoid` writes ``processed/`` next to ``raw/``
under its root. Shared data folders are read-only by intent, and a process running as root
would succeed in writing there anyway, so the raw files are copied into a cache folder and
everything PyG writes goes there. The data root is never written to.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch_geometric.datasets import Planetoid

__all__ = ["PLANETOID_NAMES", "cache_dir", "load_planetoid"]

#: Dataset names as PyG spells them.
PLANETOID_NAMES = ("Cora", "CiteSeer", "PubMed")
_RAW = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")


def cache_dir() -> Path:
    """Where fxquant writes: ``$FXQUANT_CACHE``, else ``$XDG_CACHE_HOME/fxquant``, else
    ``~/.cache/fxquant``."""
    if os.environ.get("FXQUANT_CACHE"):
        return Path(os.environ["FXQUANT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fxquant"


def _raw_names(name: str) -> list[str]:
    return [f"ind.{name.lower()}.{suffix}" for suffix in _RAW]


def _find_raw(root: Path, name: str) -> Path | None:
    """The folder under ``root`` that holds all raw files (``root/Cora/raw``, ``root/raw``, ...)."""
    for folder in (root / name / "raw", root / name.lower() / "raw", root / "raw", root):
        if all((folder / f).is_file() for f in _raw_names(name)):
            return folder
    return None


def load_planetoid(
    name: str = "Cora",
    root: str | os.PathLike[str] | None = None,
    transform: Callable[[Any], Any] | None = None,
) -> Planetoid:
    """Load a Planetoid citation graph with its public split, without writing to ``root``.

    Args:
        name (str, optional): ``"Cora"``, ``"CiteSeer"`` or ``"PubMed"`` (any case).
            (default: ``"Cora"``)
        root (str or Path, optional): folder holding ``<name>/raw/ind.<name>.*`` (PyG's
            layout; ``raw/`` or the files themselves also work). Defaults to
            ``$FXQUANT_DATA``; when neither is set, or the files are not there, PyG
            downloads them into the cache (:func:`cache_dir`).
        transform (callable, optional): applied on access, e.g.
            ``torch_geometric.transforms.NormalizeFeatures()``.

    Raises:
        FileNotFoundError: the raw files are in none of the places looked at and the
            download failed; the message lists the places and how to point elsewhere.

    Example:
        >>> dataset = load_planetoid("Cora")  # with FXQUANT_DATA=../shared/datasets
        >>> data = dataset[0]
        >>> data.num_nodes, int(data.train_mask.sum()), int(data.test_mask.sum())
        (2708, 140, 1000)
    """
    canonical = {n.lower(): n for n in PLANETOID_NAMES}.get(str(name).lower())
    if canonical is None:
        raise ValueError(f"unknown Planetoid dataset {name!r}; choose one of {list(PLANETOID_NAMES)}")
    source = root if root is not None else os.environ.get("FXQUANT_DATA") or None
    looked: list[str] = []
    raw = None
    if source is not None:
        folder = Path(source).expanduser().resolve()
        raw = _find_raw(folder, canonical)
        looked.append(f"{folder / canonical / 'raw'} (from {'root=' if root else 'FXQUANT_DATA'})")

    key = hashlib.sha1(str(raw).encode()).hexdigest()[:10] if raw else "download"
    work = cache_dir() / "planetoid" / key
    if raw is not None:
        dest = work / canonical / "raw"
        dest.mkdir(parents=True, exist_ok=True)
        for f in _raw_names(canonical):
            src, dst = raw / f, dest / f
            if not dst.is_file() or dst.stat().st_size != src.stat().st_size:
                shutil.copyfile(src, dst)
    else:
        looked.append(str(work / canonical / "raw"))
    if importlib.util.find_spec("scipy") is None:
        raise ImportError(
            "reading Planetoid's raw files needs scipy (they are pickled scipy.sparse "
            "matrices); please `pip install scipy` or `pip install fxquant[examples]`."
        )
    if raw is not None:
        return Planetoid(str(work), canonical, split="public", transform=transform)
    try:
        return Planetoid(str(work), canonical, split="public", transform=transform)
    except Exception as e:  # network errors come in many types (URLError, OSError, aiohttp)
        raise FileNotFoundError(
            f"could not load Planetoid {canonical}: its raw files (ind.{canonical.lower()}.x, "
            f"...) are not in {' or '.join(looked)}, and downloading them failed "
            f"({type(e).__name__}: {e}). Please set FXQUANT_DATA or pass root= to a folder "
            f"holding {canonical}/raw/ind.{canonical.lower()}.*."
        ) from e
