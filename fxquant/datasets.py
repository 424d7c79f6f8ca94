"""Datasets that load offline from read-only folders: Planetoid (Cora, CiteSeer, PubMed),
TU graph-classification sets, DBLP and OGB-MAG (the last three never download: point them
at the files you have).

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
import csv
import gzip
import hashlib
import importlib.util
import os
import pickle
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch_geometric.data import HeteroData, InMemoryDataset
from torch_geometric.datasets import DBLP, Planetoid, TUDataset
from torch_geometric.io.planetoid import read_file

from fxquant.errors import FxquantFileNotFoundError, FxquantImportError, FxquantValueError

__all__ = ["PLANETOID_NAMES", "cache_dir", "load_dblp", "load_ogb_mag", "load_planetoid",
           "load_tu"]

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
        _move_into_place(private, work, lambda w: _ready(w, name))
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


# -- TU, DBLP, OGB-MAG: the user's own files, never downloaded ------------------------------


def _given_root(root: str | os.PathLike[str] | None, what: str) -> Path:
    """The data root (``root=``, else ``$FXQUANT_DATA``), outside the cache."""
    given = root if root is not None else os.environ.get("FXQUANT_DATA") or None
    if given is None:
        raise FxquantFileNotFoundError(
            f"{what}: please pass root= (or set FXQUANT_DATA) to the folder holding its "
            "files; fxquant does not download it.")
    source = Path(given).expanduser().resolve()
    cache = cache_dir()
    if _inside(cache, source):
        raise FxquantValueError(
            f"the cache folder {cache} (FXQUANT_CACHE) lies inside the data root {source}; "
            "fxquant never writes into the data root. Please point FXQUANT_CACHE elsewhere.")
    return source


def _files_key(files: list[Path]) -> str:
    """A hash of the files' names and contents (an edited file gets a new cache entry)."""
    digest = hashlib.sha256()
    for f in sorted(files):
        digest.update(f.name.encode())
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def _move_into_place(private: Path, work: Path, done: Callable[[Path], bool]) -> None:
    """Rename the finished entry ``private`` to ``work`` in one step: an entry left
    half-built there by an interrupted load is renamed aside first and deleted (of
    several processes one moves it, and none deletes an entry another one has just moved
    into place); if another process moved its own finished entry in first, keep it."""
    if work.exists() and not done(work):
        aside = _unique_beside(work)
        with contextlib.suppress(OSError):
            os.rename(work, aside)
        shutil.rmtree(aside, ignore_errors=True)
    try:
        os.rename(private, work)
    except OSError:  # another process moved its entry into place first
        if not done(work):
            raise


def _cached(work: Path, copies: dict[Path, Path], process: Callable[[Path], None],
            done: Callable[[Path], bool]) -> None:
    """Build the cache entry ``work``, unless ``done(work)``: copy each source file to its
    path under the entry, run ``process(entry)``, and move the entry into place in one
    rename (as Planetoid's entries; the first of several processes wins)."""
    if done(work):
        return
    work.parent.mkdir(parents=True, exist_ok=True)
    private = _unique_beside(work)
    private.mkdir()
    try:
        for source, relative in copies.items():
            (private / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, private / relative)
        process(private)
        _move_into_place(private, work, done)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _first_folder(candidates: list[Path], needed: list[str]) -> tuple[Path | None, Path | None]:
    """(the first candidate holding every needed path, the first holding some of them)."""
    partial = None
    for folder in candidates:
        present = [n for n in needed if (folder / n).exists()]
        if len(present) == len(needed):
            return folder, None
        if present and partial is None:
            partial = folder
    return None, partial


def load_tu(
    name: str,
    root: str | os.PathLike[str] | None = None,
    transform: Callable[[Any], Any] | None = None,
    use_node_attr: bool = False,
    use_edge_attr: bool = False,
) -> TUDataset:
    """Load a TU graph-classification dataset (MUTAG, PROTEINS, IMDB-BINARY, ...) from the
    text files you have, without downloading or writing to ``root``.

    Args:
        name (str): the dataset's name, the prefix of its files (``MUTAG_A.txt``, ...).
        root (str or Path, optional): a folder holding ``<name>/raw/<name>_*.txt`` (PyG's
            layout), ``raw/<name>_*.txt``, ``<name>/<name>_*.txt`` (the TU archive unzipped)
            or the files themselves. (default: ``$FXQUANT_DATA``)
        transform (callable, optional): applied on access.
        use_node_attr, use_edge_attr (bool, optional): as in PyG's
            :class:`~torch_geometric.datasets.TUDataset`. (default: :obj:`False`)

    Returns:
        TUDataset: PyG's dataset, processed in the cache (:func:`cache_dir`).

    Raises:
        FileNotFoundError: ``<name>_A.txt`` or ``<name>_graph_indicator.txt`` is missing
            (the message says where it looked).
        fxquant.FxquantError (a ValueError): PyG cannot read the files.

    Example:
        >>> dataset = load_tu("MUTAG", root="/data/TU")  # doctest: +SKIP
        >>> dataset.num_classes  # doctest: +SKIP
        2
    """
    source = _given_root(root, f"TU dataset {name}")
    needed = [f"{name}_A.txt", f"{name}_graph_indicator.txt"]
    candidates = [source / name / "raw", source / "raw", source / name, source]
    folder, partial = _first_folder(candidates, needed)
    if folder is None:
        where = partial or candidates[0]
        raise FxquantFileNotFoundError(
            f"TU dataset {name}: no folder holds {needed}; looked in "
            f"{[str(c) for c in candidates]}" + (f" ({where} holds some of them)"
                                                  if partial else "")
            + f". Please point root= at the folder with the files {name}_*.txt.")
    files = sorted(folder.glob(f"{name}_*.txt"))
    work = cache_dir() / "tu" / f"{name}-{_files_key(files)}"

    def process(entry: Path) -> None:
        try:
            TUDataset(str(entry), name)
        except Exception as e:
            raise FxquantValueError(f"TU dataset {name}: the files in {folder} cannot be read "
                                    f"({type(e).__name__}: {e}); are they complete?") from e

    _cached(work, {f: Path(name) / "raw" / f.name for f in files}, process,
            lambda w: (w / name / "processed" / "data.pt").is_file())
    return TUDataset(str(work), name, transform=transform, use_node_attr=use_node_attr,
                     use_edge_attr=use_edge_attr)


#: DBLP's files as PyG's :class:`~torch_geometric.datasets.DBLP` reads them (MAGNN's
#: preprocessed release).
DBLP_FILES = ("adjM.npz", "features_0.npz", "features_1.npz", "features_2.npy", "labels.npy",
              "node_types.npy", "train_val_test_idx.npz")


def load_dblp(
    root: str | os.PathLike[str] | None = None,
    transform: Callable[[Any], Any] | None = None,
) -> DBLP:
    """Load DBLP (authors, papers, terms, conferences; author areas as labels) from the
    files you have, without downloading or writing to ``root``.

    Args:
        root (str or Path, optional): a folder holding DBLP's files (:data:`DBLP_FILES`)
            itself, in ``raw/`` (PyG's layout) or in ``DBLP/raw/``.
            (default: ``$FXQUANT_DATA``)
        transform (callable, optional): applied on access, e.g.
            ``torch_geometric.transforms.ToUndirected()``.

    Returns:
        DBLP: PyG's dataset, processed in the cache; ``dataset[0]`` is a ``HeteroData``.

    Example:
        >>> data = load_dblp("/data/DBLP")[0]  # doctest: +SKIP
        >>> data["author"].y.unique().tolist()  # doctest: +SKIP
        [0, 1, 2, 3]
    """
    if importlib.util.find_spec("scipy") is None:
        raise FxquantImportError("reading DBLP's files needs scipy; please `pip install scipy`")
    source = _given_root(root, "DBLP")
    candidates = [source / "raw", source / "DBLP" / "raw", source / "dblp" / "raw", source]
    folder, partial = _first_folder(candidates, list(DBLP_FILES))
    if folder is None:
        lacking = [f for f in DBLP_FILES if partial is not None and not (partial / f).exists()]
        raise FxquantFileNotFoundError(
            "DBLP: " + (f"{partial} lacks {lacking}" if partial is not None else
                        f"none of {[str(c) for c in candidates]} holds its files")
            + f"; please point root= at the folder with {list(DBLP_FILES)}.")
    files = [folder / f for f in DBLP_FILES]
    work = cache_dir() / "dblp" / f"DBLP-{_files_key(files)}"

    def process(entry: Path) -> None:
        try:
            DBLP(str(entry))
        except Exception as e:
            raise FxquantValueError(f"DBLP: the files in {folder} cannot be read "
                                    f"({type(e).__name__}: {e}); are they complete?") from e

    _cached(work, {f: Path("raw") / f.name for f in files}, process,
            lambda w: (w / "processed" / "data.pt").is_file())
    return DBLP(str(work), transform=transform)


#: OGB-MAG's relations, as the OGB archive names their folders (``author___writes___paper``).
OGB_MAG_RELATIONS = (("author", "affiliated_with", "institution"), ("author", "writes", "paper"),
                     ("paper", "cites", "paper"), ("paper", "has_topic", "field_of_study"))


class OgbMag(InMemoryDataset):
    """OGB-MAG as one ``HeteroData`` in memory (what :func:`load_ogb_mag` returns); the
    same content as PyG's :class:`~torch_geometric.datasets.OGB_MAG` without embeddings."""

    def __init__(self, data: HeteroData, transform: Callable[[Any], Any] | None = None) -> None:
        super().__init__(None, transform)
        self._data, self.slices = self.collate([data])

    @property
    def num_classes(self) -> int:
        return int(self._data["paper"].y.max()) + 1

    def __repr__(self) -> str:
        return "ogbn-mag()"


def _ogb_mag_files(raw: Path, split: Path) -> dict[str, Path]:
    files = {"paper.x": raw / "node-feat" / "paper" / "node-feat.csv.gz",
             "paper.year": raw / "node-feat" / "paper" / "node_year.csv.gz",
             "paper.y": raw / "node-label" / "paper" / "node-label.csv.gz",
             "num_nodes": raw / "num-node-dict.csv.gz"}
    for relation in OGB_MAG_RELATIONS:
        files["___".join(relation)] = raw / "relations" / "___".join(relation) / "edge.csv.gz"
    for part in ("train", "valid", "test"):
        files[f"split.{part}"] = split / "time" / "paper" / f"{part}.csv.gz"
    return files


def _read_csv_gz(path: Path, dtype: Any) -> Any:
    """A headerless gzipped CSV as a NumPy array (pandas where installed: much faster)."""
    if importlib.util.find_spec("pandas") is not None:
        import pandas as pd  # optional: only its reader, where installed

        return pd.read_csv(path, compression="gzip", header=None, dtype=dtype).values
    return np.loadtxt(path, delimiter=",", dtype=dtype, ndmin=2)


def _read_ogb_mag(files: dict[str, Path]) -> HeteroData:
    """PyG's ``OGB_MAG.process`` (without embeddings), on the given files."""
    data = HeteroData()
    data["paper"].x = torch.from_numpy(_read_csv_gz(files["paper.x"], np.float32))
    data["paper"].year = torch.from_numpy(_read_csv_gz(files["paper.year"], np.int64)).view(-1)
    data["paper"].y = torch.from_numpy(_read_csv_gz(files["paper.y"], np.int64)).view(-1)
    with gzip.open(files["num_nodes"], "rt", newline="") as fh:
        rows = list(csv.reader(fh))
    counts = dict(zip(rows[0], (int(v) for v in rows[1]), strict=True))
    for node_type in ("author", "institution", "field_of_study"):
        data[node_type].num_nodes = counts[node_type]
    for relation in OGB_MAG_RELATIONS:
        edges = _read_csv_gz(files["___".join(relation)], np.int64)
        data[relation].edge_index = torch.from_numpy(edges).t().contiguous()
    for part, name in (("train", "train"), ("valid", "val"), ("test", "test")):
        idx = torch.from_numpy(_read_csv_gz(files[f"split.{part}"], np.int64)).view(-1)
        mask = torch.zeros(data["paper"].num_nodes, dtype=torch.bool)
        mask[idx] = True
        data["paper"][f"{name}_mask"] = mask
    return data


def load_ogb_mag(
    root: str | os.PathLike[str] | None = None,
    transform: Callable[[Any], Any] | None = None,
) -> OgbMag:
    """Load OGB-MAG (papers, authors, institutions, fields of study; paper venues as
    labels, the time split) from the files you have, without downloading or writing to
    ``root``.

    The first load reads the gzipped CSV files (minutes for the full graph; pandas makes
    it faster) and keeps the result in the cache (:func:`cache_dir`), keyed by the files'
    contents; later loads read that.

    Args:
        root (str or Path, optional): the unzipped OGB archive ``mag.zip`` or
            ``ogbn_mag/`` (a folder with ``raw/`` and ``split/``), PyG's ``OGB_MAG`` root
            (``mag/raw/`` holding ``split/``), or the ``raw/`` folder itself.
            (default: ``$FXQUANT_DATA``)
        transform (callable, optional): applied on access, e.g.
            ``torch_geometric.transforms.ToUndirected()`` (which adds the reverse edges).

    Returns:
        OgbMag: an in-memory dataset of one ``HeteroData``: ``paper`` has ``x``, ``year``,
        ``y`` and ``train_mask``/``val_mask``/``test_mask``; the other node types have
        ``num_nodes``; edge types :data:`OGB_MAG_RELATIONS`.

    Example:
        >>> data = load_ogb_mag("/data/ogb")[0]  # doctest: +SKIP
        >>> data["paper"].num_nodes  # doctest: +SKIP
        736389
    """
    source = _given_root(root, "OGB-MAG")
    candidates = [source, source / "raw", source / "mag" / "raw", source / "ogbn_mag" / "raw",
                  source / "mag", source / "ogbn_mag"]
    needed = ["node-feat", "node-label", "relations", "num-node-dict.csv.gz"]
    raw, partial = _first_folder(candidates, needed)
    split = None
    if raw is not None:
        split = next((s for s in (raw / "split", raw.parent / "split")
                      if (s / "time" / "paper").is_dir()), None)
    if raw is None or split is None:
        raise FxquantFileNotFoundError(
            "OGB-MAG: "
            + (f"{partial} holds only some of {needed}" if partial is not None and raw is None
               else f"no split/time/paper folder beside {raw}" if raw is not None
               else f"none of {[str(c) for c in candidates]} holds {needed}")
            + "; please point root= at the unzipped OGB archive (mag/ or ogbn_mag/).")
    files = _ogb_mag_files(raw, split)
    missing = [str(f) for f in files.values() if not f.is_file()]
    if missing:
        raise FxquantFileNotFoundError(f"OGB-MAG: missing {missing}; please copy the complete "
                                       "archive there.")
    work = cache_dir() / "ogb_mag" / f"mag-{_files_key(list(files.values()))}"

    def process(entry: Path) -> None:
        try:
            data = _read_ogb_mag(files)
        except Exception as e:
            raise FxquantValueError(f"OGB-MAG: the files in {raw} cannot be read "
                                    f"({type(e).__name__}: {e}); are they complete?") from e
        torch.save(data.to_dict(), entry / "data.pt")

    _cached(work, {}, process, lambda w: (w / "data.pt").is_file())
    stored = torch.load(work / "data.pt", weights_only=True)
    return OgbMag(HeteroData.from_dict(stored), transform)
