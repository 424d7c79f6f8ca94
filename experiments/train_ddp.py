"""Train a transformed GNN on several processes with DistributedDataParallel (torchrun).

Launch (gloo on CPU, nccl on CUDA; one process per GPU)::

    torchrun --nproc-per-node 2 -m experiments.train_ddp --dataset Cora --format int8 --sites all

and across machines, the same script with torchrun's rendezvous (each machine runs this,
``--node-rank`` 0..N-1; tested here on loopback only)::

    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d \\
        --rdzv-endpoint HOST:29400 --rdzv-id job1 -m experiments.train_ddp ...

What each rank does, per step: the epoch's shuffled training nodes are cut into global
batches of ``--batch-size x world`` seed nodes (the same permutation on every rank, from
``--seed``); rank ``r`` takes seeds ``r::world`` of each global batch and samples their
2-hop neighbourhood (``--loader khop``: PyG's ``k_hop_subgraph``, no extension needed; or
``--loader neighbor``: ``NeighborLoader``, which needs torch-sparse or pyg-lib). The
transformed model gets the batch's global node ids (``node_ids=batch.n_id``), so per-node
settings follow the nodes; running ranges are synchronized across ranks in training (see
:mod:`fxquant.quant.observers`), and DDP averages the gradients. Stochastic rounding and
dropout draw from a per-rank stream seeded with ``seed * 1000 + rank`` (reproducible from
``--seed``; different on each rank by design), after the model is built from ``--seed`` on
every rank.

Only rank 0 shows a progress bar, writes ``--json`` and the checkpoint (``--checkpoint``,
with :func:`fxquant.save`); metrics are averaged over ranks. ``--emulate-world N`` (one
process) runs the same N rank-batches of each step as one disjoint union with the same loss:
what DDP computes, on one process; the tests compare the two.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch_geometric.data import Batch, Data
from torch_geometric.utils import k_hop_subgraph
from tqdm import tqdm

import fxquant
from experiments import cli, training
from experiments.training import GCN
from fxquant.datasets import PLANETOID_NAMES

SITES = training.SITES
SCALES = ("tensor", "tensor-pow2", "row", "row-pow2", "block32", "none")

EXTENSION_HINT = ("--loader neighbor needs PyG's neighbour sampler: pip install --no-build-isolation "
                  "torch-scatter torch-sparse (or pip install fxquant[scale]), or use --loader khop")


def _momentum(text: str) -> float | None:
    return None if text.strip().lower() == "none" else cli.fraction_arg(text)


def _dropout(text: str) -> float:
    return cli.fraction_arg(text)


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def config_settings(args: argparse.Namespace) -> list[tuple[str, str, Any]]:
    """Every site's config settings, each with its flag: a format's ``--scale`` and
    ``--momentum`` (kept bits have neither), and ``--rounding``."""
    formatted = isinstance(args.format, str)
    return [("--scale", "scale", args.scale if formatted else None),
            ("--momentum", "decay", args.momentum if formatted else None),
            ("--rounding", "rounding", args.rounding)]


def build_config(args: argparse.Namespace) -> fxquant.QuantConfig:
    """Every site's config: kept bits, or a format with ``--scale`` and ``--momentum``."""
    return fxquant.QuantConfig(args.format, **{k: v for _, k, v in config_settings(args)})


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--dataset", default="Cora", choices=list(PLANETOID_NAMES))
    p.add_argument("--root", default=None, help="Planetoid data (default: FXQUANT_DATA)")
    p.add_argument("--format", type=cli.number_arg, default="int8",
                   help="kept bits or a format for every site (default int8)")
    p.add_argument("--scale", default="tensor", choices=SCALES,
                   help="scaling for formats (default tensor)")
    p.add_argument("--momentum", type=_momentum, default=0.1,
                   help="running per-tensor range (synchronized across ranks), or 'none' for "
                        "the current batch's range; --scale row/block32 need 'none' "
                        "(default 0.1)")
    p.add_argument("--rounding", default="nearest", choices=["nearest", "stochastic", "toward_zero"])
    p.add_argument("--sites", type=cli.sites_arg, default=["output"],
                   help=f"comma list of {SITES} or all (default output)")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32, help="seed nodes per rank and step")
    p.add_argument("--loader", choices=["khop", "neighbor"], default="khop")
    p.add_argument("--num-neighbors", default="10,10",
                   help="neighbours sampled per hop with --loader neighbor (-1: every one); "
                        "--loader khop takes every neighbour within as many hops "
                        "(--num-neighbors=-1,-1,-1 for 3; default 10,10)")
    p.add_argument("--dropout", type=_dropout, default=0.5, help="(default 0.5)")
    p.add_argument("--lr", type=_positive, default=0.01, help="Adam's learning rate (default 0.01)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compile", action="store_true", help="torch.compile the model under DDP")
    p.add_argument("--emulate-world", type=int, default=1, metavar="N",
                   help="one process doing what N DDP ranks do per step (for comparisons)")
    p.add_argument("--json", default=None, metavar="PATH", help="rank 0 writes results here")
    p.add_argument("--checkpoint", default=None, metavar="PATH", help="rank 0 saves the model")
    p.add_argument("--dump-state", default=None, metavar="DIR",
                   help="every rank writes its state_dict to DIR/rank{r}.pt (for tests)")
    args = p.parse_args(argv)
    cli.refuse_counts(p, args, "epochs", "batch_size", "emulate_world")
    if args.emulate_world > 1 and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        p.error(f"--emulate-world {args.emulate_world} emulates ranks on one process; under "
                f"torchrun (WORLD_SIZE={os.environ['WORLD_SIZE']}) each rank would do every "
                "emulated rank's work. Please drop it, or run without torchrun")
    formatted = isinstance(args.format, str)
    defaults = p.parse_args([])
    if not formatted:
        given = [flag for flag, name in (("--scale", "scale"), ("--momentum", "momentum"))
                 if getattr(args, name) != getattr(defaults, name)]
        if given:
            p.error(f"{', '.join(given)} with --format {args.format}: kept bits (top-N "
                    "truncation) have no scale or range, so these would be ignored; please "
                    "drop them or give a format (e.g. int8, e4m3)")
    cli.config_from_flags(p, ("--format", args.format), *config_settings(args))
    try:
        args.num_neighbors = [int(n) for n in args.num_neighbors.split(",")]
    except ValueError:
        p.error(f"--num-neighbors must be comma-separated ints, got {args.num_neighbors!r}")
    if not args.num_neighbors or any(n < 1 and n != -1 for n in args.num_neighbors):
        p.error(f"--num-neighbors: a count per hop, >= 1 or -1 (every neighbour), got "
                f"{args.num_neighbors}")
    default_counts = [int(n) for n in defaults.num_neighbors.split(",")]
    if args.loader == "khop" and args.num_neighbors != default_counts \
            and any(n != -1 for n in args.num_neighbors):
        hops = ",".join(["-1"] * len(args.num_neighbors))
        p.error(f"--num-neighbors {','.join(map(str, args.num_neighbors))} with --loader khop: "
                "khop takes every neighbour within as many hops as counts are given, so the "
                f"counts would be ignored; please pass --num-neighbors={hops} or --loader "
                "neighbor")
    cli.refuse_unwritable(p, args, "--json", "--checkpoint")
    if args.dump_state and os.path.exists(args.dump_state) and not os.path.isdir(args.dump_state):
        p.error(f"--dump-state {args.dump_state}: a file, not a folder")
    if args.loader == "neighbor":
        try:
            import torch_sparse  # noqa: F401
        except ImportError:
            try:
                import pyg_lib  # noqa: F401
            except ImportError:
                p.error(EXTENSION_HINT)
    return args


def setup() -> tuple[int, int, torch.device]:
    """Join torchrun's process group (or run alone); rank, world size, device."""
    if "RANK" not in os.environ:
        return 0, 1, torch.device("cpu")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local)
        return rank, world, torch.device("cuda", local)
    return rank, world, torch.device("cpu")


def build(args: argparse.Namespace, data: Data, num_classes: int) -> torch.fx.GraphModule:
    """The transformed model, identical on every rank (built from ``--seed``)."""
    torch.manual_seed(args.seed)
    model = GCN(data.num_features, 16, num_classes, dropout=args.dropout, cached=False)
    config = build_config(args)
    mapping = fxquant.QuantMapping()
    for site in args.sites:
        mapping.set_global(config, site=site)
    return fxquant.transform(model, mapping)


def global_batches(train_idx: torch.Tensor, per_step: int, epoch: int, seed: int) -> list[torch.Tensor]:
    """The epoch's seed nodes in global batches (the same on every rank)."""
    g = torch.Generator().manual_seed(seed * 7919 + epoch)
    order = train_idx[torch.randperm(train_idx.numel(), generator=g)]
    return [order[i:i + per_step] for i in range(0, order.numel(), per_step)]


def sample(data: Data, seeds: torch.Tensor, args: argparse.Namespace) -> Data:
    """The seeds' neighbourhood as a batch: seeds first, ``n_id`` the global node ids."""
    if args.loader == "neighbor":
        from torch_geometric.loader import NeighborLoader

        loader = NeighborLoader(data, num_neighbors=args.num_neighbors, input_nodes=seeds,
                                batch_size=seeds.numel(), shuffle=False)
        batch = next(iter(loader))
        return Data(x=batch.x, edge_index=batch.edge_index, y=batch.y, n_id=batch.n_id,
                    seeds=torch.tensor(batch.batch_size))
    subset, edge_index, _, _ = k_hop_subgraph(seeds, len(args.num_neighbors), data.edge_index,
                                              relabel_nodes=False, num_nodes=data.num_nodes)
    rest = subset[~torch.isin(subset, seeds)]
    n_id = torch.cat([seeds, rest])
    position = torch.full((data.num_nodes,), -1, dtype=torch.long)
    position[n_id] = torch.arange(n_id.numel())
    return Data(x=data.x[n_id], edge_index=position[edge_index], y=data.y[n_id], n_id=n_id,
                seeds=torch.tensor(seeds.numel()))


def step_batch(data: Data, step_seeds: torch.Tensor, rank: int, world: int,
               args: argparse.Namespace) -> tuple[Data, list[tuple[int, int]]]:
    """This rank's batch of one global step, and the (offset, count) of each part's seed
    rows: one part under DDP, ``--emulate-world`` parts as one disjoint union."""
    if args.emulate_world > 1:
        parts = [sample(data, step_seeds[r::args.emulate_world], args)
                 for r in range(args.emulate_world)]
    else:
        parts = [sample(data, step_seeds[rank::world], args)]
    spans, offset = [], 0
    for part in parts:
        spans.append((offset, int(part.seeds)))
        offset += part.num_nodes
    batch = parts[0] if len(parts) == 1 else Batch.from_data_list(parts)
    return batch, spans


def evaluate(model: torch.nn.Module, data: Data) -> dict[str, float]:
    model.eval()
    with torch.no_grad():
        pred = model(data.x, data.edge_index).argmax(-1)
    return {name: float((pred[mask] == data.y[mask]).float().mean())
            for name, mask in (("val", data.val_mask), ("test", data.test_mask))}


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    rank, world, device = setup()
    try:
        return run(args, rank, world, device)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run(args: argparse.Namespace, rank: int, world: int, device: torch.device) -> dict:
    data, num_classes = training.load_data(args.dataset, args.root, "train_ddp.py")
    gm = build(args, data, num_classes).to(device)
    model: Callable[..., torch.Tensor] = gm
    if world > 1:
        model = DistributedDataParallel(gm, device_ids=[device.index] if device.type == "cuda"
                                        else None)
    if args.compile:
        model = torch.compile(model, dynamic=True)
    torch.manual_seed(args.seed * 1000 + rank)  # per-rank stream: dropout, stochastic rounding
    optimizer = torch.optim.Adam(gm.parameters(), lr=args.lr, weight_decay=5e-4)
    train_idx = data.train_mask.nonzero().view(-1)
    per_step = args.batch_size * (world if world > 1 else args.emulate_world)
    history = []
    bar = tqdm(range(args.epochs), desc=f"{args.dataset} x{world}", disable=rank != 0,
               file=sys.stderr, dynamic_ncols=True)
    for epoch in bar:
        gm.train()
        total = torch.zeros(2, device=device)
        for step_seeds in global_batches(train_idx, per_step, epoch, args.seed):
            batch, spans = step_batch(data, step_seeds, rank, world, args)
            batch = batch.to(device)
            optimizer.zero_grad()
            out = model(batch.x, batch.edge_index, node_ids=batch.n_id)
            losses = [F.cross_entropy(out[o:o + n], batch.y[o:o + n]) for o, n in spans]
            loss = torch.stack(losses).mean()
            loss.backward()
            optimizer.step()
            total += torch.stack([loss.detach(), torch.ones((), device=device)])
        if world > 1:
            dist.all_reduce(total)
        metrics = {"epoch": epoch, "loss": float(total[0] / total[1]), **evaluate(gm, data.to(device))}
        if world > 1:
            both = torch.tensor([metrics["val"], metrics["test"]], device=device)
            dist.all_reduce(both)
            metrics["val"], metrics["test"] = (both / world).tolist()
        history.append(metrics)
        bar.set_postfix(loss=f"{metrics['loss']:.3f}", val=f"{metrics['val']:.3f}")
    if args.dump_state:
        os.makedirs(args.dump_state, exist_ok=True)
        torch.save({k: v.detach().cpu() for k, v in gm.state_dict().items()},
                   os.path.join(args.dump_state, f"rank{rank}.pt"))
    result = {"args": {k: v for k, v in vars(args).items()}, "world": world,
              "backend": dist.get_backend() if dist.is_initialized() else None,
              "history": history, "final": history[-1]}
    if rank == 0:
        if args.checkpoint:
            fxquant.save(gm, args.checkpoint)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        print(f"final: loss {history[-1]['loss']:.4f} val {history[-1]['val']:.3f} "
              f"test {history[-1]['test']:.3f} ({world} process(es))")
    return result


if __name__ == "__main__":
    main()
