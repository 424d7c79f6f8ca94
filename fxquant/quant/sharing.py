"""What acts on several quantization points of a model at once: sharing a learned step
(:func:`share_step`) or a bit-width table (:func:`share_bits`), and fitting every learned
step again (:func:`refit_steps`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from fxquant.errors import FxquantTypeError, FxquantValueError
from fxquant.quant.points import QuantPoint

__all__ = ["refit_steps", "share_bits", "share_step"]


def refit_steps(model: nn.Module, *, widen: bool = False) -> int:
    """Fit every learned step (``range="lsq"``) of ``model`` again on its next training
    forward, as on the first one (the step that rounds that batch with the least error);
    returns how many points will. With ``widen=True`` a refit never narrows a grid: the
    step becomes the larger of the fitted one and the current one (a step not fitted yet,
    e.g. while ``QuantTraining(float_epochs=...)`` passes training forwards through, is
    simply fitted: its placeholder is not a grid to keep).

    A learned step is fitted once, on the first training batch, then learned. Trained
    from scratch, that batch comes from an untrained model whose activations are much
    smaller than the trained model's, and Adam moves ``log_step`` by about its learning
    rate per iteration: a step that starts 100x too small needs ~460 iterations at
    ``lr=0.01`` to catch up, and the grid clips meanwhile (a GCN on CiteSeer with int4
    everywhere stayed at chance: its logits' step started at 0.001). Calling this before
    each of the first training steps (a warm-up, as torch.ao QAT keeps its observers on
    for the first epochs) lets the steps follow the growing activations; the LSQ gradient
    takes over after the last call. It only clears a flag: under ``torch.compile`` the
    flags select among a few compiled graphs, each compiled once. Loading a state dict
    marks the steps fitted again.

    ``widen=True`` is for the warm-up: the least-error step of a grid with two to four
    levels clips the largest values of a heavy-tailed batch (messages of a sparse graph),
    and a clipped value passes no gradient; refits that narrow the grids as the weights
    shrink can starve the first layer of gradient for good (a GCN on CiteSeer with 1-2 bit
    messages stayed near chance on one seed of ten, its first layer's weights decaying).

    Example:
        >>> import fxquant
        >>> config = fxquant.QuantConfig("int4", scale="tensor", range="lsq")
        >>> gm = fxquant.transform(torch.nn.Sequential(torch.nn.Linear(4, 4)),
        ...                        fxquant.QuantMapping().set_name("0", config))
        >>> _ = gm(torch.randn(8, 4))               # the first training batch fits the step
        >>> point = gm.get_submodule("_0_quant")
        >>> before = float(point.step.detach())
        >>> fxquant.refit_steps(gm)
        1
        >>> _ = gm(100 * torch.randn(8, 4))         # fitted again: 100x larger values
        >>> float(point.step.detach()) > 10 * before
        True
        >>> fxquant.refit_steps(gm, widen=True)
        1
        >>> _ = gm(torch.randn(8, 4))               # smaller values: the step stays
        >>> float(point.step.detach()) > 10 * before
        True
    """
    if not isinstance(widen, bool):
        raise FxquantTypeError(f"refit_steps: widen must be True or False, got {widen!r}")
    points = [m for m in model.modules()
              if isinstance(m, QuantPoint) and m.learned_step is not None]
    for point in points:
        assert point.learned_step is not None
        point.learned_step.refit(widen)
    return len(points)


def share_step(model: nn.Module, point: str, source: str) -> None:
    """Make the quantization point named ``point`` round with the learned step of
    ``source`` (both ``range="lsq"``): the same :class:`~torch.nn.Parameter`, so the
    optimizer, ``state_dict``, ``torch.compile`` and :func:`refit_steps` see one step, fitted
    on ``source``'s first training batch.

    For a tensor rounded twice on its way, with only grid-keeping ops between (a layer's
    rounded output, a ReLU, the next layer's rounded input): on one step the second
    rounding keeps the first's values (ReLU maps an unsigned grid onto itself), where two
    steps learned apart re-round them, and two 1-bit grids whose steps drift more than 2x
    apart round everything to zero. PT2E's ``SharedQuantizationSpec`` shares quantization
    parameters the same way. Nothing changes on error.

    Example:
        >>> import fxquant
        >>> class Net(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)
        ...     def forward(self, x):
        ...         return self.b(self.a(x).relu())
        >>> config = fxquant.QuantConfig("uint1", scale="tensor", range="lsq")
        >>> gm = fxquant.transform(Net(), fxquant.QuantMapping()
        ...                        .set_name("a", config).set_name("b", config, site="input"))
        >>> fxquant.share_step(gm, "b_input_quant", "a_quant")
        >>> len(list(gm.parameters()))  # one step for both points
        5
    """
    points = _two_points(model, point, source, "share_step", "step_source",
                         lambda m: m.learned_step is not None,
                         "a learned step; both need range='lsq'")
    origin = points["source"].learned_step
    assert origin is not None
    order = _first_calls(model)
    if point in order and source in order and order[point] < order[source] \
            and not origin.step_fitted:  # (a fitted or loaded step: no fit to come)
        raise FxquantValueError(
            f"fxquant.share_step: point={point!r} runs before source={source!r} in the forward, "
            "but the shared step, not fitted yet, is fitted on the source's first training "
            "batch: the point "
            "would round that batch with the unfitted step. Please pass them the other way "
            f"around, fxquant.share_step(model, {source!r}, {point!r}) (one step either way)")
    target = points["point"]
    target.learned_step = origin  # the part itself: one step, one fit
    target.__dict__["step_source"] = source


def _first_calls(model: nn.Module) -> dict[str, int]:
    """Where the graph of a GraphModule first calls each of its submodules (the order a
    forward runs them in); empty for other models. Points inside a layer are not in it."""
    graph = getattr(model, "graph", None)
    order: dict[str, int] = {}
    if isinstance(graph, torch.fx.Graph):
        for i, node in enumerate(graph.nodes):
            if node.op == "call_module":
                order.setdefault(str(node.target), i)
    return order


def _two_points(model: nn.Module, point: str, source: str, api: str, link: str,
                has: Callable[[QuantPoint], bool], what: str) -> dict[str, QuantPoint]:
    """The quantization points named ``point`` and ``source``, checked to have ``what``
    and to form no chain of shares (``link``: the attribute naming a point's source)."""
    points = {}
    for role, name in (("point", point), ("source", source)):
        try:
            module = model.get_submodule(name)
        except AttributeError:
            names = [n for n, m in model.named_modules() if isinstance(m, QuantPoint)]
            raise FxquantValueError(f"fxquant.{api}: {role}={name!r} is not a submodule of the "
                             f"model; its quantization points: {names}") from None
        if not isinstance(module, QuantPoint) or not has(module):
            raise FxquantValueError(f"fxquant.{api}: {role}={name!r} is not a quantization point "
                             f"with {what}")
        points[role] = module
    if point == source:
        raise FxquantValueError(f"fxquant.{api}: point and source are both {point!r}")
    if points["source"].__dict__.get(link) is not None:
        raise FxquantValueError(f"fxquant.{api}: source={source!r} already shares "
                         f"{points['source'].__dict__[link]!r}'s; please pass that point as "
                         "the source")
    users = [n for n, m in model.named_modules()
             if isinstance(m, QuantPoint) and m.__dict__.get(link) == point]
    if users:
        raise FxquantValueError(f"fxquant.{api}: point={point!r} is the source of {users}; please "
                         f"share those from {source!r} first")
    return points


def share_bits(model: nn.Module, point: str, source: str) -> None:
    """Make the quantization point named ``point`` read its per-node bit-widths from
    ``source``'s table (both with :class:`~fxquant.quant.node_bits.NodeBits` of the same nodes
    and range): the same :class:`~torch.nn.Parameter` when learned (the same buffer when
    fixed), so each node has **one** bit-width for both sites, trained by the gradients of
    both, and stored once: :func:`fxquant.bit_report` counts the table's storage at
    ``source`` only.

    A2Q (Zhu et al., ICLR 2023) learns one bit-width per node and layer; sharing the table
    across a layer's sites (its messages, aggregation and output, keyed by their node) does
    the same, at a fraction of the storage of a table per site. Each point keeps its own
    record of the ranges it has seen, so a node unseen in training takes the bits of the
    seen node nearest in that point's range. Nothing changes on error.

    Example:
        >>> import fxquant
        >>> from fxquant.quant.node_bits import NodeBits
        >>> class Net(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)
        ...     def forward(self, x):
        ...         return self.b(self.a(x))
        >>> def config():
        ...     return fxquant.QuantConfig("int8", scale="tensor", range="lsq",
        ...                                node_bits=NodeBits.learned_init(6, 4.0))
        >>> gm = fxquant.transform(Net(), fxquant.QuantMapping()
        ...                        .set_name("a", config()).set_name("b", config()))
        >>> fxquant.share_bits(gm, "b_quant", "a_quant")
        >>> a, b = gm.get_submodule("a_quant"), gm.get_submodule("b_quant")
        >>> b.node_widths.bits is a.node_widths.bits
        True
    """
    points = _two_points(model, point, source, "share_bits", "bits_source",
                         lambda m: m.config.node_bits is not None,
                         "per-node bit-widths (QuantConfig(node_bits=NodeBits(...)))")
    a, b = (points[r].config.node_bits for r in ("point", "source"))
    assert a is not None and b is not None
    if (a.learned, a.num_nodes, a.min_bits, a.max_bits) != \
            (b.learned, b.num_nodes, b.min_bits, b.max_bits):
        raise FxquantValueError(f"fxquant.share_bits: point={point!r} has {a!r} and source={source!r} "
                         f"has {b!r}; a shared table needs the same nodes, the same range and "
                         "both learned or both fixed")
    target, origin = points["point"].node_widths, points["source"].node_widths
    assert target is not None and origin is not None
    target.bits = origin.bits  # (a parameter when learned, a buffer when fixed)
    points["point"].__dict__["bits_source"] = source
