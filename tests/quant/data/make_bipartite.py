"""How ``sage-bipartite-0.9.8.pt`` and its ``-expected.pt`` were made (with fxquant 0.9.8,
whose input point of a ``(source, target)`` pair rounded both parts; kept for the record,
never run by the tests): ``python tests/quant/data/make_bipartite.py <folder>``.

A bipartite SAGEConv (4 source features, 3 target features) with a learned step at its
input site and a running range at its output, trained for a few steps; ``-expected.pt``
holds the inputs and the output the saved model gave in evaluation.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn
from torch_geometric.nn import SAGEConv

import fxquant


class Bipartite(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = SAGEConv((4, 3), 8)

    def forward(self, x_src, x_dst, edge_index):
        return self.conv((x_src, x_dst), edge_index)


def inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x_src, x_dst = torch.randn(9, 4, generator=g) * 3, torch.randn(6, 3, generator=g)
    edge_index = torch.stack([torch.randint(0, 9, (20,), generator=g),
                              torch.randint(0, 6, (20,), generator=g)])
    return x_src, x_dst, edge_index


def make(folder: Path) -> None:
    torch.manual_seed(0)
    mapping = (fxquant.QuantMapping()
               .set_name("conv", fxquant.QuantConfig("int4", scale="tensor", range="lsq"),
                         site="input")
               .set_name("conv", fxquant.QuantConfig("int8", scale="tensor", momentum=0.5)))
    gm = fxquant.transform(Bipartite(), mapping, lint="off")
    opt = torch.optim.Adam(gm.parameters(), lr=0.01)
    args = inputs()
    for _ in range(3):
        opt.zero_grad()
        gm(*args).square().mean().backward()
        opt.step()
    gm.eval()
    fxquant.save(gm, folder / "sage-bipartite-0.9.8.pt")
    with torch.no_grad():
        torch.save({"inputs": args, "eval": gm(*args)},
                   folder / "sage-bipartite-0.9.8-expected.pt")


if __name__ == "__main__":
    make(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)
