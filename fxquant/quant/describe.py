"""What a transformed model rounds where: :func:`quantization_points` and :func:`summary`."""

from __future__ import annotations

from tabulate import tabulate
from torch import nn
from torch.fx import GraphModule

from fxquant.quant.config import describe
from fxquant.quant.points import QuantPoint

__all__ = ["quantization_points", "summary"]


def quantization_points(model: nn.Module) -> list[tuple[str, QuantPoint]]:
    """``(module name, point)`` for every point in ``model``, in the order the graph calls
    them (also on a model reloaded with ``torch.load``, which keeps the modules)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected a model returned by fxquant.transform, got {type(model).__name__}")
    points = {name: m for name, m in model.named_modules() if isinstance(m, QuantPoint)}
    order: list[str] = []
    if isinstance(model, GraphModule):
        order = [str(n.target) for n in model.graph.nodes
                 if n.op == "call_module" and str(n.target) in points]
    order += [name for name in points if name not in order]
    return [(name, points[name]) for name in order]


def summary(gm: nn.Module, tablefmt: str = "simple") -> str:
    """A table of the quantization points fxquant inserted into ``gm``.

    Works on a GraphModule reloaded with ``torch.load`` too.

    Args:
        gm (torch.nn.Module): a model returned by :func:`fxquant.transform`.
        tablefmt (str, optional): any :mod:`tabulate` format, e.g. ``"github"``.

    Example:
        >>> from torch_geometric.nn.models import GCN
        >>> from fxquant import transform
        >>> print(summary(transform(GCN(4, 8, num_layers=2, out_channels=2), bits=12)))
        point          layer    site    format      bits  rounding     scale    grad    node override
        -------------  -------  ------  --------  ------  -----------  -------  ------  ---------------
        convs_0_quant  convs.0  output  top-12        12  toward_zero  -        ste     -
        convs_1_quant  convs.1  output  top-12        12  toward_zero  -        ste     -
    """
    if not isinstance(gm, GraphModule):
        raise TypeError(
            f"fxquant.summary expects the GraphModule fxquant.transform returns, got "
            f"{type(gm).__name__}; please pass gm = fxquant.transform(model, ...)"
        )
    rows = []
    for name, point in quantization_points(gm):
        c = point.config
        scale = c.scale_description()
        grad = c.grad.value + (f", grad {describe(c.grad_number)}" if c.grad_number else "")
        bits = c.number.bits
        rows.append([name, point.layer, point.site.value, describe(c.number), bits,
                     c.rounding.value, scale, grad, point.override_description()])
    if not rows:
        return "no fxquant quantization points in this model"
    return tabulate(
        rows,
        headers=["point", "layer", "site", "format", "bits", "rounding", "scale", "grad",
                 "node override"],
        tablefmt=tablefmt,
    )

