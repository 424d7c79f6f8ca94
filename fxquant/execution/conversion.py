""":func:`convert`: a trained transformed model onto integer kernels, as one pass over its
graph (torch.ao's ``convert_fx`` contract, with a report of what runs where)."""

from __future__ import annotations

import copy
import inspect
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.fx import GraphModule, Node
from torch_geometric.nn import MessagePassing
from torch_geometric.nn.dense.linear import Linear as PygLinear

from fxquant.errors import FxquantTypeError, FxquantValueError
from fxquant.execution._points import PointSpec, read_point
from fxquant.execution.layers import (
    FLOAT,
    INTEGER,
    RESCALE,
    IntLayer,
    Placement,
    Unconvertible,
    layer_classes,
)
from fxquant.execution.model import ConversionReport, ConvertedModel, Step
from fxquant.execution.quantizer import IntQuantizer
from fxquant.fx.guards import FixedArguments
from fxquant.quant import QuantPoint, quantization_points
from fxquant.quant.nodes import NodeIds, set_node_ids

__all__ = ["ConversionError", "convert"]

_RELU_FUNCTIONS = (F.relu, torch.relu)
_DROPOUT_FUNCTIONS = (F.dropout,)
_IDENTITY_MODULES = (nn.Dropout, nn.Identity)
#: linear layers called on their own, converted as layers
_LINEARS = (nn.Linear, PygLinear)


class ConversionError(FxquantValueError):
    """A part of the model cannot run on integer kernels (``strict=True``); the message
    names it, says why and what to change."""


def convert(gm: GraphModule, *, strict: bool = True, accumulate: str = "auto",
            ties: str = "simulation") -> ConvertedModel:
    """A trained model returned by :func:`fxquant.transform` on integer kernels.

    Values between quantization points are stored as integer codes with their scales;
    products of codes by weight codes run as ``int8 x int8 -> int32``
    (``torch._int_mm``), messages are rounded to the message point's codes and summed
    into ``int32``, and the accumulators are rescaled in float32 exactly where the
    simulation computes in float32 (normalization coefficients, biases). The model computes
    what the transformed model computes in evaluation: the same codes at every point
    (up to float32 rounding of the rescaling: :func:`fxquant.execution.compare` counts).

    Converted layers: PyG's ``GCNConv``, ``GINConv`` (an MLP of linears and ReLUs, or one
    linear) and ``GATConv`` (its attention softmax in float32) with their sum
    aggregation, ``SAGEConv`` with a sum or a mean (a max or min in float32), and linear
    layers called on their own (``torch.nn.Linear``, PyG's ``Linear``: a classifier head);
    between them ReLU, dropout (off in evaluation) and identities. Points: integer formats
    of at most 8 bits (symmetric, unsigned, asymmetric, mid-rise), rounding to nearest or
    toward zero, a learned step, a running or widest range, or the min/max or percentile
    of the values themselves, per tensor or per row, and per-node bit-widths.

    Args:
        gm (GraphModule): a model returned by :func:`fxquant.transform` (or a recipe's
            ``run.model``), trained; it is not changed.
        strict (bool, optional): raise :class:`ConversionError` for anything that cannot
            run on integers (a float format, top-N truncation, stochastic rounding, a
            layer of another kind, a float32 computation between two integer ones such as
            GAT's softmax or a product with float32 weights), naming the point or part,
            why, and what to change. With :obj:`False` those parts run in float32 (a point
            that cannot be integer keeps its simulated rounding) and
            ``model.report`` lists them. (default: :obj:`True`)
        accumulate (str, optional): what message codes are summed in: ``"int32"``, or
            ``"auto"``: float32 where every sum is exact there (in-degree x 128 <=
            2**24), which holds the same integers and which torch's CPU kernels add 2-3x
            faster, else int32. (default: ``"auto"``)
        ties (str, optional): where a value lies on a rounding boundary of the next point
            (within float32 noise: a mean of two codes halfway between two levels, zero on
            a mid-rise grid), the simulation's own float32 rounding error picks the code.
            ``"simulation"``: those rows (and the rows holding a range a step is taken
            from) are recomputed as the simulation computes them, so the codes agree with
            it; ``"nearest"``: the integer path's exact values are rounded as they are
            (faster; one level from the simulation's code at such ties). (default:
            ``"simulation"``)

    Returns:
        ConvertedModel: called like ``gm`` (``node_ids=`` included); ``report`` says what
        runs where.

    Example:
        >>> import torch, fxquant
        >>> from torch_geometric.nn import GCNConv
        >>> class GCN(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.conv1, self.conv2 = GCNConv(8, 16), GCNConv(16, 3)
        ...     def forward(self, x, edge_index):
        ...         return self.conv2(self.conv1(x, edge_index).relu(), edge_index)
        >>> int8 = fxquant.QuantConfig("int8", scale="tensor")
        >>> mapping = fxquant.QuantMapping()
        >>> for site in ("input", "weight", "message", "aggregate", "output"):
        ...     mapping = mapping.set_global(int8, site=site)
        >>> gm = fxquant.transform(GCN(), mapping).eval()
        >>> model = fxquant.convert(gm)
        >>> x, edge_index = torch.rand(10, 8), torch.randint(0, 10, (2, 30))
        >>> model.report.counts()
        {'integer': 13, 'rescale': 7, 'float32': 0}
        >>> (model(x, edge_index).argmax(1) == gm(x, edge_index).argmax(1)).float().mean() > 0.8
        tensor(True)
    """
    if not isinstance(gm, GraphModule):
        raise FxquantTypeError(f"fxquant.convert expects the GraphModule fxquant.transform "
                               f"returns, got {type(gm).__name__}")
    if not isinstance(strict, bool):
        raise FxquantTypeError(f"convert: strict must be True or False, got {strict!r}")
    if accumulate not in ("auto", "int32"):
        raise FxquantValueError(f"convert: accumulate={accumulate!r} is not one of "
                                "['auto', 'int32']")
    if ties not in ("simulation", "nearest"):
        raise FxquantValueError(f"convert: ties={ties!r} is not one of "
                                "['simulation', 'nearest']")
    points = dict(quantization_points(gm))
    if not points:
        raise FxquantValueError("fxquant.convert: this model has no quantization points; there "
                                "is nothing to run on integers. Please transform it with an "
                                "integer format first")
    return _Converter(gm, points, strict, accumulate, ties).run()


class _Converter:
    """Walks the graph once, building the steps; raises before anything is built."""

    def __init__(self, gm: GraphModule, points: dict[str, QuantPoint], strict: bool,
                 accumulate: str = "auto", ties: str = "simulation") -> None:
        self.gm = gm
        self.strict = strict
        self.accumulate = accumulate
        self.ties = ties
        self.specs = {name: read_point(name, p) for name, p in points.items()}
        self.steps: list[Step] = []
        self.points: dict[str, nn.Module] = {}
        self.layers: dict[str, nn.Module] = {}
        self.kept: dict[str, nn.Module] = {}
        self.placements: list[Placement] = []
        self.names: dict[Node, str] = {}
        self.integer: dict[str, bool] = {}  # value name -> holds codes
        self.zero_code: dict[str, bool] = {}  # value name -> zero is one of its codes
        self.inputs: list[tuple[str, Any]] = []

    # -- helpers --------------------------------------------------------------------------

    def _refuse(self, what: str, why: str) -> None:
        raise ConversionError(f"fxquant.convert: {what} cannot run on integers: {why}. "
                              "(Or pass strict=False to run it in float32, listed in "
                              "model.report.)")

    def _ref(self, arg: Any) -> Any:
        if isinstance(arg, Node):
            if arg not in self.names:
                raise FxquantValueError(f"fxquant.convert: {arg.format_node()} uses a value "
                                        "the converted model does not have")
            return self.names[arg]
        if isinstance(arg, tuple):  # (kept a tuple: a dict key, a bipartite pair)
            return {"tuple": [self._ref(a) for a in arg]}
        if isinstance(arg, list):
            return [self._ref(a) for a in arg]
        if arg is None or isinstance(arg, (bool, int, float, str)):
            return {"const": arg}
        raise FxquantValueError(f"fxquant.convert: an argument {arg!r} of type "
                                f"{type(arg).__name__} cannot be stored in a converted model")

    def _emit(self, node: Node, op: str, target: str, args: list[Any],
              kwargs: dict[str, Any] | None = None, integer: bool = False) -> None:
        out = node.name
        self.steps.append(Step(op, target, args, kwargs or {}, out))
        self.names[node] = out
        self.integer[out] = integer

    def _is_integer(self, arg: Any) -> bool:
        return isinstance(arg, Node) and self.integer.get(self.names.get(arg, ""), False)

    def _module_key(self, target: str) -> str:
        return target.replace(".", "__")

    # -- the pass -------------------------------------------------------------------------

    def run(self) -> ConvertedModel:
        for node in self.gm.graph.nodes:
            handler = getattr(self, f"_{node.op}")
            handler(node)
        self._check_strict()
        return ConvertedModel(self.inputs, self.steps, self.points, self.layers, self.kept,
                              self.placements)

    def _check_strict(self) -> None:
        if not self.strict:
            return
        between = ConversionReport(self.placements).between_integers
        if between:
            first = between[0]
            more = f"; so do {', '.join(p.where for p in between[1:])}" \
                if len(between) > 1 else ""
            self._refuse(f"{first.where!r} ({first.how}, between integer parts)",
                         first.why + more)

    def _placeholder(self, node: Node) -> None:
        default = node.args[0] if node.args else inspect.Parameter.empty
        if default is not inspect.Parameter.empty and not (
                default is None or isinstance(default, (bool, int, float, str))):
            default = inspect.Parameter.empty
        self.inputs.append((str(node.target), default))
        self.names[node] = str(node.target)
        self.integer[str(node.target)] = False

    def _get_attr(self, node: Node) -> None:
        value = _attr(self.gm, str(node.target))
        if isinstance(value, NodeIds):
            self.names[node] = "_node_ids"
            return
        raise FxquantValueError(f"fxquant.convert: {node.format_node()} reads an attribute of the "
                                "model, which the converted model does not carry")

    def _call_function(self, node: Node) -> None:
        target = node.target
        if target is set_node_ids:
            return  # the converted model reads node_ids= itself
        if target in _RELU_FUNCTIONS:
            self._relu(node)
            return
        if target in _DROPOUT_FUNCTIONS:
            if _drops_in_evaluation(node):
                self._float(node, f"function dropout ({node.name})", why=(
                    "it drops values in evaluation too (training=True, the default of "
                    "F.dropout); please pass training=self.training to turn it off there"))
                return
            self._identity(node)
            return
        self._float(node, f"function {getattr(target, '__name__', target)}")

    def _call_method(self, node: Node) -> None:
        if node.target == "relu":
            self._relu(node)
            return
        self._float(node, f"method .{node.target}()")

    def _identity(self, node: Node) -> None:
        arg = node.args[0]
        self._emit(node, "identity", "", [self._ref(arg)], integer=self._is_integer(arg))
        self.zero_code[node.name] = self.zero_code.get(self.names.get(arg, ""), False) \
            if isinstance(arg, Node) else False

    def _relu(self, node: Node) -> None:
        """A ReLU: a clamp of codes where zero is one of them (codes still), else of their
        values (float32 values, as :func:`relu_codes` computes them)."""
        arg = node.args[0]
        codes = self._is_integer(arg) and isinstance(arg, Node) and \
            self.zero_code.get(self.names.get(arg, ""), False)
        self._emit(node, "relu", "", [self._ref(arg)], integer=codes)
        self.zero_code[node.name] = codes
        self._place_relu(node)

    def _place_relu(self, node: Node) -> None:
        if self._is_integer(node):
            self.placements.append(Placement(node.name, INTEGER,
                                             "ReLU on the codes (a clamp at the zero code)"))
        else:
            self.placements.append(Placement(node.name, RESCALE, "ReLU on float32 values" + (
                " (the codes' values: zero is not one of the codes)"
                if self._is_integer(node.args[0]) else "")))

    def _call_module(self, node: Node) -> None:
        target = str(node.target)
        module = self.gm.get_submodule(target)
        if isinstance(module, QuantPoint):
            self._point(node, target, module)
        elif isinstance(module, FixedArguments):
            key = self._module_key(target)
            self.kept[key] = FixedArguments(module.fixed, module.model, module.unused)
            self.steps.append(Step("guard", key, [self._ref(a) for a in node.args]))
            self.names[node] = "_guard"
        elif isinstance(module, _IDENTITY_MODULES):
            self._identity(node)
        elif isinstance(module, nn.ReLU):
            self._relu(node)
        elif isinstance(module, (MessagePassing, *_LINEARS)):
            self._layer(node, target, module)
        else:
            self._float(node, f"module {target!r} ({type(module).__name__})", module)

    def _output(self, node: Node) -> None:
        arg = node.args[0]
        outputs = list(arg) if isinstance(arg, (tuple, list)) else [arg]
        if not outputs or not all(isinstance(a, Node) for a in outputs):
            def kind_of(v: Any) -> str:
                return "dict" if isinstance(v, dict) else "constant" if v is None or \
                    isinstance(v, (bool, int, float, str)) else type(v).__name__
            kind = kind_of(arg)
            if isinstance(arg, (tuple, list)):
                kind += " holding " + (f"a {kind_of(next(a for a in outputs if not isinstance(a, Node)))}"
                                       if outputs else "nothing")
            raise FxquantValueError(f"fxquant.convert: the model returns a {kind}; the "
                                    "converted model returns tensors (one, or a tuple or "
                                    "list of them): please convert a model whose forward "
                                    "returns them (of a heterogeneous model, one node type's "
                                    "output, e.g. out['paper'])")
        self.steps.append(Step("output", "", [self._ref(arg)]))
        if any(self._is_integer(a) for a in outputs):
            self.placements.append(Placement("output", RESCALE, "codes read with their scale "
                                             "(float32)"))

    # -- points and layers ------------------------------------------------------------------

    def _point(self, node: Node, target: str, point: QuantPoint) -> None:
        spec = self.specs[target]
        if spec.problems:
            if self.strict:
                self._refuse(f"the quantization point {target!r} ({spec.label})",
                             "; ".join(spec.problems))
            key = self._module_key(target)
            self.kept[key] = copy.deepcopy(point).eval()
            self._emit(node, "float", key, [self._ref(node.args[0])])
            self.placements.append(Placement(spec.label, FLOAT, "simulated rounding in float32",
                                             "; ".join(spec.problems)))
            return
        self.points[target] = quantizer = IntQuantizer(spec)
        self._emit(node, "point", target, [self._ref(node.args[0])], integer=True)
        self.zero_code[node.name] = quantizer.zero_is_code
        self.placements.append(Placement(spec.label, INTEGER,
                                         f"rounded to {spec.describe()}"))
        source = node.args[0] if node.args else None
        layer = self.layers.get(self._module_key(str(source.target))) \
            if isinstance(source, Node) and source.op == "call_module" else None
        if isinstance(layer, IntLayer) and layer.settles_output() and \
                quantizer.reads_every_row and self.ties == "simulation":
            self.placements.append(Placement(
                f"{layer.name}: output", FLOAT, "every row recomputed in float32 as the "
                "simulation computes it", f"the {spec.label} reads its step from every row "
                "(a range per row, or a percentile), which the integer product gives an ulp "
                "apart; convert with ties='nearest' to keep the integer product"))

    def _layer(self, node: Node, target: str, module: MessagePassing) -> None:
        inner = {k: v for k, v in self.specs.items() if v.layer == target
                 and v.site not in ("input", "output")}
        refused = {k: v for k, v in inner.items() if v.problems}
        cls = layer_classes().get(type(module))
        why = ""
        if cls is None:
            why = (f"its class {type(module).__name__} has no integer form (converted: "
                   f"{', '.join(dict.fromkeys(c.__name__ for c in layer_classes()))})")
        elif refused:
            name, spec = next(iter(refused.items()))
            why = f"its quantization point {name!r} ({spec.label}): {'; '.join(spec.problems)}"
        elif isinstance(node.args[0] if node.args else node.kwargs.get("x"), (tuple, list)):
            why = ("it is called on a bipartite pair of features (x_src, x_dst), as "
                   "heterogeneous models call it; the converted layers take one node type's "
                   "features")
        layer: IntLayer | None = None
        if not why:
            assert cls is not None
            quantizers = {_site_key(v): IntQuantizer(v) for v in inner.values()}
            try:
                integer = self._is_integer(node.args[0] if node.args else None)
                layer = cls(target, module, quantizers, integer)  # type: ignore[call-arg]
                layer.configure(integer, self.accumulate, self.ties)
            except Unconvertible as e:
                why = str(e).split(": ", 1)[-1]
            unapplied = [(name, spec) for name, spec in inner.items()
                         if layer is not None and not layer.applies(_site_key(spec))]
            if unapplied:
                layer = None
                name, spec = unapplied[0]
                why = (f"its quantization point {name!r} ({spec.label}) is not one the "
                       f"converted {type(module).__name__} applies; please leave "
                       f"site={spec.site!r} out of this layer's mapping entry")
        if layer is None:
            if self.strict:
                self._refuse(f"layer {target!r}", why if "please" in why else
                             why + "; please convert a model of converted layers")
            self._float(node, f"layer {target!r} ({type(module).__name__})", module,
                        why=why + "; it runs its simulation in float32")
            return
        self._check_arguments(node, target, module)
        key = self._module_key(target)
        if key not in self.layers:
            self.layers[key] = layer
        args = [self._ref(a) for a in node.args]
        kwargs = {k: self._ref(v) for k, v in node.kwargs.items()}
        self._emit(node, "layer", key, args, kwargs)
        self.placements.extend(layer.placements)

    def _check_arguments(self, node: Node, target: str, module: MessagePassing) -> None:
        """The converted layers take ``(x, edge_index[, edge_weight])`` and no per-edge
        features; a traced call that passes others is refused."""
        allowed = {"edge_weight"} if type(module).__name__ == "GCNConv" else set()
        for key, value in node.kwargs.items():
            if key in ("edge_attr", "size") and (value is None or (
                    isinstance(value, Node) and value.op == "placeholder")):
                continue
            if key not in allowed:
                raise ConversionError(f"fxquant.convert: layer {target!r} is called with "
                                      f"{key}=, which the converted layer does not take")

    def _float(self, node: Node, what: str, module: nn.Module | None = None,
               why: str = "") -> None:
        why = why or ("the converted model has no integer form of it: it runs on float32 "
                      "values")
        if self.strict and any(self._is_integer(a) for a in node.all_input_nodes):
            self._refuse(what, why)
        key = self._module_key(str(node.target)) if module is not None else node.name
        if module is None:
            fn = node.target
            module = _Function(fn, node.op)
        self.kept[key] = copy.deepcopy(module).eval()
        args = [self._ref(a) for a in node.args]
        kwargs = {k: self._ref(v) for k, v in node.kwargs.items()}
        self._emit(node, "float", key, args, kwargs)
        self.placements.append(Placement(what, FLOAT, "float32 (kept as it is)", why))


class _Function(nn.Module):
    """A function or method call kept in float32 (``strict=False``)."""

    def __init__(self, fn: Any, op: str) -> None:
        super().__init__()
        self.fn = fn
        self.op = op

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.op == "call_method":
            return getattr(args[0], self.fn)(*args[1:], **kwargs)
        return self.fn(*args, **kwargs)


def _drops_in_evaluation(node: Node) -> bool:
    """Whether a traced ``F.dropout(input, p=0.5, training=True)`` call drops values
    whatever the model's mode (``training`` a constant True, as it is by default)."""
    p = node.kwargs.get("p", node.args[1] if len(node.args) > 1 else 0.5)
    training = node.kwargs.get("training", node.args[2] if len(node.args) > 2 else True)
    return training is not False and not (isinstance(p, (int, float)) and p == 0)


def _site_key(spec: PointSpec) -> str:
    return spec.site + (f".{spec.tensor}" if spec.tensor else "")


def _attr(gm: GraphModule, target: str) -> Any:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value

