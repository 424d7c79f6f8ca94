"""How closely a converted model follows the simulation it was converted from, with each
way of rounding a sum that lies on a rounding boundary (``fxquant.convert(...,
ties=...)``): GCN, GIN, GraphSAGE and GAT in the configurations ``int8`` and
``int4-lsq-p`` of ``examples/dq_table.py`` and the recommended per-node recipe, trained a
few epochs (one seed) on Cora and CiteSeer.

For each case: the point whose codes agree least with the simulation's (the fraction
equal), the codes that differ over all points, the largest difference in levels, and the
test nodes whose predictions agree. Run (one thread; about five minutes):

    OMP_NUM_THREADS=1 python -m experiments.execution_fidelity \\
        --json docs/results/execution_fidelity.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

import torch
from torch_geometric.nn.models import GraphSAGE

import fxquant
from experiments import training
from experiments.dq_table import DEFAULT_PROTECT, rows
from experiments.train_cora import mapping_for
from fxquant.execution import compare

MODELS = ("gcn", "gin", "sage", "gat")
CONFIGS = ("int8", "int4-lsq-p", "recommended")
TIES = ("simulation", "nearest")
#: training epochs per configuration (the learned steps and per-node widths settle)
EPOCHS = {"int8": 5, "int4-lsq-p": 8, "recommended": 8}
#: the recommended recipe's schedule shortened to a few epochs (its mapping is its own)
SHORT = {"float_epochs": 0, "refit_epochs": 2, "anneal_every": 0, "distill": 0.0,
         "fit_budget": False}


def prepared(kind: str, config: str, data: Any, classes: int
             ) -> fxquant.recipes.QuantTraining:
    torch.manual_seed(0)
    model = GraphSAGE(data.num_features, 16, num_layers=2, out_channels=classes,
                      dropout=0.5) if kind == "sage" else \
        training.make_model(kind, data.num_features, classes)
    if config == "recommended":
        return fxquant.recipes.get("recommended", **SHORT).prepare(model, data)
    gm = fxquant.transform(model, mapping_for(rows(DEFAULT_PROTECT)[config], data), lint="off")
    return fxquant.recipes.QuantTraining(gm)


def case(kind: str, config: str, data: Any, classes: int, ties: Sequence[str]
         ) -> list[dict[str, Any]]:
    run = prepared(kind, config, data, classes)
    training.fit(run.model, data, EPOCHS[config], run=run, progress=False)
    gm = run.model.eval()
    # integer between the points where every part has an integer form (GCN and SAGE with
    # weight points); GIN's MLP, the recipe's float32 weights and GAT's softmax stay float32
    strict = kind in ("gcn", "sage") and config != "recommended"
    out = []
    for mode in ties:
        result = compare(gm, fxquant.convert(gm, strict=strict, ties=mode), data.x,
                         data.edge_index, mask=data.test_mask)
        worst = result.worst
        out.append({"model": kind, "config": config, "ties": mode,
                    "worst_point": worst.point if worst else None,
                    "worst_fraction": worst.fraction if worst else 1.0,
                    "codes": sum(p.elements for p in result.points),
                    "unequal": sum(p.elements - p.equal for p in result.points),
                    "max_diff": max((p.max_diff for p in result.points), default=0),
                    "agreement": result.agreement})
    return out


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--root", default=None, help="Planetoid folder (default: FXQUANT_DATA)")
    p.add_argument("--datasets", default="Cora,CiteSeer")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--ties", default=",".join(TIES))
    p.add_argument("--json", default=None, help="write the rows to this file")
    args = p.parse_args(argv)
    chosen = {name: getattr(args, name).split(",") for name in ("models", "configs", "ties")}
    for name, allowed in (("models", MODELS), ("configs", CONFIGS), ("ties", TIES)):
        wrong = [v for v in chosen[name] if v not in allowed]
        if wrong:
            p.error(f"--{name}: {', '.join(wrong)} not among {', '.join(allowed)}")
    results = []
    for name in args.datasets.split(","):
        data, classes = training.load_data(name, args.root, "execution_fidelity")
        for kind in chosen["models"]:
            for config in chosen["configs"]:
                for row in case(kind, config, data, classes, chosen["ties"]):
                    row["dataset"] = name
                    results.append(row)
                    print(f"{name:9s} {kind:5s} {config:12s} {row['ties']:10s} "
                          f"worst {100 * row['worst_fraction']:8.3f}%  unequal "
                          f"{row['unequal']:5d} of {row['codes']}  max diff {row['max_diff']}"
                          f"  agree {100 * row['agreement']:.2f}%", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "rows": results}, f, indent=1)
    return results


if __name__ == "__main__":
    main()
