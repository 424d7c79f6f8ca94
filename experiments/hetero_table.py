"""Heterogeneous and graph-level GNNs at FP32, every-site INT8 and INT4 (LSQ + protection),
on planted graphs anyone can rebuild offline (:mod:`fxquant.planted`).

Models: ``to_hetero(GraphSAGE)`` and a ``HeteroConv`` of ``SAGEConv`` layers (both taking
dicts: ``x_dict``, ``edge_index_dict``) and an ``RGCNConv`` network on the same graph made
homogeneous (paper classification on :func:`fxquant.planted.planted_hetero`), and GIN with
sum pooling and a linear head (graph classification on
:func:`fxquant.planted.planted_motifs`, mini-batches of graphs).

Rows: FP32 | INT8 at every site (each message-passing layer's input, weights, messages,
aggregation and output; for GIN the pooling and the head too; a per-tensor scale from
each batch's min/max) | INT4 at every site with a learned step and Degree-Quant's
protection ``(0, 0.2)`` (:class:`fxquant.recipes.LsqProtect`; its ``refit_epochs``, 0 or
5, chosen per model by the mean validation accuracy over the seeds: fitting the steps
again while activations grow, as a graph classifier's sum-pooled logits do). Every row of
one seed starts from the same weights (paired seeds); each run reports its test accuracy
at its best validation epoch. Every choice is made on validation data; the other
settings (:class:`Settings`) were fixed from FP32 pilot runs' validation accuracy.

Run (one thread):

    OMP_NUM_THREADS=1 python -m experiments.hetero_table --seeds 5 \\
        --json docs/results/hetero_planted.json
    python -m experiments.hetero_table --from-json docs/results/hetero_planted.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
import torch_geometric
from torch import Tensor, nn
from torch_geometric.loader import DataLoader
from torch_geometric.nn import HeteroConv, RGCNConv, SAGEConv, global_add_pool, to_hetero
from torch_geometric.nn.models import GIN

import fxquant
from experiments import cli
from experiments.stats import paired
from fxquant.planted import planted_hetero, planted_motifs

MODELS = ("to_hetero", "heteroconv", "rgcn", "gin")
CONFIGS = {"fp32": "FP32", "int8": "INT8, every site",
           "int4-lsq-p": "INT4 LSQ + protection, every site"}
#: the sites "every site" rounds (Degree-Quant's five)
SITES = ("input", "weight", "message", "aggregate", "output")
#: the INT4 row's ``refit_epochs`` candidates, chosen per model on validation accuracy
REFIT_CANDIDATES = (0, 5)


@dataclass(frozen=True)
class Settings:
    """What every run of one table uses (fixed before any run)."""

    papers: int = 2000
    authors: int = 800
    fields: int = 40
    graphs: int = 1000
    hidden: int = 64
    node_epochs: int = 150
    graph_epochs: int = 60
    lr: float = 0.01
    weight_decay: float = 5e-4
    batch_size: int = 32
    dropout: float = 0.5
    protect: tuple[float, float] = (0.0, 0.2)
    data_seed: int = 0

    @classmethod
    def quick(cls) -> Settings:
        """Tiny sizes for a smoke run (seconds, not results)."""
        return cls(papers=120, authors=50, fields=8, graphs=40, hidden=8, node_epochs=3,
                   graph_epochs=2)


# -- models ---------------------------------------------------------------------------------


class Sage(nn.Module):
    """Two SAGEConv layers, made heterogeneous by ``to_hetero``."""

    def __init__(self, hidden: int, out: int, dropout: float):
        super().__init__()
        self.conv1 = SAGEConv((-1, -1), hidden)
        self.conv2 = SAGEConv((-1, -1), out)
        # a module: to_hetero's own trace would freeze F.dropout's training flag
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.conv2(self.dropout(self.conv1(x, edge_index).relu()), edge_index)


class Hetero(nn.Module):
    """Two ``HeteroConv`` layers of ``SAGEConv`` per edge type, on dicts."""

    def __init__(self, edge_types: Sequence[tuple[str, str, str]], hidden: int, out: int,
                 dropout: float):
        super().__init__()
        self.conv1 = HeteroConv({et: SAGEConv((-1, -1), hidden) for et in edge_types})
        self.conv2 = HeteroConv({et: SAGEConv((-1, -1), out) for et in edge_types})
        self.dropout = dropout

    def forward(self, x_dict: dict[str, Tensor], edge_index_dict: dict[Any, Tensor]) -> Tensor:
        x_dict = self.conv1(x_dict, edge_index_dict)
        x_dict = {k: F.dropout(v.relu(), self.dropout, self.training) for k, v in x_dict.items()}
        return self.conv2(x_dict, edge_index_dict)["paper"]


class RGCN(nn.Module):
    """Two ``RGCNConv`` layers over the graph made homogeneous (features zero-padded to
    one width), one relation per edge type."""

    def __init__(self, channels: int, relations: int, hidden: int, out: int, dropout: float):
        super().__init__()
        self.conv1 = RGCNConv(channels, hidden, relations)
        self.conv2 = RGCNConv(hidden, out, relations)
        self.dropout = dropout

    def forward(self, x: Tensor, edge_index: Tensor, edge_type: Tensor) -> Tensor:
        x = F.dropout(self.conv1(x, edge_index, edge_type).relu(), self.dropout, self.training)
        return self.conv2(x, edge_index, edge_type)


class GraphClassifier(nn.Module):
    """PyG's GIN (batch normalization in its MLPs), sum pooling per graph and a linear
    head."""

    def __init__(self, channels: int, hidden: int, classes: int):
        super().__init__()
        self.gnn = GIN(channels, hidden, num_layers=3, norm="batch_norm")
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: Tensor, edge_index: Tensor, batch: Tensor) -> Tensor:
        return self.head(global_add_pool(self.gnn(x, edge_index), batch))


# -- one run --------------------------------------------------------------------------------


@dataclass
class Task:
    """A model builder, its inputs and how a run trains and scores it."""

    build: Callable[[], nn.Module]
    example: tuple[Any, ...] | None  # for models that take dicts
    node_level: bool
    data: Any = None
    loaders: dict[str, Any] = field(default_factory=dict)


def homogeneous(data: Any) -> tuple[Tensor, Tensor, Tensor, slice]:
    """The heterogeneous graph as one node set (features zero-padded to the widest type),
    its edges with a relation id per edge type, and the rows of the papers."""
    width = max(data[t].x.shape[1] for t in data.node_types)
    offsets, xs, start = {}, [], 0
    for t in data.node_types:
        x = data[t].x
        xs.append(F.pad(x, (0, width - x.shape[1])))
        offsets[t] = start
        start += x.shape[0]
    edges, kinds = [], []
    for r, (src, rel, dst) in enumerate(data.edge_types):
        ei = data[src, rel, dst].edge_index
        edges.append(torch.stack([ei[0] + offsets[src], ei[1] + offsets[dst]]))
        kinds.append(torch.full((ei.shape[1],), r, dtype=torch.long))
    papers = slice(offsets["paper"], offsets["paper"] + data["paper"].num_nodes)
    return torch.cat(xs), torch.cat(edges, 1), torch.cat(kinds), papers


def tasks(s: Settings) -> dict[str, Task]:
    data = planted_hetero(s.papers, s.authors, s.fields, seed=s.data_seed)
    classes = int(data["paper"].y.max()) + 1
    example = (data.x_dict, data.edge_index_dict)
    x, edge_index, edge_type, papers = homogeneous(data)

    def sage() -> nn.Module:
        model = to_hetero(Sage(s.hidden, classes, s.dropout), data.metadata(), aggr="sum")
        model(*example)  # (initialises the lazy channels)
        return model

    def hetero() -> nn.Module:
        model = Hetero(data.edge_types, s.hidden, classes, s.dropout)
        model(*example)
        return model

    motifs = planted_motifs(num_graphs=s.graphs, seed=s.data_seed)
    n = len(motifs)
    split = {"train": motifs[: int(0.6 * n)], "val": motifs[int(0.6 * n): int(0.8 * n)],
             "test": motifs[int(0.8 * n):]}
    loaders = {"train": split["train"]}
    loaders.update({k: next(iter(DataLoader(v, batch_size=len(v)))) for k, v in split.items()
                    if k != "train"})
    return {
        "to_hetero": Task(sage, example, True, data),
        "heteroconv": Task(hetero, example, True, data),
            "rgcn": Task(lambda: RGCN(x.shape[1], len(data.edge_types), s.hidden, classes,
                                  s.dropout), None, True,
                     {"inputs": (x, edge_index, edge_type), "rows": papers,
                      "paper": data["paper"]}),
        "gin": Task(lambda: GraphClassifier(motifs.num_features, s.hidden, motifs.num_classes),
                    None, False, None, loaders),
    }


def prepared(model: nn.Module, task: Task, config: str, s: Settings, refit: int = 0
             ) -> fxquant.recipes.QuantTraining:
    """The model to train for one row (traced, then rounded as the row says), in the
    :class:`fxquant.recipes.QuantTraining` the loop drives."""
    if isinstance(model, torch.fx.GraphModule):  # (to_hetero's)
        gm = model
    else:
        gm = fxquant.trace(model, example_inputs=task.example)
    if config == "fp32":
        return fxquant.recipes.QuantTraining(gm)
    if config == "int8":
        int8 = fxquant.QuantConfig("int8", scale="tensor")
        mapping = fxquant.QuantMapping()
        for site in SITES:
            mapping.set_global(int8, site=site)
        return fxquant.recipes.QuantTraining(fxquant.transform(gm, mapping, lint="off"))
    recipe = fxquant.recipes.LsqProtect(bits=4, protect=s.protect, refit_epochs=refit)
    return recipe.prepare(gm, lint="off")


def _accuracy(logits: Tensor, y: Tensor) -> float:
    return float((logits.argmax(-1) == y).float().mean()) if y.numel() else 0.0


def run(task: Task, config: str, seed: int, s: Settings, refit: int = 0) -> dict[str, Any]:
    """Train one row on one seed; test accuracy at the best validation epoch."""
    torch.manual_seed(seed)
    model = task.build()
    torch.manual_seed(seed)
    training = prepared(model, task, config, s, refit)
    gm = training.model
    optimizer = torch.optim.Adam(training.param_groups(), lr=s.lr,
                                 weight_decay=s.weight_decay if task.node_level else 0.0)
    best = (-1.0, 0.0, -1)
    epochs = s.node_epochs if task.node_level else s.graph_epochs
    for epoch in range(epochs):
        training.start_epoch(epoch)
        gm.train()
        for inputs, target in _batches(task, "train", seed, epoch, s):
            optimizer.zero_grad()
            out = _forward(gm, task, inputs)
            loss = F.cross_entropy(out[target[0]] if task.node_level else out, target[1])
            training.loss(loss).backward()
            optimizer.step()
        gm.eval()
        with torch.no_grad():
            scores = {}
            for part in ("val", "test"):
                (inputs, target), = _batches(task, part, seed, epoch, s)
                out = _forward(gm, task, inputs)
                scores[part] = _accuracy(out[target[0]] if task.node_level else out, target[1])
        if scores["val"] > best[0]:
            best = (scores["val"], scores["test"], epoch)
    return {"val": best[0], "acc": best[1], "epoch": best[2]}


def _forward(gm: nn.Module, task: Task, inputs: tuple[Any, ...]) -> Tensor:
    out = gm(*inputs)
    if isinstance(out, dict):  # to_hetero returns every node type's output
        out = out["paper"]
    return out


def _batches(task: Task, part: str, seed: int, epoch: int, s: Settings) -> list[tuple[Any, Any]]:
    """``(inputs, (rows, labels))`` for each batch of a split."""
    if task.node_level:
        if isinstance(task.data, dict):  # (the homogeneous RGCN graph)
            paper, rows = task.data["paper"], task.data["rows"]
            mask = paper[f"{part}_mask"]
            inputs = task.data["inputs"]
            out_rows = torch.arange(rows.start, rows.stop)[mask]
            return [(inputs, (out_rows, paper.y[mask]))]
        paper = task.data["paper"]
        mask = paper[f"{part}_mask"]
        return [((task.data.x_dict, task.data.edge_index_dict), (mask, paper.y[mask]))]
    if part != "train":
        b = task.loaders[part]
        return [((b.x, b.edge_index, b.batch), (None, b.y))]
    generator = torch.Generator().manual_seed(seed * 1000 + epoch)
    loader = DataLoader(task.loaders["train"], batch_size=s.batch_size, shuffle=True,
                        generator=generator)
    return [((b.x, b.edge_index, b.batch), (None, b.y)) for b in loader]


# -- the table ------------------------------------------------------------------------------


def table(payload: dict[str, Any]) -> str:
    """Markdown: test accuracy (%) mean +- std per row and model, and the paired
    difference to FP32 in points with its 95% interval."""
    models = [m for m in MODELS if m in payload["results"]]
    head = "| configuration | " + " | ".join(payload["titles"][m] for m in models) + " |"
    lines = [head, "| --- |" + " --- |" * len(models)]
    for key, name in CONFIGS.items():
        cells = []
        for m in models:
            row = payload["results"][m].get(key)
            if row is None:
                cells.append("-")
                continue
            accs = row["accs"]
            mean = 100 * sum(accs) / len(accs)
            spread = 100 * float(torch.tensor(accs).std()) if len(accs) > 1 else 0.0
            cell = f"{mean:.1f} +- {spread:.1f}"
            if key != "fp32":
                d = paired(accs, payload["results"][m]["fp32"]["accs"])
                cell += f" ({d})" if d is not None else ""
            cells.append(cell)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


TITLES = {"to_hetero": "to_hetero(SAGE)", "heteroconv": "HeteroConv(SAGE)",
          "rgcn": "RGCN", "gin": "GIN + sum pooling"}


def choose(candidates: dict[int, dict[str, Any]]) -> int:
    """The candidate of the best mean validation accuracy (the first of equals)."""
    return max(candidates, key=lambda r: (sum(candidates[r]["vals"]), -r))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m experiments.hetero_table",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=cli.positive_int, default=5)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--models", default=",".join(MODELS),
                   help=f"comma-separated, of {', '.join(MODELS)}")
    p.add_argument("--only", default=",".join(CONFIGS),
                   help=f"comma-separated rows, of {', '.join(CONFIGS)}")
    p.add_argument("--quick", action="store_true",
                   help="tiny graphs and a few epochs: a smoke run, not results")
    p.add_argument("--json", default=None, metavar="PATH")
    p.add_argument("--from-json", default=None, metavar="PATH",
                   help="no training: the table of an earlier --json file")
    args = p.parse_args(argv)
    for flag, given, known in (("--models", args.models, MODELS),
                               ("--only", args.only, tuple(CONFIGS))):
        wrong = [v for v in given.split(",") if v not in known]
        if wrong:
            p.error(f"{flag}: {wrong} not among {list(known)}")
    if args.from_json:
        try:
            with open(args.from_json) as f:
                payload = json.load(f)
        except (OSError, ValueError) as e:
            p.error(f"--from-json {args.from_json}: cannot read it as JSON ({e})")
        if not (isinstance(payload, dict) and isinstance(payload.get("results"), dict)
                and isinstance(payload.get("titles"), dict)
                and all("fp32" in rows for rows in payload["results"].values())):
            p.error(f"--from-json {args.from_json}: not a file hetero_table.py --json writes")
        if args.json:
            p.error("--from-json prints an earlier table; please drop --json")
    else:
        cli.refuse_seeds(p, args)
    if "fp32" not in args.only.split(","):
        p.error("--only: the table pairs every row with FP32; please keep fp32")
    cli.refuse_unwritable(p, args, "--json")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            payload = json.load(f)
        print(table(payload))
        return payload
    s = Settings.quick() if args.quick else Settings()
    models, configs = args.models.split(","), args.only.split(",")
    found = tasks(s)
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    results: dict[str, dict[str, Any]] = {}
    for m in models:
        results[m] = {}
        for key in configs:
            candidates = {}
            for refit in (REFIT_CANDIDATES if key == "int4-lsq-p" else (0,)):
                runs = [run(found[m], key, seed, s, refit) for seed in seeds]
                candidates[refit] = {"accs": [r["acc"] for r in runs],
                                     "vals": [r["val"] for r in runs],
                                     "epochs": [r["epoch"] for r in runs]}
                print(f"{TITLES[m]:<20} {CONFIGS[key]:<36} refit {refit}: test "
                      + " ".join(f"{100 * r['acc']:.1f}" for r in runs) + "  val "
                      + " ".join(f"{100 * r['val']:.1f}" for r in runs), flush=True)
            chosen = choose(candidates)
            results[m][key] = {"name": CONFIGS[key], **candidates[chosen]}
            if key == "int4-lsq-p":
                results[m][key]["refit_epochs"] = chosen
                results[m][key]["candidates"] = {str(r): c for r, c in candidates.items()}
    payload = {"command": "python -m experiments.hetero_table " + " ".join(
                   sys.argv[1:] if argv is None else argv),
               "seeds": seeds, "settings": {k: v for k, v in vars(s).items()},
               "titles": {m: TITLES[m] for m in models}, "results": results,
               "versions": {"torch": torch.__version__, "torch_geometric":
                            torch_geometric.__version__, "fxquant": fxquant.__version__,
                            "python": platform.python_version()},
               "threads": torch.get_num_threads()}
    print(table(payload))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=1)
    return payload


if __name__ == "__main__":
    main()
