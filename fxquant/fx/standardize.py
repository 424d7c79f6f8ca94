"""Standardisation passes: rewrite what tracing froze into modules that keep working.

``F.dropout(x, p, training=self.training)`` (PyG's examples write it so) is recorded by
symbolic tracing with the mode the model was in. :func:`functional_dropout_to_module`
compares the graphs traced in train and in eval mode and turns every such call into an
``nn.Dropout`` submodule, so ``gm.train()`` / ``gm.eval()`` switch it as in the original.
:func:`fast_dropout` swaps ``nn.Dropout`` submodules for :class:`FastDropout`, whose mask
costs a third as much on CPU, eager and compiled.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.fx import Graph, GraphModule, Node, map_arg
from torch.fx.operator_schemas import normalize_function
from torch.fx.passes.infra.pass_base import PassResult

from fxquant._ops.dropout import apply as _dropout_apply
from fxquant.errors import FxquantTypeError
from fxquant.fx.graph_utils import free_name

__all__ = ["FastDropout", "fast_dropout", "functional_dropout_to_module"]

_DROPOUT_MODULES: dict[Callable[..., Any], type[nn.Module]] = {
    F.dropout: nn.Dropout,
    F.dropout1d: nn.Dropout1d,
    F.dropout2d: nn.Dropout2d,
    F.dropout3d: nn.Dropout3d,
    F.alpha_dropout: nn.AlphaDropout,
    F.feature_alpha_dropout: nn.FeatureAlphaDropout,
    torch.dropout: nn.Dropout,
}


def _by_name(args: Any) -> Any:
    return map_arg(args, lambda n: n.name)


def _normalized_kwargs(node: Node) -> dict[str, Any] | None:
    """All arguments of a call_function node by name, or None where torch cannot bind them."""
    try:
        pair = normalize_function(
            node.target,  # type: ignore[arg-type]
            tuple(node.args),
            dict(node.kwargs),
            normalize_to_only_use_kwargs=True,
        )
    except RuntimeError:  # ambiguous overloads
        return None
    return None if pair is None else pair.kwargs


def functional_dropout_to_module(gm: GraphModule, train_graph: Graph,
                                 eval_graph: Graph) -> PassResult:
    """Turn functional calls whose ``training`` flag was ``self.training`` into modules.

    ``gm``'s graph is one of ``train_graph`` / ``eval_graph`` (the same forward traced in
    each mode). Calls that differ only in their ``training`` flag become dropout modules
    in the mode of ``gm``; other mode-dependent code is reported with a warning.
    """
    t_nodes, e_nodes = list(train_graph.nodes), list(eval_graph.nodes)
    same_shape = len(t_nodes) == len(e_nodes) and all(
        (a.op, a.target, a.name) == (b.op, b.target, b.name)
        for a, b in zip(t_nodes, e_nodes, strict=True)
    )
    if not same_shape:
        warnings.warn(
            f"{type(gm).__name__}.forward takes different paths in train and eval mode "
            f"(e.g. `if self.training:`); the GraphModule follows the mode the model was in "
            f"(training={gm.training}). Please move mode-dependent code into a submodule.",
            stacklevel=4,
        )
        return PassResult(gm, False)
    nodes = {n.name: n for n in gm.graph.nodes}
    changed = False
    for t, e in zip(t_nodes, e_nodes, strict=True):
        if t.op != "call_function" or _by_name((t.args, t.kwargs)) == _by_name((e.args, e.kwargs)):
            continue
        kw_t, kw_e = _normalized_kwargs(t), _normalized_kwargs(e)
        flag = "train" if t.target is torch.dropout else "training"
        if not kw_t or kw_t.get(flag) is not True or not kw_e or kw_e.get(flag) is not False:
            continue
        node = nodes[t.name]
        cls = _DROPOUT_MODULES.get(t.target)
        if cls is None or isinstance(kw_t.get("p"), Node):
            warnings.warn(
                f"node {t.name!r} ({getattr(t.target, '__name__', t.target)}) reads "
                f"self.training, which tracing freezes to training={gm.training}. Please use "
                "a module (e.g. torch.nn.Dropout) so that train()/eval() reach it.",
                stacklevel=4,
            )
            continue
        kwargs = {"p": kw_t["p"]}
        if "inplace" in kw_t:
            kwargs["inplace"] = kw_t["inplace"]
        name = free_name(gm, t.name)
        gm.add_submodule(name, cls(**kwargs).train(gm.training))
        own = _normalized_kwargs(node) or {}  # the same call, in gm's own graph
        node.op, node.target = "call_module", name
        node.args, node.kwargs = (own["input"],), {}
        changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()
    return PassResult(gm, changed)


class FastDropout(nn.Dropout):
    """``nn.Dropout`` whose training-mode mask comes from one ``torch.rand`` draw
    (``torch.ops.fxquant.uniform``), which ``torch.compile`` calls as it is, fusing the
    rest of the dropout with the operations that read its output.

    The same distribution as ``nn.Dropout`` (each value kept with probability ``1 - p``
    and scaled by ``1 / (1 - p)``), other random numbers: for a given seed the masks
    differ from ``nn.Dropout``'s. Out of place also where ``inplace=True``. In evaluation,
    and for tensors that are not floating point, it is ``nn.Dropout``.
    """

    def forward(self, input: Tensor) -> Tensor:
        if not self.training or self.p == 0.0 or not input.is_floating_point():
            return super().forward(input)
        return _dropout_apply(input, float(self.p))


def fast_dropout(model: nn.Module) -> nn.Module:
    """Replace every ``torch.nn.Dropout`` in ``model`` by a :class:`FastDropout` of the same
    ``p``, in place; returns ``model`` (a new module where ``model`` is itself a dropout).

    On CPU, ``nn.Dropout`` draws its mask with ``bernoulli_`` and ``torch.compile`` with a
    random number per value generated one at a time; one ``torch.rand`` draw takes a third
    of either (Cora's 2708 x 1433 input features: about 13 ms against 45 ms on one
    thread), and for a two-layer GCN on Cora the input's dropout is most of a training
    step. The masks follow ``torch.manual_seed`` but are other masks than
    ``nn.Dropout``'s. Only ``nn.Dropout`` itself is replaced (not its subclasses, nor
    ``Dropout1d``/``2d``/``3d`` or ``AlphaDropout``, which drop otherwise), under every
    name it has: a dropout that two attributes or containers share becomes one
    :class:`FastDropout` they share. Apply it to
    the model you train, before ``torch.compile``; :func:`fxquant.load` rebuilds the
    model with ``nn.Dropout`` (no state differs). Functional ``F.dropout`` calls in a
    model's ``forward`` are not modules: trace the model first (:func:`fxquant.trace` or
    :func:`fxquant.transform` turn them into ``nn.Dropout`` submodules); a warning says
    when there is no ``nn.Dropout`` to replace.

    Args:
        model (torch.nn.Module): the model, e.g. a transformed ``GraphModule``.

    Example:
        >>> import fxquant
        >>> from torch_geometric.nn.models import GCN
        >>> gm = fxquant.fast_dropout(fxquant.trace(GCN(4, 8, num_layers=2, dropout=0.5)))
        >>> [type(m).__name__ for m in gm.modules() if isinstance(m, torch.nn.Dropout)]
        ['FastDropout']
        >>> gm.eval()(torch.ones(3, 4), torch.tensor([[0, 1], [1, 2]])).shape
        torch.Size([3, 8])
    """
    if not isinstance(model, nn.Module):
        raise FxquantTypeError(f"fast_dropout: model must be a torch.nn.Module, got "
                               f"{type(model).__name__}")
    if type(model) is nn.Dropout:
        return _fast(model)
    # by identity, under every name: a dropout two attributes (or two containers) share
    # is replaced by one FastDropout that they share in turn
    fast: dict[int, FastDropout] = {}
    for name, sub in list(model.named_modules(remove_duplicate=False)):
        if name and type(sub) is nn.Dropout:
            if id(sub) not in fast:
                fast[id(sub)] = _fast(sub)
            model.set_submodule(name, fast[id(sub)])
    if not fast:
        warnings.warn(f"fast_dropout: {type(model).__name__} holds no torch.nn.Dropout, so "
                      "nothing changed; functional F.dropout calls are not modules: pass "
                      "fxquant.trace(model) or a transformed model", stacklevel=2)
    return model


def _fast(module: nn.Dropout) -> FastDropout:
    fast = FastDropout(module.p, module.inplace)
    fast.train(module.training)
    return fast
