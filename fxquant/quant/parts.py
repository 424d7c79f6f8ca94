"""The parts of a site: the tensors one site of one call rounds, each with its own
quantization point, and the node type or edge type each belongs to.

A site rounds one tensor, except where a layer takes or computes several that belong to
different nodes or relations:

- the ``input`` of a layer called with a ``(source, target)`` pair of distinct tensors
  (a bipartite layer: authors sending to papers) has the parts ``"target"`` (its point
  keeps the name ``<call>_input_quant``) and ``"source"`` (``<call>_input_source_quant``):
  two node sets, two ranges or learned steps, each protected by its own nodes' degrees;
- the ``input`` of a layer that takes a dict of node types (``HGTConv(x_dict, ...)``) and
  the ``output`` of one that returns such a dict have one part per node type;
- the ``message`` and ``weight`` sites of a layer that computes per relation
  (``RGCNConv``, ``FastRGCNConv``: relation ``0 .. num_relations - 1``; ``HGTConv``: its
  edge types) have one part per relation: the messages ``x_j W_r`` of relation ``r``, and
  the slices of the weight that belong to it (``RGCNConv.weight[r]``; ``HGTConv``'s
  ``k_rel``/``v_rel`` weights of each head for that edge type). The layer's other
  weights (``root``, a basis decomposition, ``HGTConv``'s per-node-type linears) are the
  part ``None``.

Everything else has the one part ``None``.
"""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn
from torch.fx import GraphModule, Node
from torch_geometric.nn import HGTConv, RGCNConv

from fxquant.fx.hetero import dict_input, dict_output_keys, layer_type
from fxquant.quant.site import AnySite, Part, Site

__all__ = ["RELATIONAL", "layer_input", "part_types", "parts_of", "relations_of",
           "weight_relation_rows"]

#: The layers that compute per relation inside one module (``FastRGCNConv`` is an
#: ``RGCNConv``).
RELATIONAL: tuple[type[nn.Module], ...] = (RGCNConv, HGTConv)


def relations_of(module: nn.Module) -> list[Any] | None:
    """The relations ``module`` computes per relation (``RGCNConv`` and
    ``FastRGCNConv``: ``0 .. num_relations - 1``; ``HGTConv``: its edge types), else
    None."""
    if isinstance(module, RGCNConv):
        return list(range(int(module.num_relations)))
    if isinstance(module, HGTConv):
        return [tuple(et) for et in module.edge_types]
    return None


def weight_relation_rows(module: nn.Module, tensor: str) -> dict[Any, list[int]] | None:
    """For a weight of a relational layer whose first dim is per relation: each
    relation's rows of it (``RGCNConv.weight`` without a basis decomposition: row ``r``;
    ``HGTConv``'s ``k_rel.weight`` / ``v_rel.weight``, one row per head and edge type:
    ``head * num_edge_types + r``); None for a weight that is not per relation."""
    if isinstance(module, RGCNConv) and tensor == "weight" and module.num_bases is None:
        return {r: [r] for r in range(int(module.num_relations))}
    if isinstance(module, HGTConv) and tensor in ("k_rel.weight", "v_rel.weight"):
        types = [tuple(et) for et in module.edge_types]
        return {et: [h * len(types) + r for h in range(int(module.heads))]
                for r, et in enumerate(types)}
    return None


def layer_input(gm: GraphModule, node: Node) -> tuple[int | str, Any] | None:
    """Where a layer call passes the layer's first argument, and what: ``(0, value)`` when
    positional, ``(name, value)`` when by keyword (``conv(x=h, edge_index=e)``); None when
    it is not passed."""
    if node.args:
        return 0, node.args[0]
    if node.op != "call_module":
        return None
    try:
        parameters = list(inspect.signature(gm.get_submodule(str(node.target)).forward)
                          .parameters.values())
    except (TypeError, ValueError):
        return None
    first = next((p.name for p in parameters
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)), None)
    return (first, node.kwargs[first]) if first is not None and first in node.kwargs else None


def _pair(gm: GraphModule, node: Node) -> bool:
    """The layer's first argument is a pair of two different traced values."""
    found = layer_input(gm, node)
    first = found[1] if found is not None else None
    return isinstance(first, (tuple, list)) and len(first) == 2 \
        and all(isinstance(p, Node) for p in first) and first[0] is not first[1]


def _module(gm: GraphModule, node: Node) -> nn.Module | None:
    return gm.get_submodule(str(node.target)) if node.op == "call_module" else None


def parts_of(gm: GraphModule, node: Node, site: AnySite) -> list[Part]:
    """The parts of ``site`` on the call ``node`` (see the module docs), in the order
    their points are made."""
    if site is Site.INPUT:
        if _pair(gm, node):
            return ["target", "source"]
        found = layer_input(gm, node) if node.op == "call_module" else None
        keys = dict_input(node) if found is not None and found[0] == 0 else None
        return list(keys) if keys else [None]
    if site is Site.OUTPUT:
        return list(dict_output_keys(node)) or [None]
    module = _module(gm, node)
    relations = relations_of(module) if module is not None else None
    if relations is None:
        return [None]
    if site is Site.MESSAGE:
        return list(relations)
    if site is Site.WEIGHT:
        assert module is not None
        names = [n for n, p in module.named_parameters()
                 if p.is_floating_point() and p.dim() >= 2]
        per_relation = [n for n in names if weight_relation_rows(module, n) is not None]
        if not per_relation:
            return [None]
        return ([None] if len(per_relation) < len(names) else []) + list(relations)
    return [None]


def part_types(gm: GraphModule, node: Node, site: AnySite, part: Part
               ) -> tuple[str | None, Any]:
    """``(node type, edge type)`` the values of ``part`` of ``site`` on ``node`` belong
    to (either may be None):

    - a relation part: its relation (an edge type, or an ``RGCNConv`` relation index);
    - a layer that is one edge type's copy (``HeteroConv``, ``to_hetero``): that edge
      type for every site, and a node type for the sites whose rows are nodes: the
      target type for the output, the aggregation and the input's target part, the
      source type for the input's source part;
    - a layer that is one node type's copy (``to_hetero``'s, a ``ModuleDict`` keyed by
      node type): that node type for every site;
    - a dict part (a layer that takes or returns a dict): its key, a node type.
    """
    if site in (Site.MESSAGE, Site.WEIGHT) and part is not None:
        return None, part
    found = layer_type(gm, node)
    if site in (Site.INPUT, Site.OUTPUT) and part not in (None, "source", "target"):
        return str(part), found[1] if found is not None and found[0] == "edge" else None
    if found is None:
        return None, None
    kind, key = found
    if kind == "node":
        return str(key), None
    assert isinstance(key, tuple)
    if site is Site.INPUT:
        return (key[0] if part == "source" else key[-1]), key
    if site in (Site.OUTPUT, Site.AGGREGATE):
        return key[-1], key
    return None, key
