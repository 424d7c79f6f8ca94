"""Synthetic graphs for the experiments and the benchmarks: planted communities with a
homophily knob and heavy-tailed degrees.

Example:
    >>> from experiments.graphs import planted_communities
    >>> data = planted_communities(200, 800, 16, 4, seed=0)
    >>> data.num_nodes, data.num_edges, int(data.y.max()) + 1
    (200, 800, 4)
"""

from __future__ import annotations

import torch
from torch_geometric.data import Data

__all__ = ["planted_communities"]


def planted_communities(num_nodes: int, num_edges: int, features: int, classes: int,
                        p_in: float = 0.8, seed: int = 0, skew: float = 0.0) -> Data:
    """A graph whose nodes' classes are planted communities (contiguous id ranges): a
    fraction ``p_in`` of the edges stays inside the source's community (the homophily
    knob), features are the class's centroid plus noise, and 10% / 10% / 80% of the nodes
    are in ``train_mask`` / ``val_mask`` / ``test_mask``.

    ``skew`` > 0 gives heavy-tailed degrees: both ends of each edge are drawn with
    probability proportional to ``r ** -skew``, ``r`` a node's rank in a random order (a
    Zipf law; 0: uniform, about Poisson degrees; 1: a few hubs with hundreds of edges).
    """
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(num_nodes) * classes // num_nodes
    start = torch.arange(classes) * num_nodes // classes
    size = torch.diff(torch.cat([start, torch.tensor([num_nodes])]))
    if skew:
        rank = torch.randperm(num_nodes, generator=g).float() + 1
        weight = rank ** -skew
        src = torch.multinomial(weight, num_edges, replacement=True, generator=g)
        inside = torch.rand(num_edges, generator=g) < p_in
        community = y[src]
        # inside: a node of the source's community, by weight (inverse of the cumulative)
        cumulative = torch.cumsum(weight.double(), 0)
        before = torch.cat([cumulative.new_zeros(1), cumulative])[start]
        total = cumulative[start + size - 1] - before
        draw = before[community] + torch.rand(num_edges, generator=g).double() * total[community]
        local = torch.searchsorted(cumulative, draw).clamp(max=num_nodes - 1)
        dst = torch.where(inside, local,
                          torch.multinomial(weight, num_edges, replacement=True, generator=g))
    else:
        src = torch.randint(0, num_nodes, (num_edges,), generator=g)
        inside = torch.rand(num_edges, generator=g) < p_in
        community = y[src]
        offset = (torch.rand(num_edges, generator=g) * size[community]).long()
        dst = torch.where(inside, start[community] + offset,
                          torch.randint(0, num_nodes, (num_edges,), generator=g))
    centroids = torch.randn(classes, features, generator=g)
    x = centroids[y] + 2.0 * torch.randn(num_nodes, features, generator=g)
    train = torch.rand(num_nodes, generator=g) < 0.1
    split = torch.rand(num_nodes, generator=g)
    val = ~train & (split < 0.1)
    return Data(x=x, edge_index=torch.stack([src, dst]), y=y, train_mask=train, val_mask=val,
                test_mask=~train & ~val)
