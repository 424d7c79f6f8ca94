"""The faithful Degree-Quant recipe under DistributedDataParallel: two gloo ranks on one
machine, each with its own batch and its own protective masks (one per layer and
forward), agree on every widening range and every weight after training."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel
from torch_geometric.nn.models import GCN

import fxquant
from tests.support.models import tiny_graph

WORLD = 2
SCALE = 10.0  # rank r's features are the shared ones times 1 + (SCALE - 1) * r


def _rank(rank: int, init_file: str, out: str, sync: bool) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=WORLD)
    try:
        data = tiny_graph(num_nodes=30, in_channels=4, seed=3)
        torch.manual_seed(0)  # the same model on every rank
        gm = fxquant.recipes.DegreeQuant(bits=8, protect=(0.1, 0.5)).prepare(
            GCN(4, 8, num_layers=2, out_channels=3), data, lint="off").model
        # no buffer sync at forward: the ranges must agree by their own synchronization,
        # not because DDP copies rank 0's buffers over the others at each forward
        model = DistributedDataParallel(gm, forward_sync_buffers=False)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.manual_seed(100 + rank)  # each rank draws its own masks
        x = data.x * (1 + (SCALE - 1) * rank)
        if not sync:  # the check of the check: a rank that trains alone
            dist.destroy_process_group()
            model = gm
        for _ in range(3):
            optimizer.zero_grad()
            model(x, data.edge_index).square().mean().backward()
            optimizer.step()
        torch.save({"state": gm.state_dict(), "x": x}, Path(out) / f"rank{rank}.pt")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    # The results are saved: leave without tearing the interpreter down. Freeing the DDP
    # reducer (which still holds the gloo group) joins gloo's worker thread while holding
    # the GIL, and that thread may be waiting for the GIL to free a finished work item: a
    # deadlock inside torch, seen once in CI as a rank that never exits.
    os._exit(0)


def _train(tmp_path: Path, sync: bool = True) -> list[dict]:
    init = str(tmp_path / "group")  # a file the process group creates
    mp.spawn(_rank, args=(init, str(tmp_path), sync), nprocs=WORLD, join=True)
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]


def _input_range(state: dict[str, torch.Tensor]) -> torch.Tensor:
    return state["convs_0_input_quant.observer.running"]


@pytest.mark.slow
def test_ranks_agree_on_widening_ranges_and_weights(tmp_path):
    ranks = _train(tmp_path)
    first, second = ranks[0]["state"], ranks[1]["state"]
    assert first.keys() == second.keys()
    ranges = [k for k in first if k.endswith("running")]
    assert len(ranges) >= 10  # seven tensors per layer have a range (the weights too)
    for key in first:
        assert torch.equal(first[key], second[key]), key
    # the input's range covers both ranks' batches: wider than rank 0's own values,
    # narrower than rank 1's (ten times larger) alone
    low, high = _input_range(first).tolist()
    x0, x1 = ranks[0]["x"], ranks[1]["x"]
    assert x0.max() < high < x1.max() and x1.min() < low < x0.min()


@pytest.mark.slow
def test_without_the_process_group_the_ranks_differ(tmp_path):
    """The test above can fail: ranks that do not synchronize end with different ranges."""
    ranks = _train(tmp_path, sync=False)
    assert not torch.equal(_input_range(ranks[0]["state"]), _input_range(ranks[1]["state"]))


if os.name == "nt":  # pragma: no cover - file:// init is POSIX-only here
    pytestmark = pytest.mark.skip("gloo file init")
