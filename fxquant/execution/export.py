""":func:`export_onnx`: a converted model as an ONNX graph that ONNX Runtime's CPU provider
runs on integers.

The graph is written node by node from the converted model's program (not traced), so it
holds exactly the integer computation: products as ``MatMulInteger`` (the codes + 128 as
``uint8`` x ``int8`` weights -> ``int32``), aggregation as ``ScatterND`` with
``reduction="add"`` into ``int32`` (whole rows added), and the float32 rescaling between
them; between steps the codes are held as the rounding makes them (whole numbers in
float32) and cast where an integer operator reads them. Messages that are their sender's
values (GIN, GraphSAGE) are rounded once per node and their codes gathered per edge; steps
taken from the values (min/max) are computed in the graph. Inputs: ``x`` (float32
features, or the uint8 codes they are stored as), ``edge_index`` (int64), and
``node_ids`` (int64, one global id per row) where a point has per-node widths. Output: the
logits (float32).

Needs the ``export`` extra: ``pip install "fxquant[export]"`` (onnx, onnxruntime,
onnxscript).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from fxquant.errors import FxquantImportError, FxquantTypeError, FxquantValueError
from fxquant.execution.kernels import QTensor
from fxquant.execution.layers import (
    IntGCNConv,
    IntGINConv,
    IntLayer,
    IntLinear,
    IntSAGEConv,
    WeightCodes,
    nn_path,
)
from fxquant.execution.model import ConvertedModel
from fxquant.execution.quantizer import IntQuantizer

__all__ = ["OPSET", "export_onnx", "onnx_inputs"]

#: the ONNX opset written (ScatterND with reduction, Reduce* with axes as inputs)
OPSET = 18
#: the IR version written: that of opset 18, which every ONNX Runtime since 1.14 reads
IR_VERSION = 8


class ExportError(FxquantValueError):
    """A part of the converted model has no ONNX form here; the message names it."""


def _onnx() -> Any:
    try:
        import onnx
    except ImportError as e:
        raise FxquantImportError("export_onnx needs the onnx package: pip install "
                                 "'fxquant[export]'") from e
    return onnx


def export_onnx(model: ConvertedModel, path: str | os.PathLike[str], *,
                feature_dim: int | None = None, float32: bool = False,
                stored_input: bool = False) -> None:
    """Write ``model`` to ``path`` as an ONNX model (opset :data:`OPSET`).

    Args:
        model (ConvertedModel): :func:`fxquant.convert`'s result, of ``GCNConv``,
            ``SAGEConv``, ``GINConv`` and linear layers with every point integer (a part kept in
            float32, a GAT layer, a learned per-node width table with nodes it never saw,
            are refused, naming the part).
        path (str or Path): the ``.onnx`` file.
        feature_dim (int, optional): the features' width, written into the input's shape.
            (default: :obj:`None`: left symbolic)
        float32 (bool, optional): write the same graph without any rounding, on the float32
            weights the model was converted from: the float32 reference that ONNX Runtime
            runs beside the integer graph. (default: :obj:`False`)
        stored_input (bool, optional): take the features as the codes they are stored as
            (``model.quantize_input(x)``): inputs ``x`` (the codes + 128 as uint8, the
            operand type ONNX Runtime's integer products are fastest on), ``x_scale`` and
            ``x_shift`` (float32, shape ``[1, 1]``, or ``[nodes, 1]`` for a scale per
            row), which :func:`onnx_inputs` makes from the stored codes; else ``x`` is
            float32 and rounded in the graph. (default: :obj:`False`)

    Example:
        >>> import os, tempfile, torch, fxquant
        >>> from fxquant.execution import export_onnx
        >>> from torch_geometric.nn.models import GCN
        >>> mapping = fxquant.QuantMapping()
        >>> for site in ("input", "weight", "message", "aggregate", "output"):
        ...     mapping = mapping.set_global(fxquant.QuantConfig("int8", scale="tensor"),
        ...                                  site=site)
        >>> gm = fxquant.transform(GCN(4, 8, num_layers=2, out_channels=2), mapping).eval()
        >>> path = os.path.join(tempfile.mkdtemp(), "gcn.onnx")
        >>> export_onnx(fxquant.convert(gm), path)
        >>> import onnxruntime
        >>> session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        >>> x, ei = torch.randn(5, 4), torch.tensor([[0, 1, 2], [1, 2, 3]])
        >>> out = session.run(None, {"x": x.numpy(), "edge_index": ei.numpy()})[0]
        >>> out.shape
        (5, 2)
    """
    if not isinstance(model, ConvertedModel):
        raise FxquantTypeError(f"export_onnx expects a ConvertedModel, got {type(model).__name__}")
    if stored_input and float32:
        raise ExportError("export_onnx: float32=True writes the graph of float32 features "
                          "(the reference); stored_input=True applies to the integer graph, "
                          "please pass one of them")
    if stored_input and model.input_point is None:
        raise ExportError("export_onnx: stored_input=True takes the features as the codes "
                          "of the point on the model's first input, and this model has none; "
                          "please export it with float32 features (stored_input=False)")
    onnx = _onnx()
    builder = _Builder(onnx, model, float32, stored_input)
    graph_model = builder.build(feature_dim)
    onnx.checker.check_model(graph_model)
    onnx.save(graph_model, os.fspath(path))


class _Unexported:
    """A model input the exported graph does not take (its name)."""

    def __init__(self, name: str) -> None:
        self.name = name


class _Q:
    """Codes in the graph: the int8 tensor's name, and the names of its scale and shift
    (each ``[]`` or ``[rows, 1]``); ``floats``: the same codes as float32 (where the
    rounding made them), from which a product takes them as ``uint8`` (the operand type
    ONNX Runtime's integer products are fastest on); ``unsigned``: the codes + 128 as
    ``uint8`` where the graph takes them so (stored features), and ``codes`` then made
    from them where a step needs them (``make_codes``)."""

    def __init__(self, codes: str | None, scale: str, shift: str, floats: str | None = None,
                 unsigned: str | None = None,
                 make_codes: Callable[[], str] | None = None) -> None:
        self._codes, self.scale, self.shift, self.floats = codes, scale, shift, floats
        self.unsigned, self._make_codes = unsigned, make_codes
        #: whether zero is a code (see :attr:`IntQuantizer.zero_is_code`)
        self.zero_code = True

    @property
    def codes(self) -> str:
        if self._codes is None:
            assert self._make_codes is not None
            self._codes = self._make_codes()
        return self._codes


def onnx_inputs(x: Tensor | QTensor, edge_index: Tensor, node_ids: Tensor | None = None
                ) -> dict[str, Any]:
    """The inputs of a graph :func:`export_onnx` wrote, as NumPy arrays for ONNX Runtime's
    ``session.run(None, inputs)``: float32 features ``x``, or the codes features are
    stored as (``model.quantize_input(x)``, for a graph written with
    ``stored_input=True``), the graph, and the nodes' global ids where a point has
    per-node widths.

    Example:
        >>> import torch
        >>> from fxquant.execution import onnx_inputs
        >>> feed = onnx_inputs(torch.ones(3, 2), torch.tensor([[0, 1], [1, 2]]))
        >>> sorted(feed), feed["x"].dtype
        (['edge_index', 'x'], dtype('float32'))
    """
    feed: dict[str, Any] = {"edge_index": edge_index.detach().cpu().to(torch.int64).numpy()}
    if isinstance(x, QTensor):
        def column(v: Tensor | float) -> Any:
            return torch.as_tensor(v, dtype=torch.float32).detach().cpu().reshape(-1, 1).numpy()
        # (the codes + 128 as uint8: their bytes with the top bit flipped)
        unsigned = (x.codes.detach().cpu().view(torch.uint8) ^ 128).numpy()
        feed.update(x=unsigned, x_scale=column(x.scale), x_shift=column(x.shift))
    else:
        feed["x"] = x.detach().cpu().to(torch.float32).numpy()
    if node_ids is not None:
        feed["node_ids"] = node_ids.detach().cpu().to(torch.int64).numpy()
    return feed


class _Builder:
    def __init__(self, onnx: Any, model: ConvertedModel, float32: bool = False,
                 stored_input: bool = False) -> None:
        self.onnx = onnx
        self.float32 = float32
        self.stored_input = stored_input
        self.h = onnx.helper
        self.model = model
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.count = 0
        self.needs_ids = not float32 and any(q.widths is not None for q in _quantizers(model))

    # -- small helpers --------------------------------------------------------------------

    def name(self, base: str) -> str:
        self.count += 1
        return f"{base}_{self.count}"

    def op(self, kind: str, inputs: list[str], **attrs: Any) -> str:
        out = self.name(kind.lower())
        self.nodes.append(self.h.make_node(kind, inputs, [out], **attrs))
        return out

    def const(self, value: Any, dtype: torch.dtype = torch.float32, base: str = "c") -> str:
        t = value if isinstance(value, Tensor) else torch.tensor(value, dtype=dtype)
        t = t.detach().cpu()
        if t.dtype != dtype:
            t = t.to(dtype)
        name = self.name(base)
        self.inits.append(self.onnx.numpy_helper.from_array(t.numpy(), name))
        return name

    def cast(self, x: str, to: Any) -> str:
        return self.op("Cast", [x], to=to)

    @property
    def FLOAT(self) -> Any:
        return self.onnx.TensorProto.FLOAT

    # -- the program ----------------------------------------------------------------------

    def build(self, feature_dim: int | None) -> Any:
        model = self.model
        tp = self.onnx.TensorProto
        features = ["nodes", feature_dim or "features"]
        if self.stored_input:
            inputs = [self.h.make_tensor_value_info("x", tp.UINT8, features),
                      self.h.make_tensor_value_info("x_scale", tp.FLOAT, ["scale_rows", 1]),
                      self.h.make_tensor_value_info("x_shift", tp.FLOAT, ["shift_rows", 1])]
        else:
            inputs = [self.h.make_tensor_value_info("x", tp.FLOAT, features)]
        inputs.append(self.h.make_tensor_value_info("edge_index", tp.INT64, [2, "edges"]))
        if self.needs_ids:
            inputs.append(self.h.make_tensor_value_info("node_ids", tp.INT64, ["nodes"]))
        env: dict[str, Any] = {}
        names = [n for n, _ in model.signature]
        if len(names) < 2:
            raise ExportError("export_onnx: the model takes fewer than two inputs (x, "
                              "edge_index)")
        stored = _Q(None, "x_scale", "x_shift", unsigned="x", make_codes=lambda: self.cast(
            self.op("Sub", [self.cast("x", self.FLOAT), self.const(128.0)]),
            tp.INT8)) if self.stored_input else None
        if stored is not None:
            first = model.point(model.input_point) if model.input_point else None
            stored.zero_code = first is not None and first.zero_is_code
        env[names[0]], env[names[1]] = stored or "x", "edge_index"
        # (an input left at its default None is None in the graph; node_ids is an input
        # of the graph where widths read it)
        for name, default in model.signature[2:]:
            env[name] = None if name == "node_ids" or default is None else _Unexported(name)
        output = None
        for step in model.steps:
            args = [env.get(a) if isinstance(a, str) else None for a in step.args]
            kwargs = {k: env.get(v) if isinstance(v, str) else None
                      for k, v in step.kwargs.items()}
            unexported = [a.name for a in (*args, *kwargs.values())
                          if isinstance(a, _Unexported)]
            if unexported and step.op != "guard":
                what = f"layer {model.layers[step.target].name!r}" if step.op == "layer" \
                    else repr(step.out)
                raise ExportError(f"export_onnx: the model's input {unexported[0]!r} is used "
                                  f"by {what}; the exported graph takes x and edge_index (and "
                                  "node_ids) only: please export a model whose forward uses "
                                  "no other input (edge weights and edge features are not "
                                  "exported)")
            if step.op == "point":
                if stored is not None and args[0] is stored \
                        and step.target == model.input_point:
                    env[step.out] = stored  # the features, stored as this point's codes
                    continue
                env[step.out] = self.quantize(self.model.point(step.target),
                                              self.as_float(args[0]))
            elif step.op == "layer":
                env[step.out] = self.layer(model.layers[step.target], args)
            elif step.op == "relu":
                env[step.out] = self.relu(args[0])
            elif step.op == "identity":
                env[step.out] = args[0]
            elif step.op == "guard":
                continue
            elif step.op == "output":
                if not isinstance(step.args[0], str):
                    raise ExportError("export_onnx: the model returns a tuple or list of "
                                      "tensors; the exported graph has one output (the "
                                      "logits): please export a model whose forward returns "
                                      "one tensor")
                output = self.as_float(args[0])
            else:
                raise ExportError(f"export_onnx: the step {step.out!r} runs "
                                  f"{step.target!r} in float32 through Python code, which has "
                                  "no ONNX form here; please convert a model whose every part "
                                  "is converted (see model.report)")
        assert output is not None
        self.nodes.append(self.h.make_node("Identity", [output], ["logits"]))
        used = {name for node in self.nodes for name in node.input}
        self.inits = [t for t in self.inits if t.name in used]
        graph = self.h.make_graph(self.nodes, "fxquant_converted", inputs, [
            self.h.make_tensor_value_info("logits", tp.FLOAT, ["nodes", "classes"])],
            initializer=self.inits)
        return self.h.make_model(graph, opset_imports=[self.h.make_opsetid("", OPSET)],
                                 producer_name="fxquant", ir_version=IR_VERSION)

    def code_floats(self, v: _Q) -> str:
        """``v``'s codes as float32 (made once: from the rounding, from the stored uint8
        codes, else cast)."""
        if v.floats is None:
            if v.unsigned is not None:
                v.floats = self.op("Sub", [self.cast(v.unsigned, self.FLOAT),
                                           self.const(128.0)])
            else:
                v.floats = self.cast(v.codes, self.FLOAT)
        return v.floats

    def as_float(self, v: Any) -> str:
        if isinstance(v, _Q):
            if v.floats is None and v.unsigned is not None:  # (the 128 in the shift)
                levels = self.op("Add", [self.cast(v.unsigned, self.FLOAT), self.op(
                    "Sub", [v.shift, self.const(128.0)])])
            else:
                levels = self.op("Add", [self.code_floats(v), v.shift])
            return self.op("Mul", [levels, v.scale])
        return v

    def relu(self, v: Any) -> Any:
        if isinstance(v, _Q) and v.zero_code:  # zero is the code -shift (a whole number)
            floats = self.op("Max", [self.code_floats(v), self.op("Neg", [v.shift])])
            return _Q(None, v.scale, v.shift, floats, make_codes=lambda: self.cast(
                floats, self.onnx.TensorProto.INT8))
        return self.op("Relu", [self.as_float(v)])  # (no zero code: the values, as relu_codes)

    # -- rounding -------------------------------------------------------------------------

    def quantize(self, q: IntQuantizer, x: str, row_nodes: str | None = None,
                 bounds: tuple[str, str] | None = None) -> _Q:
        """``x`` (float32) rounded to ``q``'s codes (as :class:`RoundPlan` does); a step
        taken from the values' range reads it from ``bounds`` (the names of its least and
        largest value, shape ``[]``) where given, else from ``x``."""
        if self.float32:
            return x  # type: ignore[return-value]
        out = self._quantize(q, x, row_nodes, bounds)
        out.zero_code = q.zero_is_code
        return out

    def _quantize(self, q: IntQuantizer, x: str, row_nodes: str | None,
                  bounds: tuple[str, str] | None) -> _Q:
        spec, grid = q.spec, q.grid
        if spec.step_kind == "percentile":
            raise ExportError(f"export_onnx: the point {spec.module!r} ({spec.label}) takes "
                              "its step from a percentile of the values, which has no ONNX "
                              "form here; please use a min/max range or a learned step")
        if spec.pow2:
            raise ExportError(f"export_onnx: the point {spec.module!r} ({spec.label}) rounds "
                              "its step to a power of two, which is not exported; please "
                              "use scale='tensor' or 'row'")
        off = grid.offset
        if q.widths is not None:
            return self.per_node(q, x, row_nodes)
        qmin, qmax = q.code_range
        zp: str | None = None
        if spec.step_kind in ("learned", "observed"):
            assert q.step is not None
            scale = self.const(q.step.reshape(()), base="step")
            if spec.step_kind == "observed" and q.zero_point is not None:
                zp = self.const(q.zero_point.reshape(()))
            divide = spec.step_kind == "learned"
        else:
            per_row = spec.step_kind == "batch-row"
            if bounds is not None and not per_row:
                lo, hi = bounds
            else:
                axes = self.const([1] if per_row else [0, 1], torch.int64)
                lo = self.op("ReduceMin", [x, axes], keepdims=1 if per_row else 0)
                hi = self.op("ReduceMax", [x, axes], keepdims=1 if per_row else 0)
            scale, zp = self.int_scale(q, lo, hi)
            divide = False
        y = self.op("Div", [x, scale]) if divide else \
            self.op("Mul", [x, self.op("Reciprocal", [scale])])
        if off:
            y = self.op("Sub", [y, self.const(off)])
        n = self.op("Round", [y]) if spec.rounding != "toward_zero" \
            else self.op("Mul", [self.op("Sign", [y]), self.op("Floor", [self.op("Abs", [y])])])
        if zp is not None:
            n = self.op("Add", [n, zp])
        n = self.op("Clip", [n, self.const(float(qmin)), self.const(float(qmax))])
        if q.bias:
            n = self.op("Sub", [n, self.const(float(q.bias))])
        shift = self.const(float(q.bias + off))
        if zp is not None:
            shift = self.op("Sub", [shift, zp])
        return self.rounded(n, scale, shift)

    def int_scale(self, q: IntQuantizer, lo: str, hi: str) -> tuple[str, str | None]:
        """``fxquant.quantize``'s ``int_scale`` in the graph."""
        grid = q.grid
        qmin, qmax = q.code_range
        zero = self.const(0.0)
        zp = None
        if grid.asymmetric:
            lo, hi = self.op("Min", [lo, zero]), self.op("Max", [hi, zero])
            span, levels = self.op("Sub", [hi, lo]), float(qmax - qmin)
        elif grid.signed:
            span = self.op("Max", [self.op("Abs", [lo]), self.op("Abs", [hi])])
            levels = qmax + grid.offset
        else:
            span, levels = self.op("Max", [hi, zero]), float(qmax)
        scale = self.op("Div", [span, self.const(levels)])
        tiny = self.const(torch.finfo(torch.float32).tiny)
        usable = self.op("And", [self.op("GreaterOrEqual", [scale, tiny]),
                                 self.op("Not", [self.op("IsInf", [scale])])])
        scale = self.op("Where", [usable, scale, self.const(1.0)])
        if grid.asymmetric:
            zp = self.op("Clip", [self.op("Sub", [self.const(float(qmin)), self.op(
                "Round", [self.op("Div", [lo, scale])])]), self.const(float(qmin)),
                self.const(float(qmax))])
        return scale, zp

    def per_node(self, q: IntQuantizer, x: str, row_nodes: str | None) -> _Q:
        """Rows on their node's width (a table over global node ids)."""
        spec, grid = q.spec, q.grid
        if spec.seen_range is not None and not bool(torch.isfinite(spec.seen_range).all()):
            raise ExportError(f"export_onnx: the point {spec.module!r} ({spec.label}) has "
                              "learned widths for nodes training never saw, which take the "
                              "width of the nearest seen node at run time; that lookup is "
                              "not exported")
        assert q.widths is not None
        table = q.widths
        entry = "node_ids"
        if spec.seen_range is None:
            # (a node outside the table takes the table's mean, as node_widths gives it:
            # one more entry, where such ids point; learned widths take the nearest seen
            # node's instead, by its range, which is not exported: ONNX Runtime refuses
            # such an id)
            unknown = table.mean().reshape(1) if table.numel() else \
                torch.full((1,), float(spec.max_bits))
            table = torch.cat([table, unknown.to(table.dtype)])
            size = self.const(table.shape[0] - 1, torch.int64)
            known = self.op("And", [self.op("Less", ["node_ids", size]), self.op("Not", [
                self.op("Less", ["node_ids", self.const(0, torch.int64)])])])
            entry = self.op("Where", [known, "node_ids", size])
        bits = table.clamp(spec.min_bits, spec.max_bits)
        bits = bits.round() if spec.widths_learned else bits
        qmin_t, qmax_t = grid.code_range(bits)
        assert isinstance(qmin_t, Tensor) and isinstance(qmax_t, Tensor)
        ids = self.op("Gather", [entry, row_nodes], axis=0) if row_nodes is not None \
            else entry
        qmin = self.op("Unsqueeze", [self.op("Gather", [self.const(qmin_t.float()), ids],
                                             axis=0), self.const([1], torch.int64)])
        qmax = self.op("Unsqueeze", [self.op("Gather", [self.const(qmax_t.float()), ids],
                                             axis=0), self.const([1], torch.int64)])
        off = grid.offset
        if spec.step_kind == "learned":
            assert q.step is not None
            step = self.const(q.step.reshape(()), base="step")
        else:
            if spec.step_kind == "observed":
                assert q.step is not None
                amax = self.const(q.step.reshape(()))
            elif spec.step_kind == "batch-row":
                amax = self.op("ReduceMax", [self.op("Abs", [x]),
                                             self.const([1], torch.int64)], keepdims=1)
            else:
                amax = self.op("ReduceMax", [self.op("Abs", [x]),
                                             self.const([0, 1], torch.int64)], keepdims=0)
            step = self.op("Max", [self.op("Div", [amax, self.op("Add", [qmax, self.const(
                off)])]), self.const(torch.finfo(torch.float32).tiny)])
        y = self.op("Div", [x, step])
        if off:
            y = self.op("Sub", [y, self.const(off)])
        n = self.op("Min", [self.op("Max", [self.op("Round", [y]), qmin]), qmax])
        if q.bias:
            n = self.op("Sub", [n, self.const(float(q.bias))])
        return self.rounded(n, step, self.const(float(q.bias + off)))

    def rounded(self, n: str, scale: str, shift: str) -> _Q:
        """Codes a rounding made (``n``: float32), cast to int8 only where a step reads
        them so."""
        return _Q(None, scale, shift, n, make_codes=lambda: self.cast(
            n, self.onnx.TensorProto.INT8))

    # -- products and sums ----------------------------------------------------------------

    def weight(self, w: WeightCodes) -> _Q:
        q = w.qtensor()
        scale, shift = torch.as_tensor(q.scale), torch.as_tensor(q.shift)
        return _Q(self.const(q.codes.t().contiguous(), torch.int8, "w"),
                  self.const(scale.reshape(1, -1) if scale.dim() else scale),
                  self.const(shift.reshape(1, -1) if shift.dim() else shift))

    def matmul(self, x: Any, w: WeightCodes | None, w_float: Tensor) -> str:
        """``x @ W.T``: ``MatMulInteger`` of codes, rescaled (as ``int_matmul``)."""
        if self.float32:
            w = None
        if isinstance(x, _Q) and w is not None:
            wq = self.weight(w)
            unsigned = x.unsigned
            if unsigned is None:  # the codes + 128 as uint8
                floats = self.code_floats(x)
                unsigned = self.cast(self.op("Add", [floats, self.const(128.0)]),
                                     self.onnx.TensorProto.UINT8)
            acc = self.cast(self.op("MatMulInteger", [
                unsigned, wq.codes, self.const(128, torch.uint8)]), self.FLOAT)
            q = w.qtensor()
            colsum = self.const(q.codes.sum(1, dtype=torch.int32).float().view(1, -1))
            acc = self.op("Add", [acc, self.op("Mul", [x.shift, colsum])])
            if bool((torch.as_tensor(q.shift) != 0).any()):
                rowsum = self.op("ReduceSum", [self.code_floats(x), self.const(
                    [1], torch.int64)], keepdims=1)
                k = float(q.codes.shape[1])
                acc = self.op("Add", [acc, self.op("Mul", [rowsum, wq.shift])])
                acc = self.op("Add", [acc, self.op("Mul", [self.op("Mul", [
                    x.shift, self.const(k)]), wq.shift])])
            return self.op("Mul", [acc, self.op("Mul", [x.scale, wq.scale])])
        wt = (w.qtensor().dequantize() if w is not None else w_float).t().contiguous()
        return self.op("MatMul", [self.as_float(x), self.const(wt)])

    def edges(self, layer: IntLayer) -> tuple[str, str]:
        src = self.op("Gather", ["edge_index", self.const(0, torch.int64)], axis=0)
        dst = self.op("Gather", ["edge_index", self.const(1, torch.int64)], axis=0)
        if getattr(layer, "flow", "source_to_target") != "source_to_target":
            src, dst = dst, src
        return src, dst

    def zeros_like_nodes(self, like: str, width: str, dtype: Any) -> str:
        nodes = self.op("Slice", [self.op("Shape", [like]), self.const([0], torch.int64),
                                  self.const([1], torch.int64)])
        shape = self.op("Concat", [nodes, width], axis=0)
        return self.op("ConstantOfShape", [shape], value=self.h.make_tensor(
            "zero", dtype, [1], [0]))

    def aggregate(self, layer: IntLayer, values: str, coef: str | None, src: str, dst: str,
                  like: str, mean: bool) -> str:
        """Each node's sum (mean) of its messages ``coef * values[src]``: rounded to the
        message point's codes and summed into int32 by ``ScatterND`` (rows added)."""
        def messages() -> str:
            m = self.op("Gather", [values, src], axis=0)
            if coef is not None:
                m = self.op("Mul", [m, self.op("Unsqueeze", [
                    coef, self.const([1], torch.int64)])])
            return m

        point = None if self.float32 else layer.point("message")
        width = self.op("Slice", [self.op("Shape", [values]), self.const([1], torch.int64),
                                  self.const([2], torch.int64)])
        # (whole rows by ScatterND: ScatterElements reads an int64 index per value, ~25x
        # slower on Cora's 1,433-wide rows)
        index = self.op("Unsqueeze", [dst, self.const([1], torch.int64)])
        count = self.count_of(dst, like)
        if point is None:
            total = self.op("ScatterND", [self.zeros_like_nodes(
                like, width, self.FLOAT), index, messages()], reduction="add")
        else:
            if point.widths is None and point.spec.step_kind == "batch-row":
                raise ExportError(f"export_onnx: the messages of {layer.name!r} have a scale "
                                  "per message, whose sum is not integer; not exported")
            if coef is None and point.widths is None:
                # each message is its sender's row: every node's row rounded once and its
                # codes gathered per edge (the range is the senders' rows')
                q = self.quantize(point, values, bounds=self.sender_range(values, src)
                                  if point.spec.step_kind == "batch" else None)
                codes = self.op("Gather", [self.cast(
                    self.code_floats(q), self.onnx.TensorProto.INT32), src], axis=0)
            else:
                q = self.quantize(point, messages(), row_nodes=dst)
                codes = self.cast(self.code_floats(q), self.onnx.TensorProto.INT32)
            total_i = self.op("ScatterND", [self.zeros_like_nodes(
                like, width, self.onnx.TensorProto.INT32), index, codes], reduction="add")
            levels = self.op("Add", [self.cast(total_i, self.FLOAT),
                                     self.op("Mul", [count, q.shift])])
            scale = q.scale
            if point.widths is not None and point.spec.step_kind != "learned":
                # a step per message, the same for all messages into a node: per node
                scale = self.op("ScatterElements", [self.zeros_like_nodes(
                    like, self.const([1], torch.int64), self.FLOAT), self.op(
                    "Unsqueeze", [dst, self.const([1], torch.int64)]), self.op(
                    "Reshape", [scale, self.const([-1, 1], torch.int64)])], axis=0)
            total = self.op("Mul", [levels, scale])
        if mean:
            total = self.op("Div", [total, self.op("Max", [count, self.const(1.0)])])
        return total

    def sender_range(self, values: str, src: str) -> tuple[str, str]:
        """The least and largest value of the rows of ``values`` that ``src`` names (the
        messages' range, without gathering the messages): each row's extremes, gathered."""
        axes = self.const([1], torch.int64)
        lo = self.op("Gather", [self.op("ReduceMin", [values, axes], keepdims=0), src], axis=0)
        hi = self.op("Gather", [self.op("ReduceMax", [values, axes], keepdims=0), src], axis=0)
        return (self.op("ReduceMin", [lo, self.const([0], torch.int64)], keepdims=0),
                self.op("ReduceMax", [hi, self.const([0], torch.int64)], keepdims=0))

    def count_of(self, dst: str, like: str) -> str:
        ones = self.op("ConstantOfShape", [self.op("Shape", [dst])], value=self.h.make_tensor(
            "one", self.FLOAT, [1], [1.0]))
        zeros = self.zeros_like_nodes(like, self.const([1], torch.int64), self.FLOAT)
        count = self.op("ScatterElements", [zeros, self.op("Unsqueeze", [
            dst, self.const([1], torch.int64)]), self.op("Unsqueeze", [
                ones, self.const([1], torch.int64)])], axis=0, reduction="add")
        return count

    def round_at(self, layer: IntLayer, key: str, v: str) -> Any:
        point = None if self.float32 else layer.point(key)
        return v if point is None else self.quantize(point, v)

    # -- layers ---------------------------------------------------------------------------

    def layer(self, layer: Any, args: list[Any]) -> str:
        if isinstance(layer, IntGCNConv):
            return self.gcn(layer, args[0], args[2] if len(args) > 2 else None)
        if isinstance(layer, IntSAGEConv):
            return self.sage(layer, args[0])
        if isinstance(layer, IntGINConv):
            return self.gin(layer, args[0])
        if isinstance(layer, IntLinear):
            y = self.matmul(args[0], layer.weight, layer.w)
            return y if layer.b is None else self.op("Add", [y, self.const(layer.b)])
        raise ExportError(f"export_onnx: layer {layer.name!r} ({layer.kind}) has no ONNX form "
                          "here (exported: GCNConv, SAGEConv, GINConv, Linear)")

    def gcn(self, layer: IntGCNConv, x: Any, edge_weight: Any) -> str:
        if edge_weight is not None:
            raise ExportError(f"export_onnx: layer {layer.name!r} takes edge weights, which "
                              "are not exported")
        if layer.point("edge") is not None:
            raise ExportError(f"export_onnx: layer {layer.name!r} rounds its edge weights "
                              "(site='edge'), which is not exported")
        h = self.as_float(self.round_at(layer, "linear.lin", self.matmul(
            x, layer.weight, layer.lin_weight)))
        src, dst = self.edges(layer)
        coef = None
        if layer.improved:
            raise ExportError(f"export_onnx: layer {layer.name!r} is GCNConv(improved=True), "
                              "which is not exported")
        if layer.normalize:
            src, dst, coef = self.gcn_norm(layer, src, dst, h)
        out = self.aggregate(layer, h, coef, src, dst, h, mean=False)
        out = self.as_float(self.round_at(layer, "aggregate", out))
        if layer.bias is not None:
            out = self.op("Add", [out, self.const(layer.bias)])
        return out

    def gcn_norm(self, layer: IntGCNConv, src: str, dst: str, like: str
                 ) -> tuple[str, str, str]:
        """PyG's ``gcn_norm``: self-loops added (existing ones replaced), symmetric
        degree normalization."""
        if layer.add_loops:
            keep = self.op("Not", [self.op("Equal", [src, dst])])
            src = self.op("Compress", [src, keep], axis=0)
            dst = self.op("Compress", [dst, keep], axis=0)
            nodes = self.op("Squeeze", [self.op("Slice", [
                self.op("Shape", [like]), self.const([0], torch.int64),
                self.const([1], torch.int64)]), self.const([0], torch.int64)])
            loops = self.op("Range", [self.const(0, torch.int64), nodes,
                                      self.const(1, torch.int64)])
            src = self.op("Concat", [src, loops], axis=0)
            dst = self.op("Concat", [dst, loops], axis=0)
        ones = self.op("ConstantOfShape", [self.op("Shape", [src])], value=self.h.make_tensor(
            "one", self.FLOAT, [1], [1.0]))
        deg = self.op("ScatterElements", [self.op("Squeeze", [self.zeros_like_nodes(
            like, self.const([1], torch.int64), self.FLOAT), self.const([1], torch.int64)]),
            dst, ones], axis=0, reduction="add")
        # (torch's deg.pow(-0.5) is its rsqrt, 1 / sqrt rounded twice: Pow differs in the
        # last bit for many degrees, which moves a message on a rounding boundary)
        dinv = self.op("Reciprocal", [self.op("Sqrt", [deg])])
        dinv = self.op("Where", [self.op("IsInf", [dinv]), self.const(0.0), dinv])
        coef = self.op("Mul", [self.op("Mul", [self.op("Gather", [dinv, src], axis=0), ones]),
                               self.op("Gather", [dinv, dst], axis=0)])
        return src, dst, coef

    def sage(self, layer: IntSAGEConv, x: Any) -> str:
        if layer.aggr not in ("mean", "sum", "add") or layer.normalize:
            raise ExportError(f"export_onnx: layer {layer.name!r} (SAGEConv aggr="
                              f"{layer.aggr!r}, normalize={layer.normalize}) is not exported")
        src, dst = self.edges(layer)
        xf = self.as_float(x)
        out = self.aggregate(layer, xf, None, src, dst, xf, mean=layer.aggr == "mean")
        a = self.round_at(layer, "aggregate", out)
        y = self.matmul(a, layer.weight_l, layer.wl)
        if layer.bl is not None:
            y = self.op("Add", [y, self.const(layer.bl)])
        if layer.root:
            assert layer.wr is not None
            r = self.matmul(x, layer.weight_r, layer.wr)
            if layer.br is not None:
                r = self.op("Add", [r, self.const(layer.br)])
            y = self.op("Add", [y, r])
        return y

    def gin(self, layer: IntGINConv, x: Any) -> str:
        src, dst = self.edges(layer)
        xf = self.as_float(x)
        out = self.aggregate(layer, xf, None, src, dst, xf, mean=False)
        a = self.round_at(layer, "aggregate", out)
        h: Any = None
        j = 0
        for kind, child in layer.steps:
            if kind == "relu":
                h = self.relu(h)
                continue
            if kind == "identity":
                continue
            w = layer.weight_of(j)
            w_float = getattr(layer, f"w{j}")
            b = getattr(layer, f"b{j}")
            if j == 0:
                if isinstance(a, _Q) and isinstance(x, _Q) and w is not None:
                    y = self.op("Add", [self.matmul(a, w, w_float), self.op("Mul", [
                        self.const(1.0 + layer.eps), self.matmul(x, w, w_float)])])
                else:
                    s = self.op("Add", [self.as_float(a), self.op("Mul", [
                        self.const(1.0 + layer.eps), self.as_float(x)])])
                    y = self.matmul(s, w, w_float)
            else:
                y = self.matmul(h, w, w_float)
            if b is not None:
                y = self.op("Add", [y, self.const(b)])
            h = self.round_at(layer, f"linear.{nn_path(child)}", y)
            j += 1
        return self.as_float(h)


def _quantizers(model: ConvertedModel) -> list[IntQuantizer]:
    return [m for m in model.modules() if isinstance(m, IntQuantizer)]
