"""Which layers of a traced model a pass acts on.

A *layer* is a ``call_module``, ``call_function`` or ``call_method`` node. It is named by
its submodule's qualified name (``"conv1"``, ``"convs.0"``) or, for functions and methods,
by its FX node name (``"sigmoid"``, ``"relu_1"``).
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Callable, Iterable

from torch import nn
from torch.fx import GraphModule, Node
from torch_geometric.nn import MessagePassing

from fxquant.errors import FxquantTypeError, FxquantValueError

__all__ = ["LayerSpec", "layer_name", "layer_names", "layers_of", "matches", "select_layers"]

#: What ``layers=`` accepts: a name or fnmatch pattern, a module class, a node predicate,
#: or a list of these.
LayerSpec = str | type[nn.Module] | Callable[[Node], bool]

_LAYER_OPS = ("call_module", "call_function", "call_method")


def layer_name(node: Node) -> str:
    """The name a user gives a layer: the module's qualified name, else the node name."""
    return str(node.target) if node.op == "call_module" else node.name


def layers_of(gm: GraphModule, exclude: Callable[[Node], bool] = lambda n: False) -> list[Node]:
    """All layer nodes of ``gm`` in graph order, without those ``exclude`` rejects."""
    return [n for n in gm.graph.nodes if n.op in _LAYER_OPS and not exclude(n)]


def layer_names(node: Node) -> tuple[str, ...]:
    """Every name a layer answers to: its submodule's qualified name and its node name."""
    return (str(node.target), node.name) if node.op == "call_module" else (node.name,)


def matches(gm: GraphModule, node: Node, spec: LayerSpec) -> bool:
    """Whether one layer node is named by ``spec`` (a name, pattern, class or predicate)."""
    if isinstance(spec, str):
        return any(spec == s or fnmatch.fnmatchcase(s, spec) for s in layer_names(node))
    if isinstance(spec, type) and issubclass(spec, nn.Module):
        return node.op == "call_module" and isinstance(gm.get_submodule(str(node.target)), spec)
    if callable(spec) and not isinstance(spec, type):
        return bool(spec(node))
    raise FxquantTypeError(
        f"layer selectors must be a name or pattern, a module class or a predicate on "
        f"torch.fx.Node, got {spec!r}"
    )


def _match_one(gm: GraphModule, nodes: list[Node], spec: LayerSpec, arg: str) -> list[Node]:
    if not (isinstance(spec, str) or (isinstance(spec, type) and issubclass(spec, nn.Module))
            or (callable(spec) and not isinstance(spec, type))):
        raise FxquantTypeError(
            f"{arg} entries must be a name or pattern, a module class or a predicate on "
            f"torch.fx.Node, got {spec!r}"
        )
    if isinstance(spec, str):
        exact = [n for n in nodes if spec in layer_names(n)]
        if exact:
            return exact
    found = [n for n in nodes if matches(gm, n, spec)]
    if found or not isinstance(spec, (str, type)):
        return found
    if isinstance(spec, str):
        raise unknown_layer(spec, arg, [layer_name(n) for n in nodes])
    classes = sorted(
        {type(gm.get_submodule(str(n.target))).__name__ for n in nodes if n.op == "call_module"}
    )
    raise FxquantValueError(
        f"no layer of class {spec.__name__} in {arg}; module classes called in this "
        f"model: {classes}"
    )


def select_layers(
    gm: GraphModule,
    spec: LayerSpec | Iterable[LayerSpec] | None,
    nodes: list[Node],
    arg: str = "layers",
) -> list[Node]:
    """The nodes among ``nodes`` that ``spec`` names, in graph order, each once.

    ``spec=None`` selects every PyG ``MessagePassing`` layer.

    Example:
        >>> from fxquant.fx.tracer import trace
        >>> from torch_geometric.nn.models import GCN
        >>> gm = trace(GCN(4, 8, num_layers=2, out_channels=2))
        >>> [n.name for n in select_layers(gm, "convs.*", layers_of(gm))]
        ['convs_0', 'convs_1']
    """
    if spec is None:
        return [
            n
            for n in nodes
            if n.op == "call_module" and isinstance(gm.get_submodule(str(n.target)), MessagePassing)
        ]
    specs: list[LayerSpec] = (
        [spec] if isinstance(spec, (str, type)) or not isinstance(spec, Iterable) else list(spec)
    )
    chosen: set[Node] = set()
    for s in specs:
        chosen.update(_match_one(gm, nodes, s, arg))
    return [n for n in nodes if n in chosen]


def unknown_layer(selector: str, arg: str, layers: list[str]) -> FxquantValueError:
    """The error for a layer name that names nothing: the closest names of the model's own
    layers first, then all of them."""
    known = sorted(dict.fromkeys(layers))
    close = difflib.get_close_matches(selector, known, n=3)
    guess = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    example = close[0] if close else known[0] if known else "conv1"
    prefix = example.split(".")[0].rstrip("0123456789_") or example
    return FxquantValueError(
        f"unknown layer {selector!r} in {arg}.{guess} Layers in this model: {known}. Please "
        f"use a submodule name ({example!r}), a node name, or a pattern ('{prefix}*')."
    )
