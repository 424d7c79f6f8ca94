"""Planetoid datasets (Cora, CiteSeer, PubMed) that load offline from read-only folders.

PyG's :class:`~torch_geometric.datasets.Planetoid` writes ``processed/`` next to ``raw/``
under its root. Shared data folders are read-only by intent, and a process running as root
would succeed in writing there anyway, so the raw files are copied into a cache folder and
everything PyG writes goes there. The data root is never written to.

The cache is keyed by a hash of the raw files' contents: edit a raw file in place and the
next load processes it again, never returning data from before the edit.

Security: Planetoid's raw files are Python pickles (``pickle.load`` in PyG's reader), so
a crafted raw file runs code when it is read. Only load data you trust.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import pickle
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch_geometric.datasets import Planetoid
from torch_geometric.io.planetoid import read_file

from fxquant.errors import FxquantFileNotFoundError, FxquantImportError, FxquantValueError

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


def _candidates(root: Path, name: str) -> list[Path]:
    return [root / name / "raw", root / name.lower() / "raw", root / "raw", root]


def _find_raw(root: Path, name: str) -> tuple[Path | None, Path | None, list[str]]:
    """(folder with every raw file, folder with only some of them, those it lacks)."""
    partial: tuple[Path | None, list[str]] = (None, [])
    for folder in _candidates(root, name):
        present = [f for f in _raw_names(name) if (folder / f).is_file()]
        if len(present) == len(_RAW):
            return folder, None, []
        if present and partial[0] is None:
            partial = (folder, [f for f in _raw_names(name) if f not in present])
    return None, partial[0], partial[1]


def _content_key(folder: Path, name: str) -> str:
    digest = hashlib.sha256()
    for f in _raw_names(name):
        digest.update(f.encode())
        digest.update((folder / f).read_bytes())
    return digest.hexdigest()[:16]


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
    except ValueError:
        return False
    return True


def _broken_file(folder: Path, name: str) -> tuple[str, BaseException] | None:
    """The first raw file PyG's reader cannot read, with what it raised."""
    for suffix in _RAW:
        try:
            read_file(str(folder), name, suffix)
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError,
                IndexError, OSError, ImportError, UnicodeDecodeError) as e:
            return f"ind.{name.lower()}.{suffix}", e
    return None


def _ready(work: Path, name: str) -> bool:
    """Whether a cache entry holds the raw files and PyG's processed data."""
    return (work / name / "processed" / "data.pt").is_file() and \
        all((work / name / "raw" / f).is_file() for f in _raw_names(name))


def _unique_beside(work: Path) -> Path:
    """A fresh hidden name in ``work``'s folder (for one process's private copy)."""
    return work.parent / f".{work.name}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


def _build_entry(raw: Path, work: Path, name: str) -> None:
    """Copy the raw files and let PyG process them in a private folder beside ``work``,
    then move it into place in one rename: processes loading the same data at once (a
    pool of workers) never read a half-written file; the first rename wins."""
    work.parent.mkdir(parents=True, exist_ok=True)
    private = _unique_beside(work)
    private.mkdir()  # (the umask's permissions, as a folder PyG makes would have)
    try:
        dest = private / name / "raw"
        dest.mkdir(parents=True)
        for f in _raw_names(name):
            shutil.copyfile(raw / f, dest / f)
        try:
            Planetoid(str(private), name, split="public")
        except Exception as e:
            broken = _broken_file(dest, name)
            if broken is None:
                raise
            file, cause = broken
            raise FxquantValueError(
                f"Planetoid {name}: the raw file {raw / file} cannot be read "
                f"({type(cause).__name__}: {cause}); it is corrupt or truncated. Please "
                "replace it with the original."
            ) from e
        if work.exists() and not _ready(work, name):  # left half-built by an interrupted load
            aside = _unique_beside(work)
            # renamed aside first: of several processes one moves it, and none deletes an
            # entry another one has just moved into place
            with contextlib.suppress(OSError):
                os.rename(work, aside)
            shutil.rmtree(aside, ignore_errors=True)
        try:
            os.rename(private, work)
        except OSError:  # another process moved its entry into place first
            if not _ready(work, name):
                raise
    finally:
        shutil.rmtree(private, ignore_errors=True)


def load_planetoid(
    name: str = "Cora",
    root: str | os.PathLike[str] | None = None,
    transform: Callable[[Any], Any] | None = None,
    download: bool = True,
) -> Planetoid:
    """Load a Planetoid citation graph with its public split, without writing to ``root``.

    Args:
        name (str, optional): ``"Cora"``, ``"CiteSeer"`` or ``"PubMed"`` (any case).
            (default: ``"Cora"``)
        root (str or Path, optional): folder holding ``<name>/raw/ind.<name>.*`` (PyG's
            layout; ``raw/`` or the files themselves also work). Defaults to
            ``$FXQUANT_DATA``; when neither is set, or no raw file is there, PyG
            downloads them into the cache (:func:`cache_dir`).
        transform (callable, optional): applied on access, e.g.
            ``torch_geometric.transforms.NormalizeFeatures()``.
        download (bool, optional): when no raw file is found, try PyG's download into the
            cache. (default: :obj:`True`)

    Raises:
        FileNotFoundError: some raw files are missing (the message lists them), or none is
            where it looked and the download failed (the message lists the places).
        fxquant.FxquantError (a ValueError): a raw file cannot be read (the message names
            it), or the cache folder lies inside the data root.

    Example:
        >>> dataset = load_planetoid("Cora")  # FXQUANT_DATA holds the raw files, or a network
        >>> data = dataset[0]
        >>> data.num_nodes, int(data.train_mask.sum()), int(data.test_mask.sum())
        (2708, 140, 1000)
    """
    canonical = {n.lower(): n for n in PLANETOID_NAMES}.get(str(name).lower())
    if canonical is None:
        raise FxquantValueError(f"unknown Planetoid dataset {name!r}; choose one of {list(PLANETOID_NAMES)}")
    if importlib.util.find_spec("scipy") is None:
        raise FxquantImportError(
            "reading Planetoid's raw files needs scipy (they are pickled scipy.sparse "
            "matrices); please `pip install scipy` or `pip install fxquant[examples]`."
        )
    given = root if root is not None else os.environ.get("FXQUANT_DATA") or None
    what = "root=" if root is not None else "FXQUANT_DATA"
    cache = cache_dir()
    raw = None
    looked: list[str] = []
    if given is not None:
        source = Path(given).expanduser().resolve()
        if _inside(cache, source):
            raise FxquantValueError(
                f"the cache folder {cache} (FXQUANT_CACHE) lies inside the data root {source} "
                f"({what}); fxquant never writes into the data root. Please point FXQUANT_CACHE "
                "elsewhere."
            )
        raw, partial, missing = _find_raw(source, canonical)
        if partial is not None and raw is None:
            raise FxquantFileNotFoundError(
                f"Planetoid {canonical}: {partial} holds some raw files but lacks {missing}; "
                f"please copy the complete set (ind.{canonical.lower()}.x, .tx, .allx, .y, .ty, "
                ".ally, .graph, .test.index) there."
            )
        looked.append(f"{source / canonical / 'raw'} (from {what})")

    if raw is not None:
        work = cache / "planetoid" / f"{canonical}-{_content_key(raw, canonical)}"
        if not _ready(work, canonical):
            _build_entry(raw, work, canonical)
        return Planetoid(str(work), canonical, split="public", transform=transform)
    work = cache / "planetoid" / f"{canonical}-download"
    looked.append(str(work / canonical / "raw"))
    if not download and not all((work / canonical / "raw" / f).is_file()
                                for f in _raw_names(canonical)):
        raise FxquantFileNotFoundError(
            f"Planetoid {canonical}: its raw files (ind.{canonical.lower()}.x, ...) are not in "
            f"{' or '.join(looked)}, and download=False."
        )
    try:
        return Planetoid(str(work), canonical, split="public", transform=transform)
    except Exception as e:  # network errors come in many types (URLError, OSError, aiohttp)
        raise FxquantFileNotFoundError(
            f"could not load Planetoid {canonical}: its raw files (ind.{canonical.lower()}.x, "
            f"...) are not in {' or '.join(looked)}, and downloading them failed "
            f"({type(e).__name__}: {e}). Please set FXQUANT_DATA or pass root= to a folder "
            f"holding {canonical}/raw/ind.{canonical.lower()}.*."
        ) from e
