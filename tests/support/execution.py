"""The configurations and models the execution tests convert, built with the public API:
``int8`` and ``int4-lsq-p`` (every site, as Degree-Quant's table places them), and the
recommended per-node recipe."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.data import Data
from torch_geometric.nn import GCNConv
from torch_geometric.nn.models import GAT, GIN, GraphSAGE

import fxquant

SITES = ("input", "weight", "message", "aggregate", "output")
CONFIGS = ("int8", "int4-lsq-p", "recommended")
MODELS = ("gcn", "gin", "sage", "gat")
#: the recommended recipe's training shortened to a test's few epochs: its mapping (per-node
#: widths at their final values, learned steps, mid-rise grids) is the recipe's own
SHORT = {"float_epochs": 0, "refit_epochs": 2, "anneal_every": 0, "distill": 0.0,
         "fit_budget": False}


class GCN(nn.Module):
    """PyG's examples/gcn.py model (two cached ``GCNConv``, dropout 0.5)."""

    def __init__(self, in_channels: int, hidden: int, out_channels: int) -> None:
        super().__init__()
        self.conv1 = GCNConv(in_channels, hidden, cached=True)
        self.conv2 = GCNConv(hidden, out_channels, cached=True)

    def forward(self, x, edge_index):
        x = F.dropout(x, p=0.5, training=self.training)
        x = self.conv1(x, edge_index).relu()
        x = F.dropout(x, p=0.5, training=self.training)
        return self.conv2(x, edge_index)


class WithHead(nn.Module):
    """Two GCN layers and a linear classifier after them (``linear``: another one)."""

    def __init__(self, in_channels: int = 4, linear: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1, self.conv2 = GCNConv(in_channels, 8), GCNConv(8, 8)
        self.head = linear if linear is not None else nn.Linear(8, 3)

    def forward(self, x, edge_index):
        return self.head(self.conv2(self.conv1(x, edge_index).relu(), edge_index).relu())


class LogitsAndHidden(nn.Module):
    """Two GCN layers returning ``(logits, hidden)``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = GCNConv(4, 8), GCNConv(8, 3)

    def forward(self, x, edge_index):
        h = self.conv1(x, edge_index).relu()
        return self.conv2(h, edge_index), h


def make_model(kind: str, in_channels: int, classes: int, hidden: int = 16) -> nn.Module:
    if kind == "gcn":
        return GCN(in_channels, hidden, classes)
    if kind == "gin":
        return GIN(in_channels, hidden, num_layers=2, out_channels=classes, dropout=0.5)
    if kind == "sage":
        return GraphSAGE(in_channels, hidden, num_layers=2, out_channels=classes, dropout=0.5)
    return GAT(in_channels, 8, num_layers=2, out_channels=classes, heads=8, dropout=0.5)


def mapping(config: str) -> fxquant.QuantMapping:
    """``int8``: per-tensor min/max scales; ``int4-lsq-p``: learned steps and Degree-Quant's
    protection (0..0.2) on the activations."""
    out = fxquant.QuantMapping()
    for site in SITES:
        if config == "int8":
            cfg = fxquant.QuantConfig("int8", scale="tensor")
        else:
            cfg = fxquant.QuantConfig("int4", scale="tensor", range="lsq",
                                      protect=None if site == "weight" else (0.0, 0.2))
        out.set_global(cfg, site=site)
    return out


def transformed(kind: str, config: str, data: Data, classes: int, seed: int = 0
                ) -> tuple[torch.fx.GraphModule, fxquant.recipes.QuantTraining]:
    torch.manual_seed(seed)
    model = make_model(kind, data.num_features, classes)
    if config == "recommended":
        run = fxquant.recipes.get("recommended", **SHORT).prepare(model, data)
    else:
        gm = fxquant.transform(model, mapping(config), lint="off")
        run = fxquant.recipes.QuantTraining(gm)
    return run.model, run


def train(gm: nn.Module, run: fxquant.recipes.QuantTraining, data: Data, epochs: int,
          mask: torch.Tensor | None = None) -> None:
    """A few epochs of PyG's gcn.py loop (Adam, lr 0.01) with the recipe's hooks."""
    optimizer = torch.optim.Adam(run.param_groups([{"params": list(gm.parameters())}]),
                                 lr=0.01, weight_decay=5e-4)
    mask = mask if mask is not None else getattr(data, "train_mask", None)
    for epoch in range(epochs):
        gm.train()
        run.start_epoch(epoch)
        optimizer.zero_grad()
        out = gm(data.x, data.edge_index)
        target = out if mask is None else out[mask]
        y = data.y if mask is None else data.y[mask]
        run.loss(F.cross_entropy(target, y), output=out).backward()
        optimizer.step()
    gm.eval()


def random_graph(num_nodes: int, num_edges: int, features: int, seed: int) -> Data:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_nodes, features, generator=g).abs()
    if num_nodes:
        edge_index = torch.randint(0, num_nodes, (2, num_edges), generator=g)
        y = torch.randint(0, 3, (num_nodes,), generator=g)
    else:
        edge_index = torch.zeros(2, 0, dtype=torch.long)
        y = torch.zeros(0, dtype=torch.long)
    return Data(x=x, edge_index=edge_index, y=y, num_nodes=num_nodes)
