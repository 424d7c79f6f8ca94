"""Named recipes: a quantization mapping together with what training does around it.

A :class:`fxquant.QuantMapping` says how each value is rounded. Some methods also need
the training loop's help: learned steps fitted again while activations grow
(:func:`fxquant.refit_steps`), per-node bit-widths annealed from a few bits above their
final widths, a bit penalty in the loss, the bit-widths at their own learning rate, and
the reported epoch chosen under the bit budget. A recipe bundles all of that:

.. code-block:: python

    recipe = fxquant.recipes.HubMessages(target_bits=2.0)
    run = recipe.prepare(model, data)            # run.model: the transformed model
    if run.distill:                              # (the recommended recipe)
        run.set_teacher(float32_logits)          # a float32 model's logits on the graph
    optimizer = torch.optim.Adam(run.param_groups(model_groups), lr=0.01)
    for epoch in range(200):
        run.start_epoch(epoch)                   # refits, annealing
        out = run.model(data.x, data.edge_index)
        loss = run.loss(F.cross_entropy(...), output=out)  # + penalty, distillation
        ...
        run.observe(val_acc, test=test_acc)      # the reported epoch: run.best

The recipes work on any model whose GNN layers are PyG ``MessagePassing`` modules; they
find the layers, their order, and which values are non-negative (after a ReLU) on the
traced graph. :func:`get` builds one by name, :func:`available` lists the names.

Example:
    >>> import fxquant
    >>> from torch_geometric.nn.models import GCN
    >>> fxquant.recipes.available()
    ['budget-bits', 'degree-quant', 'hub-messages', 'learned-bits', 'lsq-protect', 'mx', \
'recommended']
    >>> recipe = fxquant.recipes.get("mx", format="e2m1")
    >>> recipe
    MX(format='e2m1')
    >>> run = recipe.prepare(GCN(8, 16, num_layers=2, out_channels=3))
    >>> sorted({str(p.config.scale) for _, p in fxquant.quantization_points(run.model)})
    ['block32']
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from fxquant.errors import FxquantTypeError, FxquantValueError
from fxquant.recipes.bits import BudgetBits, HubMessages, LearnedBits
from fxquant.recipes.core import Choice, QuantTraining, Recipe
from fxquant.recipes.uniform import MX, DegreeQuant, LsqProtect

__all__ = [
    "MX",
    "RECOMMENDED",
    "BudgetBits",
    "Choice",
    "DegreeQuant",
    "HubMessages",
    "LearnedBits",
    "LsqProtect",
    "QuantTraining",
    "Recipe",
    "available",
    "get",
]

_RECIPES: dict[str, type[Recipe]] = {cls.name: cls for cls in (
    BudgetBits, DegreeQuant, HubMessages, LearnedBits, LsqProtect, MX)}


#: the recipe ``get("recommended")`` builds: the per-node bit-width method chosen on the
#: validation accuracy of Cora and CiteSeer jointly, and its chosen settings (the
#: documentation's results on per-node bits record every trial and the choice)
RECOMMENDED: tuple[str, dict[str, Any]] = (
    "hub-messages", {"hub_quantile": 0.9, "last_aggregate_bits": 4, "anneal_every": 50,
                     "anneal_bits": 2, "midrise": True, "shared_step": True,
                     "select": "budget", "refit_epochs": 30, "refit_widen": True,
                     "float_epochs": 30, "distill": 0.5, "temperature": 1.0})


def available() -> list[str]:
    """The names :func:`get` knows (``"recommended"`` is the chosen per-node bit-width
    recipe, :data:`RECOMMENDED`).

    Example:
        >>> "recommended" in available() and "degree-quant" in available()
        True
        >>> get("recommended").float_epochs == RECOMMENDED[1]["float_epochs"]
        True
    """
    return sorted([*_RECIPES, "recommended"])


def get(name: str, **settings: Any) -> Recipe:
    """The recipe called ``name`` with ``settings`` (its dataclass fields).

    Example:
        >>> get("hub-messages", target_bits=3.0).target_bits
        3.0
        >>> get("hub-mesages")
        Traceback (most recent call last):
        ...
        fxquant.errors.FxquantValueError: unknown recipe 'hub-mesages'; recipes: \
['budget-bits', 'degree-quant', 'hub-messages', 'learned-bits', 'lsq-protect', 'mx', \
'recommended']
    """
    if name == "recommended":
        name, chosen = RECOMMENDED
        settings = {**chosen, **settings}
    cls = _RECIPES.get(name)
    if cls is None:
        raise FxquantValueError(f"unknown recipe {name!r}; recipes: {available()}")
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(settings) - known)
    if unknown:
        raise FxquantTypeError(f"recipe {name!r} has no setting {unknown}; its settings: "
                               f"{sorted(known)}")
    return cls(**settings)
