"""Train PyG's GCN on Cora with a named fxquant recipe: per-node bit-widths at 2 bits.

The recipe ``hub-messages`` rounds every activation of both layers to 2-bit integers with
a learned step, and the messages into the 10% best-connected nodes to 1 bit; training
anneals the widths from 2 bits above and reports the best validation epoch within the
budget. The loop is PyG's ``examples/gcn.py`` plus four calls to the recipe's run (a recipe
that distills first trains its float32 teacher, the same model, with the same loop). Run
(data: ``FXQUANT_DATA`` pointing at a folder with ``Cora/raw/ind.cora.*``):

    python examples/cora_recipe.py --recipe hub-messages --epochs 200"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
import torch_geometric.transforms as T
from torch_geometric.nn import GCNConv

import fxquant
from fxquant.datasets import load_planetoid
from fxquant.recipes import QuantTraining


class GCN(torch.nn.Module):
    def __init__(self, in_channels: int, hidden: int, out_channels: int) -> None:
        super().__init__()
        self.conv1 = GCNConv(in_channels, hidden, cached=True)
        self.conv2 = GCNConv(hidden, out_channels, cached=True)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = F.dropout(x, p=0.5, training=self.training)
        x = self.conv1(x, edge_index).relu()
        x = F.dropout(x, p=0.5, training=self.training)
        return self.conv2(x, edge_index)


def train(run: QuantTraining, data, epochs: int) -> torch.Tensor | None:
    """PyG's gcn.py loop around a recipe's run; the logits of the epoch it reports."""
    decayed = list(run.model.conv1.parameters())  # gcn.py: weight decay on the first layer
    rest = [p for p in run.model.parameters() if all(p is not q for q in decayed)]
    groups = [{"params": decayed, "weight_decay": 5e-4}, {"params": rest}]
    optimizer, kept = torch.optim.Adam(run.param_groups(groups), lr=0.01), None
    for epoch in range(epochs):
        run.model.train()
        run.start_epoch(epoch)
        optimizer.zero_grad()
        out = run.model(data.x, data.edge_index)
        run.loss(F.cross_entropy(out[data.train_mask], data.y[data.train_mask]),
                 output=out).backward()
        optimizer.step()
        run.model.eval()
        with torch.no_grad():
            logits = run.model(data.x, data.edge_index)
        pred = logits.argmax(-1)
        accs = [float((pred[m] == data.y[m]).float().mean()) for m in (data.val_mask, data.test_mask)]
        if run.observe(accs[0], test=accs[1]):
            kept = logits
    return kept


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--recipe", default="hub-messages", choices=fxquant.recipes.available(),
                        help="a recipe of fxquant.recipes (default hub-messages)")
    parser.add_argument("--epochs", type=int, default=200, help="(default 200)")
    parser.add_argument("--seed", type=int, default=0, help="(default 0)")
    parser.add_argument("--root", default=None, help="data folder (default $FXQUANT_DATA)")
    args = parser.parse_args(argv)
    if args.epochs < 1:
        parser.error(f"--epochs must be >= 1, got {args.epochs}")
    if not 0 <= args.seed < 2**63:
        parser.error(f"--seed must lie in 0..2**63 - 1, got {args.seed}")

    try:
        data = load_planetoid("Cora", args.root, transform=T.NormalizeFeatures())[0]
    except (FileNotFoundError, ValueError) as e:  # (no raw files there, and no download)
        parser.error(f"--root / FXQUANT_DATA: {e}")
    recipe, teacher = fxquant.recipes.get(args.recipe), None
    if getattr(recipe, "distill", 0):  # it learns from the same model trained in float32
        torch.manual_seed(args.seed)
        teacher = train(QuantTraining(GCN(data.num_features, 16, 7)), data, args.epochs)
    torch.manual_seed(args.seed)
    run = recipe.prepare(GCN(data.num_features, 16, 7), data)
    if teacher is not None:
        run.set_teacher(teacher)
    print(fxquant.summary(run.model, data.x, data.edge_index))
    train(run, data, args.epochs)
    best = run.best
    assert best is not None, "no epoch scored above 0"
    bits = best.bits.avg_bits if best.bits is not None else float("nan")
    print(f"{args.recipe}: test accuracy {100 * best.metrics['test']:.1f}% at epoch {best.epoch} "
          f"(validation {100 * best.val:.1f}%), {bits:.2f} bits per value"
          + ("" if best.within_budget else " (no epoch met the budget)"))
    return best.metrics["test"]


if __name__ == "__main__":
    main()
