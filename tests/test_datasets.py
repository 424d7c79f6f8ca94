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
