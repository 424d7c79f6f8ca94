"""Find and fix an in-place bug that breaks backward, without touching the model's code.

The model gates a GCN layer's output with a sigmoid and zeroes the rows of isolated nodes
in place. Backward then fails with "modified by an inplace operation": the sigmoid saved
its output for its backward, and the masked write changed it. ``fxquant.lint`` names the
line that wrote (anomaly mode names the sigmoid, the victim); ``fxquant.functionalize_inplace``
returns the same forward without in-place writes, verified against the original.

Run:  python examples/fix_inplace.py
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch_geometric.nn import GCNConv
from torch_geometric.utils import degree

import fxquant


class GatedGCN(torch.nn.Module):
    def __init__(self, in_channels: int, hidden: int, out_channels: int) -> None:
        super().__init__()
        self.conv1 = GCNConv(in_channels, hidden)
        self.conv2 = GCNConv(hidden, out_channels)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        h = torch.sigmoid(self.conv1(x, edge_index))
        isolated = degree(edge_index[1], x.size(0)) == 0
        h[isolated] = 0.0  # the bug: sigmoid saved h for its backward
        return self.conv2(h, edge_index)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    torch.manual_seed(0)
    x, y = torch.randn(30, 8), torch.randint(0, 3, (30,))
    edge_index = torch.randint(0, 25, (2, 80))  # nodes 25..29 have no edges
    model = GatedGCN(8, 16, 3)

    try:
        F.cross_entropy(model(x, edge_index), y).backward()
    except RuntimeError as e:
        print("plain backward:", str(e).splitlines()[0][:100], "...")

    report = fxquant.lint(model, x, edge_index)  # runs one forward, recorded
    print(report)
    error = report.errors[0]
    print(f"\nculprit: {error.where} (the write), saved by {error.related}\n")

    fixed = fxquant.functionalize_inplace(model, x, edge_index)  # verified before returned
    for rewrite in fixed.meta["fxquant_rewrites"]:
        print(f"rewrote {rewrite.before} -> {rewrite.after}")

    optimizer = torch.optim.Adam(fixed.parameters(), lr=0.01)
    for _ in range(args.steps):
        optimizer.zero_grad()
        loss = F.cross_entropy(fixed(x, edge_index), y)
        loss.backward()
        optimizer.step()
    print(f"trained {args.steps} steps on the fixed model: loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
