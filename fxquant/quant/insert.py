"""The graph pass: insert a :class:`~fxquant.quant.points.QuantPoint` at each resolved
quantization point of a traced model.

Node metadata written (documented keys, as torch.fx passes do):

``node.meta["fxquant"]``
    on each inserted ``call_module`` node: ``{"layer": <layer name>, "site": Site}``. The
    point module itself carries its config, which survives pickling where metadata does not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch.fx import GraphModule, Node
from torch.fx.passes.infra.pass_base import PassResult

from fxquant.fx.graph_utils import free_name
from fxquant.fx.selectors import layer_name
from fxquant.quant.config import Resolved, Site
from fxquant.quant.points import QuantPoint

__all__ = ["insert_quant_points"]


def _other_than(new: Node) -> Callable[[Node], bool]:
    return lambda user: user is not new


def insert_quant_points(gm: GraphModule, points: Sequence[Resolved]) -> PassResult:
    """Insert a point after each resolved ``output`` site of ``gm``, in place.

    Every user of a selected node reads the rounded value instead (out of place: the
    original value is still there for whatever backward saved). The points' buffers are
    created on the device of ``gm``'s parameters.
    """
    if not points:
        return PassResult(gm, False)
    device = next((b.device for b in gm.buffers()), None) or next(
        (p.device for p in gm.parameters()), torch.device("cpu"))
    graph = gm.graph
    for p in points:
        if p.site is not Site.OUTPUT:
            raise NotImplementedError(f"site {p.site.value!r} is not supported yet")
        node, layer = p.node, layer_name(p.node)
        name = free_name(gm, f"{node.name}_quant")
        gm.add_submodule(name, QuantPoint(p.config, layer, p.site, p.override).to(device))
        with graph.inserting_after(node):
            new = graph.call_module(name, (node,))
        new.meta["fxquant"] = {"layer": layer, "site": p.site}
        if "stack_trace" in node.meta:
            new.meta["stack_trace"] = node.meta["stack_trace"]
        node.replace_all_uses_with(new, delete_user_cb=_other_than(new))
    graph.lint()
    gm.recompile()
    return PassResult(gm, True)
