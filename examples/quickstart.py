"""Quick start: truncate the layer outputs of an unmodified GCN and train it a few steps.

Needs no data (a random two-community graph). Run:  python examples/quickstart.py
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch_geometric.data import Data
from torch_geometric.nn import GCNConv

import fxquant


class GCN(torch.nn.Module):
    """The model as a user writes it: nothing here knows about fxquant."""

    def __init__(self, in_channels: int, hidden: int, out_channels: int) -> None:
        super().__init__()
        self.conv1 = GCNConv(in_channels, hidden)
        self.conv2 = GCNConv(hidden, out_channels)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = torch.sigmoid(self.conv1(x, edge_index))
        return F.log_softmax(self.conv2(x, edge_index), dim=1)


def random_graph(num_nodes: int = 200, num_edges: int = 1000, seed: int = 0) -> Data:
    """Two communities with more edges inside than across, and informative features."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (num_nodes,), generator=g)
    src = torch.randint(0, num_nodes, (num_edges,), generator=g)
    dst = torch.randint(0, num_nodes, (num_edges,), generator=g)
    keep = (y[src] == y[dst]) | (torch.rand(num_edges, generator=g) < 0.2)
    edge_index = torch.stack([src[keep], dst[keep]])
    x = torch.randn(num_nodes, 16, generator=g) + y[:, None].float()
    return Data(x=x, edge_index=torch.cat([edge_index, edge_index.flip(0)], dim=1), y=y)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=50, help="training steps (default 50)")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    torch.manual_seed(0)
    data = random_graph()
    model = GCN(16, 16, 2)

    # Keep the top 10 bits (sign, exponent, 1 mantissa bit) after both convs and the
    # sigmoid; the 20 highest in-degree nodes keep only 9 bits after the sigmoid.
    hubs = fxquant.top_degree_nodes(data.edge_index, 0.1)
    gm = fxquant.transform(
        model,
        bits={"conv1": 10, "sigmoid": 10, "conv2": 10},
        rounding="nearest",
        node_formats={"sigmoid": (hubs, 9)},
    )
    print(gm.code)
    print(fxquant.summary(gm))

    opt = torch.optim.Adam(gm.parameters(), lr=0.01)
    for step in range(1, args.steps + 1):
        opt.zero_grad()
        loss = F.nll_loss(gm(data.x, data.edge_index), data.y)
        loss.backward()
        opt.step()
        if step % 10 == 0:
            acc = (gm(data.x, data.edge_index).argmax(1) == data.y).float().mean()
            print(f"step {step:3d}  loss {loss.item():.4f}  train acc {acc:.3f}")
    grad = gm.conv1.lin.weight.grad
    print(f"conv1 weight gradient norm through the truncations: {grad.norm():.4f}")


if __name__ == "__main__":
    main()
