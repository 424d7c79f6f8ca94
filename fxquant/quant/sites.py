"""Quantization inside an unmodified layer: its weights, its messages, its aggregation.

PyG's message and aggregate hooks do not run under ``torch.compile`` (PyG switches to a
generated ``propagate`` without the hook loops), and ``torch.nn.utils.parametrize``
modules cannot be pickled. So on the transformed copy of a layer (never its class, never
the user's instance) fxquant sets small callable objects as instance attributes, which
Python finds before the class's methods, and which the generated ``propagate`` calls like
any method (it calls ``self.aggregate(...)`` and ``self.message_and_aggregate(...)`` by
attribute):

- ``layer.forward``: a :class:`QuantizedForward` that rounds every weight (floating
  parameters with at least two dims: weight matrices, GAT's attention vectors; biases and
  scalars stay float32) and runs the layer's own forward on them with
  :func:`torch.func.functional_call`. The optimizer keeps updating the float32 master
  weights (the rounding's gradient is straight-through), and ``state_dict`` keys are the
  original ones.
- ``layer.aggregate``: a :class:`QuantizedAggregate` that rounds what it receives (the
  messages: ``message()``'s output, one row per edge) and what it returns (the
  aggregation, one row per node, before ``update()``). It knows each message's target
  node (``index``), so per-node settings of messages follow their target.
- ``layer.message_and_aggregate``: a :class:`NoFusedPath` that raises: a fused path
  (a ``SparseTensor`` adjacency) has no per-edge messages to round.

The objects hold their :class:`~fxquant.quant.points.QuantPoint` modules, which are also
registered on the GraphModule (so ``print(gm)``, ``.to()`` and ``state_dict`` see them).
All of it pickles by reference to this module, survives ``deepcopy`` (identities are
kept), and compiles: dynamo inlines the objects like methods, so compiled == eager.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch_geometric.nn import MessagePassing

from fxquant.errors import FxquantRuntimeError, FxquantValueError
from fxquant.quant.points import QuantPoint, in_degree

__all__ = [
    "NoFusedPath",
    "QuantizedAggregate",
    "QuantizedForward",
    "install",
    "weights_of",
]


def weights_of(module: nn.Module) -> list[str]:
    """The names of the parameters the weight site rounds: floating, at least 2-D."""
    return [name for name, p in module.named_parameters()
            if p.is_floating_point() and p.dim() >= 2]


class QuantizedForward:
    """``layer.forward`` with every weight rounded by its point (see the module docs)."""

    def __init__(self, owner: nn.Module, points: dict[str, QuantPoint]) -> None:
        self.owner = owner
        self.points = points
        self.active = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.active:  # functional_call calls the module, which comes back here
            return type(self.owner).forward(self.owner, *args, **kwargs)
        params = dict(self.owner.named_parameters())
        rounded = {name: point(params[name]) for name, point in self.points.items()}
        self.active = True
        try:
            return torch.func.functional_call(self.owner, rounded, args, kwargs)
        finally:
            self.active = False


class QuantizedAggregate:
    """``layer.aggregate`` with the messages rounded on the way in and the aggregation on
    the way out (see the module docs)."""

    def __init__(self, owner: MessagePassing, message: QuantPoint | None,
                 aggregate: QuantPoint | None) -> None:
        self.owner = owner
        self.message = message
        self.aggregate = aggregate

    def __call__(self, inputs: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        index = kwargs.get("index", args[0] if args else None)
        dim_size = kwargs.get("dim_size")
        degree = nodes = None
        per_node = any(p is not None and p.needs_nodes for p in (self.message, self.aggregate))
        if per_node and isinstance(index, Tensor) and isinstance(dim_size, int):
            degree = in_degree(torch.stack([index, index]), dim_size, inputs)  # counts index
            nodes = index
        if self.message is not None:
            inputs = self.message(inputs, node_degree=degree, row_nodes=nodes)
        out = type(self.owner).aggregate(self.owner, inputs, *args, **kwargs)
        if self.aggregate is not None:
            out = self.aggregate(out, node_degree=degree)
        return out


class NoFusedPath:
    """``layer.message_and_aggregate``: the fused path has no messages to round."""

    def __init__(self, owner: MessagePassing, layer: str, sites: list[str]) -> None:
        self.owner = owner
        self.layer = layer
        self.sites = sites

    def __call__(self, *args: Any, **kwargs: Any) -> Tensor:
        raise FxquantRuntimeError(
            f"fxquant: layer {self.layer!r} ({type(self.owner).__name__}) took PyG's fused "
            f"message_and_aggregate path (a SparseTensor or sorted EdgeIndex adjacency), "
            f"which computes no per-edge messages, so its {' and '.join(self.sites)} "
            "site cannot be rounded. Please pass a plain edge_index tensor, or quantize "
            "its 'input'/'output' sites instead."
        )


def install(layer_name: str, module: nn.Module, weights: dict[str, QuantPoint] | None,
            message: QuantPoint | None, aggregate: QuantPoint | None) -> None:
    """Set the site objects on ``module`` (the transformed copy), checking it can take them."""
    if weights:
        if "forward" in vars(module):
            raise FxquantValueError(f"layer {layer_name!r} already has its own forward attribute; "
                             "fxquant cannot round its weights")
        module.forward = QuantizedForward(module, weights)
    if message is None and aggregate is None:
        return
    if not isinstance(module, MessagePassing):
        raise FxquantValueError(f"the message and aggregate sites need a PyG MessagePassing layer; "
                         f"{layer_name!r} is {type(module).__name__}")
    if getattr(module, "explain", False) or getattr(module, "decomposed_layers", 1) > 1:
        raise FxquantValueError(f"layer {layer_name!r} runs PyG's explain or decomposed_layers mode, "
                         "whose propagate fxquant does not round inside; please switch it off")
    module.aggregate = QuantizedAggregate(module, message, aggregate)
    sites = [s for s, p in (("message", message), ("aggregate", aggregate)) if p is not None]
    module.message_and_aggregate = NoFusedPath(module, layer_name, sites)
