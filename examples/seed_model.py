"""The seed report's model, for `python -m fxquant lint examples/seed_model.py:seed`.

The bit-plane helpers live in benchmarks/seed_bitplanes.py (they are also the speed
baseline); this file builds the model and a small random graph to run it on.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch_geometric.data import Data

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from seed_bitplanes import SeedGCN


def seed() -> tuple[SeedGCN, tuple[Data]]:
    """(model, example inputs): a 2-layer GCN with bit-plane round trips, on 20 nodes."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(20, 8, generator=g)
    edge_index = torch.randint(0, 20, (2, 60), generator=g)
    return SeedGCN(in_channels=8, hidden=16, out_channels=3), (Data(x=x, edge_index=edge_index),)
