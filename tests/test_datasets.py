"""fxquant.datasets.load_planetoid: offline, read-only roots, clear errors."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from fxquant.datasets import load_planetoid
from tests.support.data import SHARED, needs_data


def tree(root: Path) -> dict[str, tuple[int, str]]:
    """Every file under root: size and content hash."""
    return {str(p.relative_to(root)): (p.stat().st_size, hashlib.sha1(p.read_bytes()).hexdigest())
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FXQUANT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@needs_data
@pytest.mark.parametrize("name", ["Cora", "citeseer"])
def test_loads_from_fxquant_data_and_writes_only_to_the_cache(name, cache):
    """The public split loads from FXQUANT_DATA; the data folder's tree is unchanged."""
    before = tree(Path(SHARED))
    data = load_planetoid(name)[0]
    assert tree(Path(SHARED)) == before
    assert (int(data.train_mask.sum()), int(data.val_mask.sum()), int(data.test_mask.sum())) == (
        (140, 500, 1000) if name == "Cora" else (120, 500, 1000))
    assert any(cache.rglob("processed/*.pt"))


@needs_data
def test_read_only_root_given_as_argument(tmp_path, cache):
    """A copied root with no write bits (root could still write there) stays as it was."""
    root = tmp_path / "data"
    shutil.copytree(Path(SHARED) / "Cora", root / "Cora")
    for p in [root, *root.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    before = tree(root)
    try:
        data = load_planetoid("Cora", root=root)[0]
    finally:
        for p in [root, *root.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
    assert data.num_nodes == 2708 and tree(root) == before


def test_missing_files_and_failed_download_give_one_clear_error(tmp_path, cache, monkeypatch):
    """It says where it looked and how to point it elsewhere."""
    from torch_geometric.datasets import Planetoid

    def no_network(self):
        raise OSError("network is unreachable")

    monkeypatch.setattr(Planetoid, "download", no_network)
    with pytest.raises(FileNotFoundError, match=r"not in .*empty.*Cora.*raw.*FXQUANT_DATA or pass root="):
        load_planetoid("Cora", root=tmp_path / "empty")


def test_unknown_name():
    with pytest.raises(ValueError, match=r"unknown Planetoid dataset 'Corra'"):
        load_planetoid("Corra")


def _copy_cora(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    shutil.copytree(Path(SHARED) / "Cora", root / "Cora")
    return root


@needs_data
def test_edited_raw_files_are_never_served_stale(tmp_path, cache):
    """Labels edited in place at the same path: the next load returns the new labels."""
    import pickle

    import numpy as np

    root = _copy_cora(tmp_path)
    first = load_planetoid("Cora", root=root)[0]
    path = root / "Cora" / "raw" / "ind.cora.ally"  # labels PyG builds data.y from
    with path.open("rb") as f:
        y = pickle.load(f, encoding="latin1")
    y = np.roll(np.asarray(y), 1, axis=1)  # every training label moves to the next class
    with path.open("wb") as f:
        pickle.dump(y, f)
    second = load_planetoid("Cora", root=root)[0]
    train = first.train_mask
    assert not (first.y[train] == second.y[train]).any()


@needs_data
@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_corrupt_raw_file_is_named(tmp_path, cache, damage):
    root = _copy_cora(tmp_path)
    path = root / "Cora" / "raw" / "ind.cora.allx"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3] if damage == "truncate" else b"not a pickle" * 10)
    with pytest.raises(ValueError, match=r"raw file .*ind\.cora\.allx cannot be read"):
        load_planetoid("Cora", root=root)


@needs_data
def test_one_missing_file_is_named_without_a_download(tmp_path, cache, monkeypatch):
    from torch_geometric.datasets import Planetoid

    def no_download(self):
        raise AssertionError("must not try to download")

    monkeypatch.setattr(Planetoid, "download", no_download)
    root = _copy_cora(tmp_path)
    (root / "Cora" / "raw" / "ind.cora.graph").unlink()
    with pytest.raises(FileNotFoundError, match=r"lacks \['ind\.cora\.graph'\]"):
        load_planetoid("Cora", root=root)


@needs_data
def test_cache_inside_the_data_root_is_refused(tmp_path, monkeypatch):
    root = _copy_cora(tmp_path)
    monkeypatch.setenv("FXQUANT_CACHE", str(root / "cache"))
    before = tree(root)
    with pytest.raises(ValueError, match="lies inside the data root"):
        load_planetoid("Cora", root=root)
    assert tree(root) == before


def _load_in_worker(args: tuple[str, str]) -> int:
    import os

    os.environ["FXQUANT_CACHE"] = args[0]
    return int(load_planetoid(args[1])[0].num_nodes)


@needs_data
def test_processes_loading_a_new_cache_entry_at_once_all_succeed(tmp_path):
    """A pool of workers each loading the same dataset into an empty cache: none reads a
    half-written file (each entry is built privately and moved into place in one rename),
    and one entry is left with no private folders beside it."""
    import multiprocessing

    cache = tmp_path / "cache"
    jobs = [(str(cache), "CiteSeer")] * 6
    with multiprocessing.get_context("spawn").Pool(6) as pool:
        assert pool.map(_load_in_worker, jobs) == [3327] * 6
    assert [p.name.split("-")[0] for p in (cache / "planetoid").iterdir()] == ["CiteSeer"]


@needs_data
def test_an_entry_left_half_built_is_built_again(cache):
    """An entry holding raw files but no processed data (an interrupted first load) loads."""
    load_planetoid("Cora")
    (entry,) = (cache / "planetoid").iterdir()
    shutil.rmtree(entry / "Cora" / "processed")
    assert load_planetoid("Cora")[0].num_nodes == 2708
    assert (entry / "Cora" / "processed" / "data.pt").is_file()


@needs_data
def test_a_cache_entry_has_the_umask_permissions(cache):
    """Built privately, the entry still gets the permissions a plain folder would (a cache
    shared between users stays readable), and nothing private is left beside it."""
    import os

    load_planetoid("Cora")
    (entry,) = (cache / "planetoid").iterdir()
    probe = cache / "probe"
    probe.mkdir()
    assert (entry.stat().st_mode & 0o777) == (probe.stat().st_mode & 0o777)
    assert not [p for p in os.listdir(cache / "planetoid") if p.startswith(".")]
