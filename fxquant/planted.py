"""Synthetic graphs with planted, learnable labels: results anyone can rerun offline.

- :func:`planted_hetero`: one heterogeneous graph (``author``, ``paper``, ``field``; four
  edge types) whose paper classes show weakly in the features and strongly in who writes
  and cites what, with a heavy tail of author and citation degrees.
- :func:`planted_motifs`: a graph-classification set: random trees, each with one planted
  motif (house, 6-cycle, 4-clique, or a plain path) that gives its class.

Both are deterministic in ``seed`` (one CPU ``torch.Generator`` draws everything; torch
2.12, 2.13 and 2.14 give the same graphs) and need no file or network.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Data, HeteroData, InMemoryDataset
from torch_geometric.utils import coalesce

from fxquant.errors import FxquantValueError

__all__ = ["HETERO_EDGE_TYPES", "MOTIFS", "PlantedMotifs", "planted_hetero", "planted_motifs"]

#: The edge types of :func:`planted_hetero`: every node type receives messages.
HETERO_EDGE_TYPES = (
    ("author", "writes", "paper"),
    ("paper", "rev_writes", "author"),
    ("paper", "cites", "paper"),
    ("paper", "has_topic", "field"),
)

_CHANNELS = {"author": 16, "paper": 32, "field": 8}


def _check(name: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise FxquantValueError(f"{name} must lie in [{low}, {high}], got {value!r}")


def _heavy_tail(n: int, alpha: float, gen: torch.Generator) -> Tensor:
    """Pareto(alpha) weights: a few nodes get most of the edges (a degree tail)."""
    u = torch.rand(n, generator=gen, dtype=torch.float64).clamp_min(1e-12)
    return u.pow(-1.0 / alpha)


def _pick(weights: Tensor, groups: Tensor, wanted: Tensor, homophily: float,
          gen: torch.Generator) -> Tensor:
    """For each entry of ``wanted`` (a class), one node drawn by ``weights``: from that
    class with probability ``homophily``, else from all nodes."""
    n_classes = int(groups.max()) + 1
    same = torch.rand(len(wanted), generator=gen) < homophily
    out = torch.multinomial(weights, len(wanted), replacement=True, generator=gen)
    for c in range(n_classes):
        rows = (same & (wanted == c)).nonzero().view(-1)
        members = (groups == c).nonzero().view(-1)
        if len(rows) and len(members):
            drawn = torch.multinomial(weights[members], len(rows), replacement=True,
                                      generator=gen)
            out[rows] = members[drawn]
    return out


def planted_hetero(
    num_papers: int = 2000,
    num_authors: int = 800,
    num_fields: int = 40,
    num_classes: int = 4,
    channels: Mapping[str, int] | None = None,
    homophily: float = 0.75,
    feature_signal: float = 0.25,
    tail: float = 1.5,
    seed: int = 0,
) -> HeteroData:
    """A heterogeneous graph with planted paper classes (3 node types, 4 edge types).

    Each paper has a class. Its features are the class's random centre times
    ``feature_signal`` plus unit noise, so features alone classify it only in part; its
    authors (1 + Poisson(1.5) of them), the papers it cites (Poisson(4)) and its fields (1
    to 3) belong to its class with probability ``homophily`` and are otherwise drawn from
    all, so messages carry the rest. Authors and cited papers are drawn with Pareto(``tail``)
    weights: a few authors write and a few papers are cited far more than the rest (a
    heavy degree tail). Authors and fields have features of their class's centre too.

    Args:
        num_papers, num_authors, num_fields (int, optional): node counts.
            (default: 2000, 800, 40)
        num_classes (int, optional): paper classes (``data["paper"].y``). (default: 4)
        channels (dict, optional): feature width per node type. (default:
            ``{"author": 16, "paper": 32, "field": 8}``)
        homophily (float, optional): probability that an edge stays within the class, in
            [0, 1]. (default: 0.75)
        feature_signal (float, optional): distance of the class centres in units of the
            noise; 0 makes features useless. (default: 0.25)
        tail (float, optional): Pareto exponent of the degree weights (smaller: heavier
            tail). (default: 1.5)
        seed (int, optional): the only source of randomness. (default: 0)

    Returns:
        HeteroData: node types ``author``, ``paper``, ``field`` with ``x``; papers with
        ``y`` and disjoint ``train_mask``/``val_mask``/``test_mask`` (60/20/20); edge types
        :data:`HETERO_EDGE_TYPES` (``rev_writes`` is ``writes`` reversed), without
        duplicates.

    Example:
        >>> data = planted_hetero(num_papers=200, num_authors=80, num_fields=10, seed=1)
        >>> data.node_types, len(data.edge_types)
        (['author', 'paper', 'field'], 4)
        >>> torch.equal(data["paper"].y, planted_hetero(200, 80, 10, seed=1)["paper"].y)
        True
    """
    for name, n in (("num_papers", num_papers), ("num_authors", num_authors),
                    ("num_fields", num_fields)):
        if not isinstance(n, int) or n < num_classes:
            raise FxquantValueError(f"{name} must be an int of at least num_classes="
                                    f"{num_classes}, got {n!r}")
    if not isinstance(num_classes, int) or num_classes < 2:
        raise FxquantValueError(f"num_classes must be an int of at least 2, got {num_classes!r}")
    _check("homophily", homophily, 0.0, 1.0)
    _check("feature_signal", feature_signal, 0.0, float("inf"))
    _check("tail", tail, 0.1, float("inf"))
    widths = {**_CHANNELS, **(channels or {})}
    unknown = sorted(set(widths) - set(_CHANNELS))
    if unknown:
        raise FxquantValueError(f"channels names node types {unknown}; the node types are "
                                f"{sorted(_CHANNELS)}")
    gen = torch.Generator().manual_seed(seed)
    counts = {"author": num_authors, "paper": num_papers, "field": num_fields}
    data = HeteroData()
    classes = {}
    for node_type in ("author", "paper", "field"):
        n, c = counts[node_type], widths[node_type]
        y = torch.arange(n, device="cpu") % num_classes  # every class present
        y = y[torch.randperm(n, generator=gen)]
        centres = torch.randn(num_classes, c, generator=gen)
        noise = torch.randn(n, c, generator=gen)
        data[node_type].x = feature_signal * centres[y] + noise
        classes[node_type] = y
    y_paper = classes["paper"]
    data["paper"].y = y_paper

    def edges(src_type: str, per_paper: Tensor, weights: Tensor) -> Tensor:
        papers = torch.repeat_interleave(torch.arange(num_papers, device="cpu"), per_paper)
        other = _pick(weights, classes[src_type], y_paper[papers], homophily, gen)
        return torch.stack([other, papers])

    n_authors = 1 + torch.poisson(torch.full((num_papers,), 1.5), generator=gen).long()
    writes = edges("author", n_authors, _heavy_tail(num_authors, tail, gen))
    n_cited = torch.poisson(torch.full((num_papers,), 4.0), generator=gen).long()
    cites = edges("paper", n_cited, _heavy_tail(num_papers, tail, gen)).flip(0)
    cites = cites[:, cites[0] != cites[1]]  # no paper cites itself
    n_fields = torch.randint(1, 4, (num_papers,), generator=gen)
    topic = edges("field", n_fields, torch.ones(num_fields, dtype=torch.float64)).flip(0)
    for (src, rel, dst), index in zip(HETERO_EDGE_TYPES,
                                      (writes, writes.flip(0), cites, topic), strict=True):
        data[src, rel, dst].edge_index = coalesce(index)

    order = torch.randperm(num_papers, generator=gen)
    n_train, n_val = int(0.6 * num_papers), int(0.2 * num_papers)
    for name, part in (("train", order[:n_train]), ("val", order[n_train:n_train + n_val]),
                       ("test", order[n_train + n_val:])):
        mask = torch.zeros(num_papers, dtype=torch.bool)
        mask[part] = True
        data["paper"][f"{name}_mask"] = mask
    return data


def _house() -> list[tuple[int, int]]:
    return [(0, 1), (1, 2), (2, 3), (3, 0), (2, 4), (3, 4)]


def _cycle() -> list[tuple[int, int]]:
    return [(i, (i + 1) % 6) for i in range(6)]


def _clique() -> list[tuple[int, int]]:
    return [(i, j) for i in range(4) for j in range(i + 1, 4)]


def _path() -> list[tuple[int, int]]:
    return [(i, i + 1) for i in range(4)]


#: The planted motifs, in class order: name -> (node count, undirected edges).
MOTIFS: dict[str, tuple[int, Callable[[], list[tuple[int, int]]]]] = {
    "house": (5, _house),
    "cycle6": (6, _cycle),
    "clique4": (4, _clique),
    "path5": (5, _path),
}


class PlantedMotifs(InMemoryDataset):
    """Graphs with one planted motif each; the motif is the class (see :func:`planted_motifs`).

    The dataset lives in memory (no ``root``); ``dataset.motifs`` names the classes.
    """

    def __init__(self, data_list: list[Data], motifs: tuple[str, ...],
                 transform: Callable[[Any], Any] | None = None) -> None:
        super().__init__(None, transform)
        self.motifs = motifs
        self._data, self.slices = self.collate(data_list)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)}, motifs={list(self.motifs)})"


def planted_motifs(
    num_graphs: int = 1000,
    nodes: tuple[int, int] = (10, 30),
    motifs: tuple[str, ...] = tuple(MOTIFS),
    channels: int = 8,
    seed: int = 0,
    transform: Callable[[Any], Any] | None = None,
) -> PlantedMotifs:
    """A graph-classification set: random trees, each with one planted motif.

    Each graph is a random recursive tree (each new node attaches to a uniformly drawn
    earlier one) of a size drawn from ``nodes``, with one motif from ``motifs`` attached by
    one edge to a random tree node; the motif's index in ``motifs`` is the graph's label
    (classes are balanced: graph ``i`` has class ``i % len(motifs)`` before shuffling).
    Trees have no cycles, so a motif's cycles are the graph's only ones. Node features are
    a constant 1 followed by ``channels - 1`` standard normal values: structure carries the
    class, features do not.

    Args:
        num_graphs (int, optional): how many graphs. (default: 1000)
        nodes (tuple, optional): the tree's node count, drawn uniformly from
            ``[low, high]``. (default: ``(10, 30)``)
        motifs (tuple, optional): names from :data:`MOTIFS`, in class order.
            (default: all four)
        channels (int, optional): node feature width. (default: 8)
        seed (int, optional): the only source of randomness. (default: 0)
        transform (callable, optional): applied on access, as in PyG datasets.

    Returns:
        PlantedMotifs: an in-memory PyG dataset of undirected graphs with ``x``,
        ``edge_index`` and ``y`` (shape ``[1]``); ``dataset.num_classes ==
        len(motifs)``. Use a :class:`torch_geometric.loader.DataLoader` for mini-batches.

    Example:
        >>> dataset = planted_motifs(num_graphs=8, seed=3)
        >>> len(dataset), dataset.num_classes, dataset.num_features
        (8, 4, 8)
        >>> sorted(int(d.y) for d in dataset)
        [0, 0, 1, 1, 2, 2, 3, 3]
    """
    if not isinstance(num_graphs, int) or num_graphs < 1:
        raise FxquantValueError(f"num_graphs must be a positive int, got {num_graphs!r}")
    unknown = [m for m in motifs if m not in MOTIFS]
    if unknown or len(set(motifs)) < 2 or len(set(motifs)) != len(motifs):
        raise FxquantValueError(f"motifs must name at least two different motifs of "
                                f"{list(MOTIFS)}; got {list(motifs)}")
    low, high = nodes
    if not (isinstance(low, int) and isinstance(high, int) and 1 <= low <= high):
        raise FxquantValueError(f"nodes must be (low, high) ints with 1 <= low <= high, got {nodes!r}")
    if not isinstance(channels, int) or channels < 1:
        raise FxquantValueError(f"channels must be a positive int, got {channels!r}")
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(num_graphs, generator=gen)
    labels = (torch.arange(num_graphs, device="cpu") % len(motifs))[order]
    graphs = []
    for label in labels.tolist():
        n_tree = int(torch.randint(low, high + 1, (1,), generator=gen))
        parents = [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n_tree)]
        pairs = [(p, i) for i, p in zip(range(1, n_tree), parents, strict=True)]
        size, make = MOTIFS[motifs[label]]
        pairs += [(n_tree + a, n_tree + b) for a, b in make()]
        anchor = int(torch.randint(0, n_tree, (1,), generator=gen))
        pairs.append((anchor, n_tree + int(torch.randint(0, size, (1,), generator=gen))))
        n = n_tree + size
        # the motif's nodes get shuffled ids, so that the class is not in the numbering
        perm = torch.randperm(n, generator=gen)
        index = perm[torch.tensor(pairs).t()]
        edge_index = coalesce(torch.cat([index, index.flip(0)], dim=1), num_nodes=n)
        x = torch.cat([torch.ones(n, 1), torch.randn(n, channels - 1, generator=gen)], dim=1)
        graphs.append(Data(x=x, edge_index=edge_index, y=torch.tensor([label])))
    return PlantedMotifs(graphs, tuple(motifs), transform)
