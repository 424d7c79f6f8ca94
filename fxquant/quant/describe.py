"""What a transformed model rounds where: :func:`quantization_points` and :func:`summary`."""

from __future__ import annotations

from typing import Any

import torch
from tabulate import tabulate
from torch import nn
from torch.fx import GraphModule

from fxquant.errors import FxquantTypeError
from fxquant.fx.selectors import layer_name
from fxquant.quant._probe import probe
from fxquant.quant.config import describe
from fxquant.quant.points import QuantPoint
from fxquant.quant.site import AnySite, Site

__all__ = ["quantization_points", "summary"]

_CALLS = ("call_module", "call_function", "call_method")
_SITE_ORDER = [Site.INPUT, Site.WEIGHT, Site.LINEAR, Site.EDGE, Site.MESSAGE,
               Site.AGGREGATE, Site.OUTPUT]


def _site_order(site: AnySite) -> float:
    """The order of a layer's sites in the summary: the data's path through the layer
    (a registered site just before the output)."""
    if isinstance(site, Site):
        return _SITE_ORDER.index(site)
    return _SITE_ORDER.index(Site.OUTPUT) - 0.5


def quantization_points(model: nn.Module) -> list[tuple[str, QuantPoint]]:
    """``(module name, point)`` for every point in ``model``, in the order the graph calls
    them (also on a model reloaded with ``torch.load``, which keeps the modules).

    Example:
        >>> import fxquant
        >>> from torch_geometric.nn.models import GCN
        >>> gm = fxquant.transform(GCN(4, 8, num_layers=2, out_channels=2), bits=8)
        >>> [(name, point.layer, point.site.value) for name, point in quantization_points(gm)]
        [('convs_0_quant', 'convs.0', 'output'), ('convs_1_quant', 'convs.1', 'output')]
    """
    if not isinstance(model, nn.Module):
        raise FxquantTypeError(f"expected a model returned by fxquant.transform, got {type(model).__name__}")
    points = {name: m for name, m in model.named_modules() if isinstance(m, QuantPoint)}
    layers: list[str] = []
    if isinstance(model, GraphModule):
        layers = [layer_name(n) for n in model.graph.nodes if n.op in _CALLS]
    rank = {layer: i for i, layer in reversed(list(enumerate(layers)))}
    order = sorted(points, key=lambda name: (rank.get(points[name].layer, len(rank)),
                                             _site_order(points[name].site), name))
    return [(name, points[name]) for name in order]


def summary(gm: nn.Module, *example_inputs: Any, tablefmt: str = "simple") -> str:
    """A table of the quantization points fxquant inserted into ``gm``.

    Works on a GraphModule reloaded with ``torch.load`` too. With example inputs, one
    forward runs (in eval mode, without gradients; the modes, layer caches, what the last
    forward recorded and the random generators are put back) and the table shows the
    shape of what each point rounds.

    Args:
        gm (torch.nn.Module): a model returned by :func:`fxquant.transform`.
        *example_inputs: forward arguments, for the ``shape`` column.
        tablefmt (str, optional): any :mod:`tabulate` format, e.g. ``"github"``.

    Example:
        >>> from torch_geometric.nn.models import GCN
        >>> from fxquant import transform
        >>> print(summary(transform(GCN(4, 8, num_layers=2, out_channels=2), bits=12)))
        point          layer    site    format      bits  rounding     scale    grad    node override
        -------------  -------  ------  --------  ------  -----------  -------  ------  ---------------
        convs_0_quant  convs.0  output  top12         12  toward_zero  -        ste     -
        convs_1_quant  convs.1  output  top12         12  toward_zero  -        ste     -
    """
    if not isinstance(gm, GraphModule):
        raise FxquantTypeError(
            f"fxquant.summary expects the GraphModule fxquant.transform returns, got "
            f"{type(gm).__name__}; please pass gm = fxquant.transform(model, ...)"
        )
    points = quantization_points(gm)
    shapes = _shapes(gm, points, example_inputs) if example_inputs else {}
    rows = []
    for name, point in points:
        c = point.config
        scale = c.scale_description()
        grad = c.grad.value + (f", grad {describe(c.grad_format)}" if c.grad_format else "")
        bits: int | str = c.format.bits
        rb = c.node_bits  # per-node widths: their range, not the format's width
        if rb is not None:
            table = point.node_widths.bits if point.node_widths is not None else None
            if rb.learned or table is None or not table.numel() or table.is_meta:
                bits = f"{rb.min_bits}..{rb.max_bits}/node"
            else:  # the fixed widths the table holds, within the allowed range
                lo, hi = (int(v) for v in table.detach().clamp(rb.min_bits, rb.max_bits)
                          .round().aminmax())
                bits = f"{lo}/node" if lo == hi else f"{lo}..{hi}/node"
        site = point.site.value + (f" {point.tensor}" if point.tensor else "")
        row = [name, point.layer, site, describe(c.format), bits, c.rounding.value, scale, grad,
               point.override_description()]
        if example_inputs:
            row.insert(3, shapes.get(name, "-"))
        rows.append(row)
    if not rows:
        return "no fxquant quantization points in this model"
    headers = ["point", "layer", "site", "format", "bits", "rounding", "scale", "grad",
               "node override"]
    if example_inputs:
        headers.insert(3, "shape")
    return tabulate(rows, headers=headers, tablefmt=tablefmt)


def _shapes(gm: nn.Module, points: list[tuple[str, QuantPoint]],
            inputs: tuple[Any, ...]) -> dict[str, str]:
    """The shape each point rounds in one eval forward (its hooks removed, state restored)."""
    seen: dict[str, list[str]] = {}
    handles = []
    for name, point in points:
        def hook(module: nn.Module, args: tuple[Any, ...], name: str = name) -> None:
            if args and isinstance(args[0], torch.Tensor):
                seen.setdefault(name, []).append("x".join(map(str, args[0].shape)) or "scalar")
        handles.append(point.register_forward_pre_hook(hook))
    try:
        with probe(gm):
            gm(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    return {name: ", ".join(dict.fromkeys(shapes)) for name, shapes in seen.items()}

