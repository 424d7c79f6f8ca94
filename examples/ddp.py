"""Train a transformed GNN on two processes with DistributedDataParallel.

Each process trains on its own half of the labelled nodes; DDP averages the gradients, and
fxquant all-reduces the running ranges of the quantization points in training (as
``SyncBatchNorm`` does its statistics), so both processes end with the same parameters
and the same ranges. Launches its own two CPU processes (gloo on 127.0.0.1); under
``torchrun`` use ``examples/train_ddp.py``.

Needs no data (a random graph). Run:  python examples/ddp.py
"""

from __future__ import annotations

import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch_geometric.nn import GCNConv

import fxquant


class GCN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = GCNConv(16, 32), GCNConv(32, 4)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


def worker(rank: int, world: int, port: int, steps: int, results: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        g = torch.Generator().manual_seed(0)  # the same graph and model on every rank
        y = torch.randint(0, 4, (400,), generator=g)
        x = F.one_hot(y, 16).float() + torch.randn(400, 16, generator=g)
        edge_index = torch.randint(0, 400, (2, 2000), generator=g)
        torch.manual_seed(0)
        gm = fxquant.transform(GCN(), format="int8", scale="tensor", decay=0.9)
        model = DistributedDataParallel(gm)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        mine = torch.arange(rank, 400, world)  # this rank's labelled nodes
        for _ in range(steps):
            optimizer.zero_grad()
            out = model(x * (1 + rank), edge_index)  # each rank sees other scales
            F.cross_entropy(out[mine], y[mine]).backward()
            optimizer.step()
        ranges = {name: float(p.observer.running.max()) for name, p in
                  fxquant.quantization_points(gm)}
        results[rank] = (ranges, float(gm.conv1.lin.weight.detach().sum()))
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    with socket.socket() as s:  # a free port on loopback
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(worker, args=(2, port, args.steps, results), nprocs=2, join=True)
        for rank in sorted(results.keys()):
            ranges, weights = results[rank]
            print(f"rank {rank}: conv1 weight sum {weights:+.6f}, running ranges "
                  + ", ".join(f"{k} {v:.3f}" for k, v in ranges.items()))
        same = results[0] == results[1]
    print("both ranks hold the same parameters and ranges:", same)


if __name__ == "__main__":
    main()
