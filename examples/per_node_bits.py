"""A bit-width per node: fixed from in-degree, or learned under a budget, and counted.

Each node's rows (its features, its aggregation, the messages into it) are rounded to the
node's own integer width. ``NodeBits.by_degree`` sets the widths from in-degree (nothing to
store); ``NodeBits.learned_init`` learns them with the step (A2Q-style), pulled toward a
budget by ``fxquant.bit_penalty``. ``fxquant.bit_report`` counts what the values cost,
widths and steps included. A mini-batch passes its nodes' global ids (``node_ids=``).

Needs no data (a random graph). Run:  python examples/per_node_bits.py
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch_geometric.nn import GCNConv
from torch_geometric.utils import subgraph

import fxquant
from fxquant import NodeBits, QuantConfig, QuantMapping


class GCN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = GCNConv(16, 32), GCNConv(32, 4)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="training steps (default 100)")
    parser.add_argument("--budget", type=float, default=3.0, help="average bits (default 3)")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    if not 1 <= args.budget <= 7:  # (learned widths start a bit above it, within 2..8)
        parser.error(f"--budget must lie in 1..7 bits, got {args.budget}")
    torch.manual_seed(0)
    n = 500
    y = torch.randint(0, 4, (n,))
    x = F.one_hot(y, 16).float() + 0.5 * torch.randn(n, 16)
    hubs = torch.randint(0, 20, (3000,))  # a few nodes receive most edges
    edge_index = torch.stack([torch.randint(0, n, (3000,)), torch.where(
        torch.rand(3000) < 0.5, hubs, torch.randint(0, n, (3000,)))])

    # Fixed: the top 10% by in-degree get 8 bits, the rest 4, at every activation site.
    fixed = NodeBits.by_degree(edge_index, quantiles=[0.9], bits=[4, 8], num_nodes=n)
    config = QuantConfig("int8", scale="tensor", range="lsq", node_bits=fixed)
    mapping = QuantMapping()
    for site in ("message", "aggregate", "output"):
        mapping.set_global(config, site=site)
    gm = fxquant.transform(GCN(), mapping)
    print(fxquant.bit_report(gm, x, edge_index))

    # Learned: one table for every site (fxquant.share_bits), pulled toward the budget.
    learned = QuantConfig("int8", scale="tensor", range="lsq",
                          node_bits=NodeBits.learned_init(n, init=args.budget + 1))
    mapping = QuantMapping()
    for site in ("message", "aggregate", "output"):
        mapping.set_global(learned, site=site)
    gm = fxquant.transform(GCN(), mapping)
    points = [name for name, _ in fxquant.quantization_points(gm)]
    for name in points[1:]:
        fxquant.share_bits(gm, name, points[0])
    optimizer = torch.optim.Adam(gm.parameters(), lr=0.01)
    for _ in range(args.steps):
        optimizer.zero_grad()
        out = gm(x, edge_index)
        loss = F.cross_entropy(out, y) + 10 * fxquant.bit_penalty(gm, args.budget)
        loss.backward()
        optimizer.step()
    report = fxquant.bit_report(gm, x, edge_index)
    print(f"learned: {report.avg_bits:.2f} bits per value (budget {args.budget}), widths "
          f"{report.histogram}, loss {loss.item():.3f}")

    # A mini-batch: the same nodes keep their widths through their global ids.
    batch = torch.arange(0, n, 2)
    sub_edges, _ = subgraph(batch, edge_index, relabel_nodes=True, num_nodes=n)
    out = gm(x[batch], sub_edges, node_ids=batch)
    print(f"a batch of {batch.numel()} nodes: output {tuple(out.shape)}")


if __name__ == "__main__":
    main()
