"""Tables for people: what a pass inserted. The report and the CLI are the only places
that format text for display."""

from __future__ import annotations

from tabulate import tabulate
from torch.fx import GraphModule

from fxquant.passes.insert_truncation import truncations
from fxquant.spec import RowOverride

__all__ = ["summary"]


def summary(gm: GraphModule, tablefmt: str = "simple") -> str:
    """A table of the truncation nodes in ``gm`` (also works on a reloaded GraphModule).

    Args:
        gm (torch.fx.GraphModule): a model returned by :func:`fxquant.transform`.
        tablefmt (str, optional): any :mod:`tabulate` format, e.g. ``"github"``.

    Example:
        >>> from torch_geometric.nn.models import GCN
        >>> from fxquant import transform
        >>> print(summary(transform(GCN(4, 8, num_layers=2, out_channels=2), bits=12)))
        node           after      bits  rounding     grad    row override
        -------------  -------  ------  -----------  ------  --------------
        convs_0_trunc  convs.0      12  toward_zero  ste     -
        convs_1_trunc  convs.1      12  toward_zero  ste     -
    """
    rows = []
    for t in truncations(gm):
        override = "-" if t.rows is None else RowOverride(t.rows, t.rows_bits).describe()
        rows.append([t.node.name, t.after, t.bits, t.rounding, t.grad, override])
    if not rows:
        return "no fxquant truncation nodes in this graph"
    return tabulate(
        rows, headers=["node", "after", "bits", "rounding", "grad", "row override"],
        tablefmt=tablefmt,
    )
