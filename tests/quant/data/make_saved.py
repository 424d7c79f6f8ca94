"""How the files in this folder were made (with fxquant 0.9.8; kept for the record, never
run by the tests): ``python tests/quant/data/make_saved.py``.

Each ``gcn-<version>-<kind>.pt`` is what ``fxquant.save`` wrote for a trained 2-layer GCN
with learned steps, learned and fixed per-node bit-widths, a node override, a running
range and Degree-Quant protection (``-shared``: one bit-width table shared by two
points; ``-pickled``: that model pickled by ``torch.save(gm)``); ``-expected.pt`` holds
the inputs and the outputs the saved model gave (in evaluation, and in one training
forward under a fixed seed), which ``tests/quant/test_saved_files.py`` compares a model
loaded from the file against.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch_geometric.nn.models import GCN

import fxquant
from fxquant.quant.config import NodeBits

NUM_NODES, IN, HIDDEN, OUT = 12, 8, 16, 3


def graph() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    src = torch.randint(0, NUM_NODES, (40,), generator=g)
    dst = torch.randint(0, NUM_NODES, (40,), generator=g)
    edge_index = torch.stack([torch.cat([src, dst]), torch.cat([dst, src])])
    x = torch.randn(NUM_NODES, IN, generator=g)
    y = torch.randint(0, OUT, (NUM_NODES,), generator=g)
    return x, edge_index, y


def model() -> GCN:
    return GCN(IN, HIDDEN, num_layers=2, out_channels=OUT)


def mapping(edge_index: torch.Tensor) -> fxquant.QuantMapping:
    lsq_bits = fxquant.QuantConfig("int4", scale="tensor", range="lsq",
                                   node_bits=NodeBits.learned_init(NUM_NODES, 4.0))
    return (fxquant.QuantMapping()
            .set_global(lsq_bits)
            .set_global(fxquant.QuantConfig("int8", scale="tensor", momentum=0.9,
                                            protect=(0.0, 0.5)), site="message")
            .set_name("convs.1", fxquant.QuantConfig(
                "int4", scale="tensor", range="lsq",
                protect=fxquant.Protection(0.0, 0.3)), site="input")
            .set_nodes("convs.1", [0, 3], "int8", site="input")
            .set_name("convs.1", fxquant.QuantConfig(
                "int8", scale="tensor",
                node_bits=NodeBits.by_degree(edge_index, NUM_NODES, [0.7], [4, 6])),
                site="aggregate"))


def make(folder: Path, kind: str) -> None:
    torch.manual_seed(0)
    x, edge_index, y = graph()
    gm = fxquant.transform(model(), mapping(edge_index))
    if kind == "shared":
        fxquant.share_bits(gm, "convs_1_quant", "convs_0_quant")
    optimizer = torch.optim.Adam(gm.parameters(), lr=0.05)
    for _ in range(6):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(gm(x, edge_index), y)
        (loss + 0.1 * fxquant.bit_penalty(gm, 3.0)).backward()
        optimizer.step()
    name = f"gcn-{fxquant.__version__}-{kind}"
    fxquant.save(gm, folder / f"{name}.pt")
    if kind == "shared":  # the pickled GraphModule too (torch.load(weights_only=False))
        torch.save(gm, folder / f"{name}-pickled.pt")
    with torch.no_grad():
        evaluated = gm.eval()(x, edge_index)
        torch.manual_seed(7)
        trained = gm.train()(x, edge_index)
    torch.save({"x": x, "edge_index": edge_index, "eval": evaluated, "train": trained,
                "seed": 7}, folder / f"{name}-expected.pt")


if __name__ == "__main__":
    here = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent)
    for kind in ("plain", "shared"):
        make(here, kind)
