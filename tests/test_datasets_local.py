"""fxquant.datasets.load_tu / load_dblp / load_ogb_mag: the user's own files, in their
on-disk formats (small ones built here), loaded offline without writing to the root."""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from fxquant.datasets import DBLP_FILES, OGB_MAG_RELATIONS, load_dblp, load_ogb_mag, load_tu
from fxquant.errors import FxquantError


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FXQUANT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _read_only(root: Path, on: bool) -> None:
    for p in [root, *root.rglob("*")]:
        p.chmod((0o555 if p.is_dir() else 0o444) if on else (0o755 if p.is_dir() else 0o644))


# -- TU ----------------------------------------------------------------------------------

def write_tu(folder: Path, name: str = "TOY") -> None:
    """Three graphs (a triangle, an edge, a path of three) in the TU text format:
    1-based node ids, one graph id per node, one label per graph and per node."""
    folder.mkdir(parents=True, exist_ok=True)
    edges = [(1, 2), (2, 3), (3, 1), (4, 5), (6, 7), (7, 8)]
    both = edges + [(b, a) for a, b in edges]
    (folder / f"{name}_A.txt").write_text("".join(f"{a}, {b}\n" for a, b in both))
    (folder / f"{name}_graph_indicator.txt").write_text("1\n1\n1\n2\n2\n3\n3\n3\n")
    (folder / f"{name}_graph_labels.txt").write_text("1\n-1\n1\n")
    (folder / f"{name}_node_labels.txt").write_text("0\n1\n2\n0\n0\n1\n1\n2\n")


@pytest.mark.parametrize("layout", ["TOY/raw", "raw", "TOY", "."])
def test_tu_loads_from_each_layout_and_leaves_the_root_alone(tmp_path, cache, layout):
    """The graphs, labels and node-label features come out as PyG's TUDataset gives them;
    a read-only root is unchanged and only the cache is written."""
    root = tmp_path / "data"
    write_tu(root / layout)
    before = tree(root)
    _read_only(root, True)
    try:
        dataset = load_tu("TOY", root=root)
    finally:
        _read_only(root, False)
    assert tree(root) == before
    assert len(dataset) == 3 and dataset.num_classes == 2
    assert [d.num_nodes for d in dataset] == [3, 2, 3]
    assert [int(d.y) for d in dataset] == [1, 0, 1]
    assert dataset[0].x.shape == (3, 3) and dataset[0].edge_index.shape == (2, 6)
    assert any(cache.rglob("processed/data.pt"))


def test_tu_edited_files_are_read_again(tmp_path, cache):
    """The cache is keyed by the files' contents: an edit gives the new labels."""
    write_tu(tmp_path / "d")
    assert [int(d.y) for d in load_tu("TOY", root=tmp_path / "d")] == [1, 0, 1]
    (tmp_path / "d" / "TOY_graph_labels.txt").write_text("1\n1\n-1\n")
    assert [int(d.y) for d in load_tu("TOY", root=tmp_path / "d")] == [1, 1, 0]


def test_tu_missing_files_say_where_it_looked(tmp_path, cache):
    """No download: a missing file is an error that names the files and folders."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "TOY_A.txt").write_text("1, 2\n")
    with pytest.raises(FileNotFoundError, match=r"TOY_graph_indicator\.txt.*holds some"):
        load_tu("TOY", root=tmp_path / "d")
    with pytest.raises(FileNotFoundError, match="root="):
        load_tu("MUTAG", root=tmp_path / "d")


def test_tu_unreadable_files_are_a_clear_error(tmp_path, cache):
    write_tu(tmp_path / "d")
    (tmp_path / "d" / "TOY_graph_indicator.txt").write_text("one\n")
    with pytest.raises(FxquantError, match="cannot be read"):
        load_tu("TOY", root=tmp_path / "d")


def test_no_root_and_no_fxquant_data_is_an_error(cache, monkeypatch):
    monkeypatch.delenv("FXQUANT_DATA", raising=False)
    with pytest.raises(FileNotFoundError, match="does not download"):
        load_tu("MUTAG")


# -- DBLP --------------------------------------------------------------------------------

def write_dblp(folder: Path) -> dict[str, int]:
    """DBLP's files as MAGNN released them: one adjacency over all nodes (authors, papers,
    terms, conferences in that order), sparse author and paper features, dense terms."""
    import scipy.sparse as sp

    folder.mkdir(parents=True, exist_ok=True)
    n = {"author": 4, "paper": 5, "term": 3, "conference": 2}
    start = {"author": 0, "paper": 4, "term": 9, "conference": 12}
    pairs = [("author", 0, "paper", 0), ("author", 1, "paper", 1), ("author", 3, "paper", 4),
             ("paper", 0, "term", 2), ("paper", 2, "conference", 1)]
    rows, cols = [], []
    for a, i, b, j in pairs:
        rows += [start[a] + i, start[b] + j]
        cols += [start[b] + j, start[a] + i]
    total = sum(n.values())
    sp.save_npz(folder / "adjM.npz", sp.csr_matrix((np.ones(len(rows)), (rows, cols)),
                                                   shape=(total, total)))
    sp.save_npz(folder / "features_0.npz", sp.csr_matrix(np.eye(4, 6)))
    sp.save_npz(folder / "features_1.npz", sp.csr_matrix(np.ones((5, 7))))
    np.save(folder / "features_2.npy", np.zeros((3, 2), dtype=np.float32))
    np.save(folder / "labels.npy", np.array([0, 1, 2, 3]))
    np.save(folder / "node_types.npy", np.array([0] * 4 + [1] * 5 + [2] * 3 + [3] * 2))
    np.savez(folder / "train_val_test_idx.npz", train_idx=np.array([0, 1]),
             val_idx=np.array([2]), test_idx=np.array([3]))
    return n


@pytest.mark.parametrize("layout", ["raw", "DBLP/raw", "."])
def test_dblp_loads_the_heterogeneous_graph(tmp_path, cache, layout):
    """Node types, features, labels, masks and both directions of each relation."""
    root = tmp_path / "data"
    n = write_dblp(root / layout)
    before = tree(root)
    data = load_dblp(root)[0]
    assert tree(root) == before
    assert {t: data[t].num_nodes for t in n} == n
    assert data["author"].x.shape == (4, 6) and data["term"].x.shape == (3, 2)
    assert data["author"].y.tolist() == [0, 1, 2, 3]
    assert data["author"].train_mask.tolist() == [True, True, False, False]
    assert data["author", "to", "paper"].edge_index.tolist() == [[0, 1, 3], [0, 1, 4]]
    assert data["paper", "to", "author"].edge_index.tolist() == [[0, 1, 4], [0, 1, 3]]
    assert data["paper", "to", "conference"].edge_index.tolist() == [[2], [1]]


def test_dblp_missing_file_is_named(tmp_path, cache):
    write_dblp(tmp_path / "d")
    (tmp_path / "d" / "labels.npy").unlink()
    with pytest.raises(FileNotFoundError, match=r"lacks \['labels.npy'\]"):
        load_dblp(tmp_path / "d")
    assert len(DBLP_FILES) == 7


# -- OGB-MAG -----------------------------------------------------------------------------

def _gz(path: Path, rows: list[list[object]], header: list[str] | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ([",".join(header)] if header else []) + [",".join(map(str, r)) for r in rows]
    with gzip.open(path, "wt") as fh:
        fh.write("\n".join(lines) + "\n")


def write_ogb_mag(raw: Path, split: Path) -> None:
    """OGB-MAG's archive format: gzipped CSVs without headers (but the node counts)."""
    _gz(raw / "node-feat" / "paper" / "node-feat.csv.gz",
        [[0.5, 1.0], [1.5, -1.0], [0.0, 0.25], [2.0, 2.0]])
    _gz(raw / "node-feat" / "paper" / "node_year.csv.gz", [[2010], [2011], [2019], [2019]])
    _gz(raw / "node-label" / "paper" / "node-label.csv.gz", [[3], [0], [1], [3]])
    _gz(raw / "num-node-dict.csv.gz", [[3, 2, 1, 4]],
        header=["author", "field_of_study", "institution", "paper"])
    edges = {("author", "affiliated_with", "institution"): [[0, 0], [2, 0]],
             ("author", "writes", "paper"): [[0, 0], [1, 1], [2, 3]],
             ("paper", "cites", "paper"): [[1, 0], [2, 0], [3, 2]],
             ("paper", "has_topic", "field_of_study"): [[0, 1], [3, 0]]}
    assert tuple(edges) == OGB_MAG_RELATIONS
    for relation, rows in edges.items():
        _gz(raw / "relations" / "___".join(relation) / "edge.csv.gz", rows)
    for part, idx in (("train", [0, 1]), ("valid", [2]), ("test", [3])):
        _gz(split / "time" / "paper" / f"{part}.csv.gz", [[i] for i in idx])


@pytest.mark.parametrize("layout", ["ogb", "pyg", "raw"])
def test_ogb_mag_loads_from_the_archive_layouts(tmp_path, cache, layout):
    """The unzipped archive (raw/ beside split/), PyG's root (mag/raw/ holding split/), or
    raw/ itself: the same HeteroData as PyG's OGB_MAG; a second load reads the cache."""
    root = tmp_path / "data"
    raw = {"ogb": root / "ogbn_mag" / "raw", "pyg": root / "mag" / "raw", "raw": root}[layout]
    write_ogb_mag(raw, raw.parent / "split" if layout == "ogb" else raw / "split")
    before = tree(root)
    data = load_ogb_mag(root)[0]
    assert tree(root) == before
    paper = data["paper"]
    assert paper.x.dtype == torch.float32 and paper.x.tolist()[1] == [1.5, -1.0]
    assert paper.year.tolist() == [2010, 2011, 2019, 2019] and paper.y.tolist() == [3, 0, 1, 3]
    assert [data[t].num_nodes for t in ("author", "institution", "field_of_study")] == [3, 1, 2]
    assert data["author", "writes", "paper"].edge_index.tolist() == [[0, 1, 2], [0, 1, 3]]
    assert paper.train_mask.tolist() == [True, True, False, False]
    assert paper.val_mask.tolist() == [False, False, True, False]
    assert load_ogb_mag(root).num_classes == 4
    assert len(list(cache.rglob("data.pt"))) == 1


def test_ogb_mag_missing_split_or_relation(tmp_path, cache):
    """A missing relation file or split folder is named; nothing is downloaded."""
    root = tmp_path / "d"
    write_ogb_mag(root / "raw", root / "split")
    (root / "raw" / "relations" / "paper___cites___paper" / "edge.csv.gz").unlink()
    with pytest.raises(FileNotFoundError, match="paper___cites___paper"):
        load_ogb_mag(root)
    other = tmp_path / "other"
    write_ogb_mag(other / "raw", other / "elsewhere")
    with pytest.raises(FileNotFoundError, match="split/time/paper"):
        load_ogb_mag(other)
