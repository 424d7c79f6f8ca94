"""The recorder: the state the torch modes and the saved-tensor hooks share while a
forward is watched, and the findings it makes from it.

It follows where each tensor came from (:class:`~fxquant.linter.records.Provenance`),
keeps every tensor autograd saves with its version (:meth:`Recorder.pack`), names the
user's line that runs (:meth:`Recorder.where`), and attributes each in-place call's
writes (:meth:`Recorder.after_call`): into a saved value (the culprit of 'modified by an
inplace operation'), into a tensor that requires grad where autograd does not see it (a
hidden write), or over values that then pass no gradient.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Final

import torch
from torch import Tensor, nn
from torch.utils.weak import WeakIdKeyDictionary

from fxquant._ops.calls import op_call
from fxquant.fx.locations import Location
from fxquant.linter.backward import GradientWrite, custom_functions, gradient_hint, gradient_writes
from fxquant.linter.locator import Locator
from fxquant.linter.records import (
    NO_PROVENANCE,
    OVERWRITING_OPS,
    ZERO_DERIVATIVE_OPS,
    AutocastCast,
    Checkpoint,
    DifferentiatedArgument,
    FunctionOutput,
    HiddenWrite,
    InplaceCall,
    Origin,
    Provenance,
    SavedTensor,
    same_storage,
    same_values,
)
from fxquant.linter.report import Finding, LintReport
from fxquant.linter.rules import (
    BACKWARD_WRITES_GRADIENT,
    FACTORY_WITHOUT_DEVICE,
    HIDDEN_WRITE_THEN_READ,
    INPLACE_MODIFIES_SAVED_TENSOR,
    INPLACE_ON_DIFFERENTIATED_ARGUMENT,
    INPLACE_ON_LEAF,
    INPLACE_OVERWRITES_GRAD_TENSOR,
    INPLACE_REFUSED_IN_FORWARD,
    INPLACE_WITHOUT_MARK_DIRTY,
    SILENTLY_WRONG_GRADIENT,
    STALE_AUTOCAST_CAST,
    ZERO_GRADIENT_OP,
    strip_comment,
)
from fxquant.linter.torch_internals import (
    AFTER_REFUSED_VIEW_WRITE,
    autograd_node_op,
    context_tensors,
    forward_class,
    grad_fn,
    gradient_edge,
    in_backward,
    is_custom_function_node,
    is_fake,
    is_function_context,
    storage_id,
    tree_leaves,
    version,
    view_base,
)

__all__ = ["Recorder"]


class _UserPacked:
    """What the user's pack hook returned for a tensor it passes through, with its entry."""

    __slots__ = ("__weakref__", "entry", "value")

    def __init__(self, entry: SavedTensor, value: Any) -> None:
        self.entry, self.value = entry, value


class _Packed:
    """What autograd stores for a saved tensor: its entry and the value backward gets."""

    __slots__ = ("__weakref__", "entry", "value")

    def __init__(self, entry: SavedTensor, value: Tensor) -> None:
        self.entry, self.value = entry, value


def _grad_where_changed(owner: Tensor, changed: Tensor | None) -> bool:
    grad = owner.grad
    if grad is None or grad.shape != owner.shape:
        return False
    if changed is None or changed.shape != grad.shape:
        return bool(grad.ne(0).any())
    return bool(grad[changed].ne(0).any())


def _on_owner(alias: Tensor, changed: Tensor, owner: Tensor) -> Tensor | None:
    """``changed`` (a mask over the written alias) as a mask over ``owner``, another view
    of the same memory: the owner's elements whose storage positions the alias changed
    (None where the two do not share memory or have no strides to compare)."""
    if alias.shape == owner.shape and alias.stride() == owner.stride() \
            and alias.storage_offset() == owner.storage_offset():
        return changed
    if alias.layout != torch.strided or owner.layout != torch.strided \
            or alias.device.type == "meta" or changed.shape != alias.shape:
        return None
    hit = _offsets(alias)[changed]
    return torch.isin(_offsets(owner), hit)


def _offsets(t: Tensor) -> Tensor:
    """The storage position of each element of the strided tensor ``t``."""
    pos = torch.full(t.shape, int(t.storage_offset()), dtype=torch.long, device=t.device)
    for dim, (size, stride) in enumerate(zip(t.shape, t.stride(), strict=True)):
        shape = [1] * t.dim()
        shape[dim] = size
        pos = pos + (torch.arange(size, device=t.device) * stride).view(shape)
    return pos


def _in_custom_function() -> bool:
    """Whether the running code is a custom ``torch.autograd.Function``'s forward (its
    ``ctx`` is a local of a frame on the stack)."""
    frame = sys._getframe(2)
    while frame is not None:
        if any(is_function_context(v) for v in frame.f_locals.values()):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


class Recorder:
    """State shared by the function mode, the dispatch mode and the saved-tensor hooks."""

    def __init__(self, report: LintReport, *, scan_saved: bool, copy_saved: bool) -> None:
        self.report = report
        self.scan_saved = scan_saved  # lint: report FXQ001 when the write happens
        self.copy_saved = copy_saved  # check: keep copies so backward can finish
        self.prov: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.saved: list[SavedTensor] = []
        #: the reentrant checkpoint segments the forward ran (directly, while recording)
        self.checkpoints: list[Checkpoint] = []
        #: those running now (nested ones last)
        self.segments: list[Checkpoint] = []
        self.origins: dict[int, Origin] = {}
        self.reported_factories: set[int] = set()
        self.writes: list[tuple[str, Tensor, bool]] = []  # (aten op, tensor, was requires_grad)
        self.last_op = "?"
        self.locator = Locator()  # which line of the user's runs
        self.cut_at: set[int] = set()  # zero-derivative origins between params and output
        #: storage pointer -> weak references to the tensors on it that require grad
        self.grad_tensors: dict[int, list[weakref.ref[Tensor]]] = {}
        self.hidden: WeakIdKeyDictionary = WeakIdKeyDictionary()  # tensor -> HiddenWrite
        self.reported_hidden: set[int] = set()
        self.hidden_writes: list[HiddenWrite] = []  # every hidden write, in order
        self.changes: dict[int, Tensor] = {}  # id(written alias) -> where one call changed it
        self.names: dict[int, str] = {}  # id(parameter) -> its name
        #: every call that wrote in place, in order
        self.inplace_calls: list[InplaceCall] = []
        #: how many calls the function mode is running (0: an ATen op without one is
        #: TorchScript's, whose writes are attributed right away)
        self.calls_open = 0
        #: tensor hooks that wrote into the gradient they were handed (check)
        self.hook_writes: list[GradientWrite] = []
        #: the tensors the ATen ops of the current call wrote, with their version before
        self.write_versions: list[tuple[Tensor, int]] = []
        #: the outputs of custom Functions that require grad (autograd forbids changing them)
        self.function_outputs: list[FunctionOutput] = []
        #: those changed since, with the write's (code, line, node): reading them raises
        self.changed_outputs: list[tuple[FunctionOutput, str, Location | None, str]] = []
        #: the lines of those writes, once reported (no rewrite knows the gradient meant)
        self.output_writes: list[Location | None] = []
        #: whether a call that read a view changed where autograd forbids it ran on
        #: without autograd (the gradients past it are not the model's)
        self.went_on_without_grad = False
        #: whether the Python call running now runs with autocast caching its casts
        self.autocast_call = False
        self.call_name = ""  # the Python call running now
        #: the casts autocast made and keeps, by the cast tensor and by source storage
        self.casts: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.cast_sources: dict[int, list[AutocastCast]] = {}
        #: the tensors torch.autograd.functional differentiates with respect to
        self.arguments: list[DifferentiatedArgument] = []
        #: how many custom Functions' ``apply`` run now (watched), and the writes made inside
        #: their forwards: (storage, code, line, node)
        self.applying = 0
        self.function_writes: list[tuple[int, str, Location | None, str]] = []

    # where ------------------------------------------------------------------------------

    def where(self) -> Location | None:
        """The user's line for what runs now (:meth:`fxquant.linter.locator.Locator.where`)."""
        return self.locator.where()

    def here(self, default: str) -> tuple[Location | None, str]:
        """The user's line running now and its code (:meth:`fxquant.linter.locator.Locator.here`)."""
        return self.locator.here(default)

    def node_name(self, fallback: str) -> str:
        """The FX node being run (``fallback`` outside a GraphModule)."""
        return self.locator.node_name(fallback)

    def add(self, rule: str, where: Location | None, node: str, message: str, hint: str,
            related: str = "", related_location: Location | None = None) -> None:
        self.report.add(Finding(rule, node, where, message, hint, related, related_location))

    # provenance -------------------------------------------------------------------------

    def get(self, t: Tensor) -> Provenance:
        return self.prov.get(t, NO_PROVENANCE)

    def mark_inputs(self, tensors: list[Tensor], model: nn.Module) -> None:
        """Mark the tensors a forward starts from (see :func:`fxquant.linter.recording.model_tensors`)."""
        self.names = {id(p): name for name, p in model.named_parameters()}
        self.locator.know_model(model)
        for t in tensors:
            is_param = id(t) in self.names and t.requires_grad
            self.prov[t] = Provenance(input_dep=True, param_dep=is_param)
            self.track_grad(t)

    # writes autograd does not see -------------------------------------------------------

    def track_grad(self, t: Tensor) -> None:
        """Remember ``t`` if it requires grad, to recognize hidden writes into its memory."""
        if not t.requires_grad:
            return
        ptr = storage_id(t)
        if ptr:
            refs = self.grad_tensors.setdefault(ptr, [])
            refs[:] = [r for r in refs if r() is not None]
            refs.append(weakref.ref(t))

    def grad_owners(self, t: Tensor) -> list[Tensor]:
        """The live tensors that require grad and share ``t``'s storage."""
        return self._grad_owners(t)

    def _grad_owners(self, t: Tensor) -> list[Tensor]:
        ptr = storage_id(t)
        owners = [r() for r in self.grad_tensors.get(ptr, ())] if ptr else []
        return [o for o in owners
                if o is not None and o.requires_grad and storage_id(o) == ptr]

    def hide(self, owners: list[Tensor], code: str, where: Location | None, node: str,
             how: str, changed: Tensor | None = None, alias: Tensor | None = None, *,
             inside_function: bool | None = None, needs_reader: bool | None = None,
             hint: str = "") -> None:
        """Remember a hidden write into ``owners`` through ``alias`` (one of them when
        None); ``changed`` masks the alias's elements it changed (None: unknown). A write
        inside a custom Function's forward (``inside_function``, found on the stack where
        None) is not one: its author states the gradient. ``needs_reader``: it matters
        only where a differentiable op reads an owner after it (default: where every owner
        is a leaf)."""
        if _in_custom_function() if inside_function is None else inside_function:
            return
        names = [self.names[id(o)] for o in owners if id(o) in self.names]
        target = f"parameter {names[0]!r}" if names else "a tensor that requires grad"
        written = owners[0] if alias is None else alias
        masks = [None if changed is None else _on_owner(written, changed, o) for o in owners]
        if needs_reader is None:
            needs_reader = all(o.is_leaf for o in owners)
        write = HiddenWrite(code, where, node, how, target, list(owners), masks,
                            needs_reader=needs_reader, hint=hint)
        self.hidden_writes.append(write)
        for owner in owners:
            self.hidden[owner] = write
            if self.copy_saved and not owner.is_leaf:
                owner.retain_grad()  # check: the gradient reaching it decides (confirm_hidden)

    def on_read(self, inputs: list[Tensor]) -> None:
        """A differentiable op computes with a tensor changed by a hidden write: the lint
        warns (FXQ014); the check decides after backward (:meth:`confirm_hidden`)."""
        for t in inputs:
            write = self.hidden.get(t) if t.requires_grad else None
            if write is None or id(write) in self.reported_hidden:
                continue
            self.reported_hidden.add(id(write))
            reader = self.where()
            write.reader = reader.code if reader and reader.code else self.last_op
            write.read_at = reader
            if self.scan_saved:
                self.add(HIDDEN_WRITE_THEN_READ.id, write.where, write.node,
                         f"`{write.code}` changes {write.target} {write.how}, which autograd "
                         f"does not see, and `{write.reader}` then computes with it: the "
                         "gradient may skip this change (fxquant.check runs backward and "
                         "tells whether it does).", write.hint or HIDDEN_WRITE_THEN_READ.hint,
                         related=write.reader, related_location=reader)

    def confirm_hidden(self) -> list[HiddenWrite]:
        """After backward: the hidden writes that make gradients wrong. Each is an FXQ012,
        except where the lint has a finding for the same line already: an FXQ001 (a
        ``.detach()`` alias bumped a saved value's version) or a write into a saved value
        (the check's gradient comparison names the op that saved it)."""
        confirmed = []
        crashing = {f.location for f in self.report.by_rule(INPLACE_MODIFIES_SAVED_TENSOR.id)}
        # writes into saved values: the check compares gradients and names the saving op
        saved = {w[1] for entry in self.saved for w in entry.silent}
        for write in self.hidden_writes:
            if write.needs_reader and not write.reader:
                continue  # nothing computed with the changed values (their gradient is right)
            if not any(_grad_where_changed(o, c)
                       for o, c in zip(write.owners, write.changed, strict=True)):
                continue
            confirmed.append(write)
            if write.where is not None and (write.where in crashing or write.where in saved):
                continue
            then = (f", and `{write.reader}` then computes with it" if write.reader
                    else ", and the gradient reaches it")
            self.add(SILENTLY_WRONG_GRADIENT.id, write.where, write.node,
                     f"`{write.code}` changes {write.target} {write.how}, which autograd does "
                     f"not see{then}: backward runs, but the gradient skips this change (it "
                     "treats the new values as if the ops before had computed them).",
                     write.hint or HIDDEN_WRITE_THEN_READ.hint, related=write.reader,
                     related_location=write.read_at)
        return confirmed

    def origin(self, op: str, where: Location | None, node: str) -> int:
        key = len(self.origins)
        self.origins[key] = Origin(op, where, node)
        return key

    def on_aten(self, func: Any, args: tuple, kwargs: dict, out: Any,
                written: list[tuple[Tensor, bool]]) -> None:
        name = func.overloadpacket.__name__
        self.last_op = name
        for t, grad_before in written:
            self.writes.append((name, t, grad_before))
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, Tensor)]
        outputs = [t for t in tree_leaves(out) if isinstance(t, Tensor)]
        if self.autocast_call and name == "_to_copy":
            self._note_cast(inputs, out)
        if len(self.casts) and not in_backward():
            for t in inputs:
                cast = self.casts.get(t)
                if cast is not None and cast.writes and not cast.reported:
                    self._report_stale_cast(cast, t)
        if not outputs:
            return
        provs = [self.get(t) for t in inputs]
        input_dep = any(p.input_dep for p in provs)
        param_dep = torch.is_grad_enabled() and name != "detach" and any(p.param_dep for p in provs)
        factories = frozenset().union(*(p.factories for p in provs))
        if factories and input_dep:
            self._report_factories(factories)
            factories = frozenset()
        if name in ("_to_copy", "to") and kwargs.get("device") is not None:
            factories = frozenset()
        float_in = [(t, p) for t, p in zip(inputs, provs, strict=True) if t.is_floating_point()]
        float_param_dep = any(p.param_dep for _, p in float_in)
        zero_grad = frozenset().union(*(p.zero_grad for _, p in float_in))
        cut = frozenset().union(*(p.cut for p in provs))
        for t in outputs:
            if t.is_floating_point():
                zg = zero_grad
                if not float_in:  # int/bool -> float conversion: cuts become values
                    zg = zg | cut
                if float_param_dep and torch.is_grad_enabled() and _zero_derivative(func, args, kwargs):
                    zg = zg | {self.origin(name, self.where(), self.node_name(name))}
                new = Provenance(input_dep, param_dep, factories, zg, cut)
            else:
                c = cut | zero_grad
                if float_param_dep and torch.is_grad_enabled():
                    c = c | {self.origin(name, self.where(), self.node_name(name))}
                new = Provenance(input_dep, False, factories, frozenset(), c)
            old = self.prov.get(t)
            if old is not None and any(t is w for w, _ in written):
                new = Provenance(old.input_dep or new.input_dep, old.param_dep or new.param_dep,
                            old.factories | new.factories, old.zero_grad | new.zero_grad,
                            old.cut | new.cut)
            self.prov[t] = new

    # torch.autograd.functional ------------------------------------------------------------

    def watch_arguments(self, api: str, given: tuple[Any, ...], arguments: tuple[Any, ...]
                        ) -> None:
        """``torch.autograd.functional.<api>`` hands ``arguments`` (prepared from ``given``)
        to the function it was given and differentiates with respect to them: a write the
        function makes into one changes what is differentiated
        (:func:`~fxquant.linter.torch_internals.functional_arguments_watched`). Where the
        tensor given is (a view of) a value with history, where its gradient enters the
        graph is kept: the derivative the function as written means."""
        where = self.where()
        for g, a in zip(given, arguments, strict=False):
            if not (isinstance(a, Tensor) and a.requires_grad and storage_id(a)):
                continue
            edge, within = None, None
            base = view_base(g) if isinstance(g, Tensor) else None
            if base is not None and grad_fn(base) is not None and base.is_contiguous():
                # a view: its own node is not on the path a write reroutes through the base
                edge = gradient_edge(base)
                within = (tuple(g.shape), tuple(g.stride()),
                          g.storage_offset() - base.storage_offset())
            elif base is None and isinstance(g, Tensor) and grad_fn(g) is not None:
                edge = gradient_edge(g)
            self.arguments.append(DifferentiatedArgument(weakref.ref(a), storage_id(a),
                                                         version(a), api, where, edge, within))

    def _note_argument_writes(self, written: list[Tensor], code: str, where: Location | None,
                              node: str) -> None:
        hit = {storage_id(t) for t in written}
        for argument in self.arguments:
            if argument.storage not in hit or argument.argument() is None \
                    or (code, where, node) in argument.writes:
                continue
            argument.writes.append((code, where, node))
            if self.scan_saved:
                self.add(INPLACE_ON_DIFFERENTIATED_ARGUMENT.id, where, node,
                         f"{_argument_write(argument, code)} (fxquant.check tells whether it "
                         "changes).", INPLACE_ON_DIFFERENTIATED_ARGUMENT.hint,
                         related=argument.api, related_location=argument.where)

    def differentiate_as_given(self, args: tuple, kwargs: dict
                               ) -> tuple[tuple, dict, Callable[[Any], Any] | None]:
        """Check: the arguments of ``torch.autograd.grad(outputs, inputs, ...)`` with each
        input that is a written argument of a ``torch.autograd.functional`` function
        replaced by where the gradient of the tensor it was given entered the graph then:
        the derivative the function as written means; and what maps the result back to
        the inputs' shapes (None: nothing replaced)."""
        inputs = kwargs["inputs"] if "inputs" in kwargs else args[1] if len(args) > 1 else None
        if inputs is None:
            return args, kwargs, None
        listed = [inputs] if isinstance(inputs, Tensor) else list(inputs)
        within: dict[int, tuple[tuple[int, ...], tuple[int, ...], int]] = {}
        changed = False
        for i, t in enumerate(listed):
            found = next((a for a in self.arguments if a.argument() is t), None) \
                if isinstance(t, Tensor) else None
            if found is not None and found.writes and found.edge is not None \
                    and version(t) != found.version:
                listed[i] = found.edge
                changed = True
                if found.within is not None:
                    within[i] = found.within
        if not changed:
            return args, kwargs, None
        batched = bool(kwargs.get("is_grads_batched", False))

        def back(result: Any) -> Any:
            grads = list(result)
            for i, (size, stride, offset) in within.items():
                g = grads[i]
                if isinstance(g, Tensor):
                    g = g.contiguous()
                    grads[i] = g.as_strided((g.shape[0], *size), (g[0].numel(), *stride),
                                            offset) if batched else \
                        g.as_strided(size, stride, offset)
            return tuple(grads)

        if "inputs" in kwargs:
            return args, {**kwargs, "inputs": tuple(listed)}, back
        return (args[0], tuple(listed), *args[2:]), kwargs, back

    def written_arguments(self) -> list[DifferentiatedArgument]:
        """The arguments of torch.autograd.functional functions that were written into."""
        return [a for a in self.arguments if a.writes]

    def report_argument_writes(self, harmful: bool) -> None:
        """Check: FXQ012 for each write into a differentiated argument where the gradients
        are wrong (the protected run took the derivative as the function means it), else
        FXQ016 (harmless here)."""
        for argument in self.written_arguments():
            for code, where, node in argument.writes:
                said = _argument_write(argument, code)
                if harmful:
                    self.add(SILENTLY_WRONG_GRADIENT.id, where, node,
                             f"{said}: backward runs, but the result and the gradients are "
                             "wrong.", INPLACE_ON_DIFFERENTIATED_ARGUMENT.hint,
                             related=argument.api, related_location=argument.where)
                else:
                    self.add(INPLACE_ON_DIFFERENTIATED_ARGUMENT.id, where, node,
                             f"{said} (here the result is the same).",
                             INPLACE_ON_DIFFERENTIATED_ARGUMENT.hint,
                             related=argument.api, related_location=argument.where)

    # autocast's cast cache ---------------------------------------------------------------

    def _note_cast(self, inputs: list[Tensor], out: Any) -> None:
        """``_to_copy`` run by autocast (not the user's ``.to``) of a leaf that requires
        grad: autocast keeps the cast for the rest of its region."""
        if self.call_name in _EXPLICIT_CASTS or len(inputs) != 1 or not isinstance(out, Tensor):
            return
        (source,) = inputs
        if not (source.is_leaf and source.requires_grad and source.is_floating_point()) \
                or out.dtype == source.dtype or not storage_id(source):
            return
        cast = AutocastCast(weakref.ref(source), storage_id(source), self.where())
        self.casts[out] = cast
        self.cast_sources.setdefault(cast.storage, []).append(cast)

    def note_written(self, t: Tensor, code: str, where: Location | None, node: str,
                     how: str) -> None:
        """A write into ``t`` (its memory, or ``t.data = ...``): the casts autocast keeps of
        it no longer show its values."""
        for cast in [*self.cast_sources.get(storage_id(t), ()),
                     *(c for casts in self.cast_sources.values() for c in casts
                       if c.source() is t)]:
            if (code, where, node, how) not in cast.writes:
                cast.writes.append((code, where, node, how))

    def _report_stale_cast(self, cast: AutocastCast, value: Tensor) -> None:
        """An op reads autocast's kept cast of a leaf written since: it computes with the old
        values (where they differ: a restore to bit-identical values is harmless)."""
        source = cast.source()
        if source is None:
            return
        with torch.no_grad():
            fresh = source.detach().to(value.dtype)
        unknown = is_fake(value) or value.device.type == "meta"  # (no values: assume changed)
        if not unknown and same_values(value.detach(), fresh):
            return
        cast.reported = True
        code, where, node, how = cast.writes[-1]
        names = [self.names[id(source)]] if id(source) in self.names else []
        target = f"parameter {names[0]!r}" if names else "a leaf tensor that requires grad"
        reader, reader_code = self.here(self.last_op)
        made = f" at {cast.where}" if cast.where is not None else ""
        said = (f"`{code}` changes {target} {how} inside a torch.autocast region that already "
                f"cast it{made}: autocast keeps that cast for the whole region (its weight "
                "cache, cache_enabled=True) and does not see the write, so "
                f"`{reader_code}` computes with the cast of the old values")
        if self.scan_saved:
            self.add(STALE_AUTOCAST_CAST.id, where, node,
                     f"{said} (fxquant.check tells whether the results change).",
                     STALE_AUTOCAST_CAST.hint, related=reader_code, related_location=reader)
        else:
            self.add(SILENTLY_WRONG_GRADIENT.id, where, node,
                     f"{said}: the outputs computed from it, and the gradients, are silently "
                     "wrong.", STALE_AUTOCAST_CAST.hint, related=reader_code,
                     related_location=reader)

    def report_gradient_writes(self, out: Any) -> None:
        """FXQ015 for each line of a custom Function's backward, behind ``out``, that
        writes in place into its incoming gradient (read from its source)."""
        for node in custom_functions(out):
            function = forward_class(node)
            for write in gradient_writes(function) if function is not None else ():
                self.add(BACKWARD_WRITES_GRADIENT.id, write.where, write.function,
                         f"`{write.code}` in the backward of `{write.function}` writes in "
                         "place into the gradient it receives: autograd may hand the same "
                         "tensor to other branches, whose gradients then change silently "
                         "(fxquant.check runs backward and tells whether they do).",
                         gradient_hint(write.code))

    def report_zero_grad(self, out: Any) -> set[int]:
        """FXQ007 for each zero-derivative op between parameters and ``out``; their keys."""
        origins: set[int] = set()
        for t in tree_leaves(out):
            if isinstance(t, Tensor):
                origins |= self.get(t).zero_grad
        for key in sorted(origins):
            o = self.origins[key]
            code = strip_comment(o.where.code) if o.where else o.op
            self.add(ZERO_GRADIENT_OP.id, o.where, o.node,
                     f"`{code}` ({o.op}) has zero derivative almost everywhere and lies between "
                     "parameters and the output: parameters upstream receive zero gradient "
                     "through it.", ZERO_GRADIENT_OP.hint)
        return origins

    def _report_factories(self, factories: frozenset[int]) -> None:
        meet = self.where()
        for key in factories - self.reported_factories:
            self.reported_factories.add(key)
            o = self.origins[key]
            code = strip_comment(o.where.code) if o.where else o.op
            self.add(FACTORY_WITHOUT_DEVICE.id, o.where, o.node,
                     f"`{code}` creates a tensor without device= ({o.op}); it meets data "
                     f"derived from the inputs{f' at {meet}' if meet else ''} and stays on "
                     "the CPU when the model moves to a GPU.", FACTORY_WITHOUT_DEVICE.hint)

    # saved tensors ----------------------------------------------------------------------

    def pack(self, t: Tensor) -> Any:
        # a detached alias (the same memory and version counter) holds no autograd node: a
        # saved output would otherwise keep its own node alive through what pack returns
        alias = t.detach()
        entry = SavedTensor(alias, version(t), version(t), self.last_op, self.where(),
                            origin=weakref.ref(t))
        self.saved.append(entry)
        if self.copy_saved:
            entry.copy = t.detach().clone()
        # (autograd gives the unpacked value the node's history again)
        packed = _Packed(entry, alias if entry.copy is None else entry.copy)
        # the autograd node holds what pack returns: once the node is freed (its output
        # dropped, e.g. ``h.norm().item()``), backward cannot use the value any more
        entry.held = weakref.ref(packed)
        return packed

    def name_victims(self, first: int, out: Any) -> None:
        """Name the op behind tensors saved during one call after its autograd node.

        Inputs are saved before the ATen op runs, so the dispatch mode cannot name it then;
        the output's ``grad_fn`` (``PowBackward1`` -> ``pow``) is what PyTorch's own error
        message names.
        """
        grad_fn = next((t.grad_fn for t in tree_leaves(out)
                        if isinstance(t, Tensor) and t.grad_fn is not None), None)
        if grad_fn is None:
            return
        name = autograd_node_op(grad_fn)
        outputs = [t for t in tree_leaves(out) if isinstance(t, Tensor)]
        for entry in self.saved[first:]:
            entry.op = name
            origin = entry.origin() if entry.origin is not None else None
            entry.output = origin is not None and any(origin is o for o in outputs)

    def watch_function(self, function: type, args: tuple[Any, ...]) -> Callable[[Any], None]:
        """Before a custom Function's ``apply``: what to do with its output after it
        (:func:`~fxquant.linter.torch_internals.custom_function_apply_watched`). Its inputs
        that require grad are watched: one its forward writes in place without
        ``ctx.mark_dirty`` keeps its old history (FXQ018, and a hidden write that matters
        where the input is read again); its outputs are remembered, since autograd forbids
        changing them (:meth:`after_call`)."""
        inputs = [(t, version(t)) for t in tree_leaves(args) if isinstance(t, Tensor)
                  and t.requires_grad and not t.is_inference()]
        start = len(self.function_writes)
        self.applying += 1

        def after(out: Any) -> None:
            self.applying -= 1
            self.kept_in_context(function, out)
            outputs = [t for t in tree_leaves(out) if isinstance(t, Tensor)]
            node = next((grad_fn(t) for t in outputs if grad_fn(t) is not None), None)
            if not is_custom_function_node(node):
                return
            where = self.where()
            self.function_outputs += [FunctionOutput(weakref.ref(t), storage_id(t),
                                                     function.__name__, where)
                                      for t in outputs if t.requires_grad and storage_id(t)]
            for t, before in inputs:
                if version(t) != before and grad_fn(t) is not node:  # (mark_dirty rebases it)
                    self._unmarked_write(function, t, self.function_writes[start:], where)
            del self.function_writes[start:]

        return after

    def _unmarked_write(self, function: type, t: Tensor,
                        writes: list[tuple[int, str, Location | None, str]],
                        called_at: Location | None) -> None:
        """FXQ018 for an input ``t`` of ``function`` its forward wrote in place without
        ``ctx.mark_dirty``, at the line of the write (else the call); a hidden write into
        ``t`` (its history is the old one), which matters where ``t`` is read again."""
        name = function.__name__
        found = next((w for w in reversed(writes) if w[0] == storage_id(t)), None)
        code, where, node = (found[1], found[2], found[3]) if found is not None else (
            f"{name}.apply(...)", called_at, self.node_name(name))
        hint = (f"call `ctx.mark_dirty(...)` in the forward of `{name}` with every input it "
                "writes in place (autograd then moves the input's history onto the "
                "Function, as its contract asks), or write into a copy (`x = x.clone()` "
                "first)")
        self.add(INPLACE_WITHOUT_MARK_DIRTY.id, where, node,
                 f"`{code}` in the forward of the custom Function `{name}` writes in place "
                 "into an input that requires grad without `ctx.mark_dirty`: autograd keeps "
                 "the input's old history, so where the input is read again after the call, "
                 "its gradient goes past the Function (fxquant.check tells whether one does).",
                 hint, related=name, related_location=called_at)
        self.hide([t], code, where, node,
                  f"in the forward of the custom Function `{name}` without ctx.mark_dirty",
                  inside_function=False, needs_reader=True, hint=hint)

    def kept_in_context(self, function: type, out: Any) -> None:
        """After a custom Function ran: track the tensors its ``ctx`` keeps as attributes
        (``ctx.x = x``), which autograd neither saves nor checks; the check's protected run
        hands its backward their values as they were now."""
        node = next((t.grad_fn for t in tree_leaves(out)
                     if isinstance(t, Tensor) and t.grad_fn is not None), None)
        if not is_custom_function_node(node):
            return
        for key, value in context_tensors(node):
            if value.is_inference():
                continue  # (an inference tensor has no version counter to watch)
            entry = SavedTensor(value.detach(), version(value), version(value),
                                function.__name__, self.where(), kept_as=f"ctx.{key}")
            entry.held = weakref.ref(node)
            self.saved.append(entry)
            if self.copy_saved:
                entry.copy = value.detach().clone()
                # a clone keeps the value's history (a backward that differentiates
                # through it, for second derivatives, still can), not its later writes
                with torch.enable_grad():
                    setattr(node, key, value.clone() if value.requires_grad else entry.copy)

    def run_segment(self, function: Any, preserve_rng_state: bool, *args: Any) -> Any:
        """A reentrant ``torch.utils.checkpoint`` segment (PyG's
        ``DeepGCNLayer(ckpt_grad=True)``), run as a plain call: a reentrant segment runs
        its forward without autograd and again inside backward, where no instrument sees
        it, so an in-place bug in it would go unseen. Checkpointing saves memory and
        changes no value; the inputs it would save for its re-run are recorded as saved."""
        inputs = [a for a in args if isinstance(a, Tensor) and a.requires_grad]
        segment = Checkpoint(self.where(), preserve_rng_state, bool(inputs), inputs)
        self.checkpoints.append(segment)
        for a in args:
            if isinstance(a, Tensor) and not a.is_inference():
                self.saved.append(SavedTensor(a.detach(), version(a), version(a), "checkpoint",
                                              segment.where, origin=weakref.ref(a)))
        self.segments.append(segment)
        try:
            return function(*args)
        finally:
            self.segments.pop()

    def user_hooks(self, pack: Callable[[Tensor], Any],
                   unpack: Callable[[Any], Tensor]) -> tuple[Callable[..., Any], Callable[..., Any]]:
        """The user's saved-tensor hooks (``torch.autograd.graph.saved_tensors_hooks``,
        pushed above fxquant's in forward), watched: autograd checks no version of what
        goes through them, so a value the pack hook passes through as it is (the same
        memory) and a later in-place write changes what backward computes with, silently.
        Such a value gets an entry like a custom Function's ``ctx`` attribute; check's
        protected run hands backward its value when saved."""

        def packed(t: Tensor) -> Any:
            value = pack(t)
            if not any(same_storage(v, t) for v in _tensors_within(value)):
                return value  # a copy (offloaded, compressed): later writes do not reach it
            entry = SavedTensor(t.detach(), version(t), version(t), self.last_op, self.where(),
                                kept_as="saved_tensors_hooks", origin=weakref.ref(t))
            if self.copy_saved:
                entry.copy = t.detach().clone()
            self.saved.append(entry)
            holder = _UserPacked(entry, value)
            entry.held = weakref.ref(holder)
            return holder

        def unpacked(holder: Any) -> Tensor:
            if not isinstance(holder, _UserPacked):
                return unpack(holder)
            entry, value = holder.entry, unpack(holder.value)
            if entry.copy is not None and version(entry.tensor) != entry.pack_version:
                return entry.copy  # (check: the value the forward's ops computed with)
            return value

        return packed, unpacked

    def _report_kept(self, entry: SavedTensor, code: str, where: Location | None,
                     node: str) -> None:
        if entry.kept_as == "saved_tensors_hooks":
            self.add(HIDDEN_WRITE_THEN_READ.id, where, node,
                     f"`{code}` writes in place into a tensor that `{entry.op}` saved through "
                     "your saved-tensor hooks (torch.autograd.graph.saved_tensors_hooks), whose "
                     "pack hook keeps it as it is: autograd checks no version through hooks, so "
                     "backward computes with the changed value (fxquant.check runs backward and "
                     "tells whether the gradients change).",
                     "write out of place (`y = y + 1`), or have the pack hook keep a copy "
                     "(`x.clone()`)", related=entry.op, related_location=entry.where)
            return
        self.add(HIDDEN_WRITE_THEN_READ.id, where, node,
                 f"`{code}` writes in place into a tensor that the custom Function "
                 f"`{entry.op}` keeps as `{entry.kept_as}` (not through save_for_backward, so "
                 "autograd does not check it): its backward computes with the changed value "
                 "(fxquant.check runs backward and tells whether the gradients change).",
                 "save it with ctx.save_for_backward (autograd then refuses the write), or "
                 "write into a copy (`y = y * 3`)",
                 related=entry.op, related_location=entry.where)

    def unpack(self, packed: Any) -> Tensor:
        if not self.copy_saved:
            return packed.value
        entry, copy = packed.entry, packed.value
        if version(entry.tensor) != entry.pack_version:
            culprits = entry.culprits or [("an in-place op", None, "?", "")]
            for code, where, node, op in culprits:
                self._report_saved(entry, code, where, node, op)
        return copy

    def report_checkpoint_writes(self, report: LintReport) -> None:
        """FXQ001, into ``report``, for each write into an input a reentrant checkpoint
        saved (no unpack sees those: the recording runs the segment directly)."""
        before, self.report = self.report, report
        try:
            for entry in self.saved:
                if entry.op == "checkpoint":
                    for code, where, node, op in entry.culprits:
                        self._report_saved(entry, code, where, node, op)
        finally:
            self.report = before

    def report_modified(self) -> None:
        """FXQ001 for every saved tensor modified so far (when backward will not run)."""
        for entry in self.saved:
            for code, where, node, op in entry.culprits:
                self._report_saved(entry, code, where, node, op)

    def after_call(self, func_name: str, where: Location | None, grad_enabled: bool = True,
                   by_library: bool = False, requested: bool = False,
                   bump_pending: bool = False) -> None:
        """Attribute the writes of one Python-level call: saved tensors, overwrites, and
        writes autograd does not see (``grad_enabled``: the grad mode of the call;
        ``by_library``: torch itself made the call; ``bump_pending``: called from within
        the ATen op, before autograd bumps the written tensors' versions)."""
        writes, self.writes = self.writes, []
        code = strip_comment(where.code) if where else func_name
        node = self.node_name(func_name)
        op = writes[0][0] if writes else ""
        if where is None:  # a module a container runs, built where no instrument saw
            self.locator.remember_unlocated(code, node)
        written = [t for _, t, _ in writes]
        self.inplace_calls.append(InplaceCall(where, func_name, by_library, requested))
        found: list[bool] = []

        def inside() -> bool:  # (a walk of the stack: only where it matters, once)
            if not found:
                found.append(_in_custom_function())
            return found[0]

        if self.applying and inside():  # (an input written without mark_dirty: this line)
            self.function_writes += [(storage_id(t), code, where, node) for t in written]
        if self.arguments:
            self._note_argument_writes(written, code, where, node)
        if self.cast_sources:
            how = ("through `.data`" if ".data" in code else
                   "under torch.no_grad()" if not grad_enabled else "in place")
            for t in written:
                self.note_written(t, code, where, node, how)
        if self.segments and grad_enabled:  # (under no_grad the re-run writes a leaf too,
            # but also without autograd: no error)
            self._report_segment_input_writes(written, code, where, node, op)
        for _, t, grad_before in writes:
            if (grad_enabled and grad_before) or by_library:
                continue  # autograd records it (or it is torch's documented behaviour)
            # a write into ``t`` itself from a value that requires grad is recorded by
            # autograd (``buf.detach_()`` then ``buf.copy_(f(w))``): ``t`` now has history
            owners = [o for o in self._grad_owners(t)
                      if not (o is t and grad_enabled and grad_fn(o) is not None)]
            changed = self.changes.pop(id(t), None)
            if owners:
                how = ("through `.data`" if ".data" in code else
                       "under torch.no_grad()" if not grad_enabled else
                       "through a `.detach()`ed alias")
                self.hide(owners, code, where, node, how, changed, alias=t,
                          inside_function=inside())
        for entry in self.saved:
            now = version(entry.tensor)
            if bump_pending and any(same_storage(t, entry.tensor) for t in written):
                now += 1  # (what it will be once the op returns)
            if now != entry.seen_version:
                entry.seen_version = now
                if not entry.in_graph:
                    continue  # its autograd node is gone: backward will not read it
                if entry.op == "checkpoint" and any(
                        same_storage(entry.tensor, i) for s in self.segments for i in s.inputs):
                    continue  # the segment writing its own input: FXQ003 above says it
                if entry.kept_as:  # autograd will not notice: backward computes with it
                    entry.silent.append((code, where, node, op))
                    if self.scan_saved:
                        self._report_kept(entry, code, where, node)
                    continue
                entry.culprits.append((code, where, node, op))
                if self.scan_saved:
                    self._report_saved(entry, code, where, node, op)
            else:  # a write into its memory that moved no version counter
                hit = next((name for name, t, _ in writes if same_storage(t, entry.tensor)),
                           None)
                if hit is None:
                    continue
                entry.silent.append((code, where, node, hit))
                if self.scan_saved and entry.in_graph and not entry.kept_as \
                        and hit.startswith("_fused_"):
                    self._report_unversioned(entry, code, where, node, hit)
        if self.function_outputs and not {storage_id(t) for t in written}.isdisjoint(
                e.storage for e in self.function_outputs) and not inside():
            self._note_function_output_writes(written, code, where, node)
        # (torch's or PyG's own code overwriting, as gcn_norm does: nothing to change there;
        # a custom Function's forward: its backward says what passes gradient)
        if not by_library and any(name in OVERWRITING_OPS and grad for name, _, grad in writes) \
                and not inside():
            self.add(INPLACE_OVERWRITES_GRAD_TENSOR.id, where, node,
                     f"`{code}` overwrites elements of a tensor that requires grad; legal, but "
                     "those elements pass no gradient to what computed them.",
                     INPLACE_OVERWRITES_GRAD_TENSOR.hint)

    def _note_function_output_writes(self, written: list[Tensor], code: str,
                                     where: Location | None, node: str) -> None:
        """A write (under no_grad, or into the tensor viewed) that changed a view a custom
        Function returned: autograd lets it go through and raises only where the view is
        read next ('... is a view and its base ... has been modified inplace'), naming that
        line; the write is remembered, for :meth:`report_changed_outputs`."""
        hit = {storage_id(t) for t in written}
        kept = []
        for entry in self.function_outputs:
            view = entry.tensor()
            if view is None:
                continue
            if entry.storage in hit:
                try:
                    _ = view.grad_fn  # (what the next op reading it asks: raises once changed)
                except RuntimeError as e:
                    if AFTER_REFUSED_VIEW_WRITE not in str(e):
                        raise
                    self.changed_outputs.append((entry, code, where, node))
                    continue
            kept.append(entry)
        self.function_outputs = kept

    def report_changed_outputs(self, read: Any) -> None:
        """FXQ013, at the write, for each changed custom Function output among the tensors
        in ``read`` (an op that raised reading it, or the forward's output): torch names the
        reading line instead."""
        tensors = [t for t in tree_leaves(read) if isinstance(t, Tensor)]
        pending = []
        for entry, code, where, node in self.changed_outputs:
            if not any(entry.tensor() is t for t in tensors):
                pending.append((entry, code, where, node))
                continue
            called = f" at {entry.where}" if entry.where is not None else ""
            self.output_writes.append(where)
            self.add(INPLACE_REFUSED_IN_FORWARD.id, where, node,
                     f"`{code}` changes a view that the custom Function `{entry.function}` "
                     f"returned{called} (or the tensor it views), which autograd does not let "
                     "you modify: the write goes through, and the next op that reads the view "
                     "raises ('... is a view and its base or another view of its base has been "
                     "modified inplace'), naming that line instead of this one.",
                     f"clone the output of `{entry.function}` and write into the clone "
                     "(`y = f(x).clone()`), with autograd on if the overwritten elements should "
                     "pass no gradient; or have its forward return a new tensor instead of a "
                     "view", related=entry.function, related_location=entry.where)
        self.changed_outputs = pending

    def guarded_hook(self, hook: Callable[[Tensor], Any]) -> Callable[[Tensor], Any]:
        """``hook`` (registered with ``Tensor.register_hook`` at the current line) handed a
        copy of its gradient: autograd may hand one gradient tensor to several branches
        (both operands of ``a + b``), and a hook that changes it in place changes theirs
        too. The copy gives the gradients the hook means (its change on its own branch);
        a write is listed in :attr:`hook_writes`, which check reports."""
        where = self.where()
        recorder = weakref.ref(self)  # (the check's report is done with it after its backward)

        def guarded(grad: Tensor) -> Any:
            rec = recorder()
            if not isinstance(grad, Tensor) or rec is None:
                return hook(grad)
            fresh = grad.clone()
            before = version(fresh)
            out = hook(fresh)
            if version(fresh) == before:
                return out
            if where is not None:
                write = GradientWrite("tensor hook", where, strip_comment(where.code), hook=True)
                if write not in rec.hook_writes:
                    rec.hook_writes.append(write)
            return out if out is not None else fresh

        return guarded

    def on_detach_(self, t: Tensor) -> None:
        """``t.detach_()``: it bumps no version, but backward refuses a saved tensor that
        was detached in place ("Trying to use a saved tensor that has been detached
        in-place"); named at its line when an autograd node still holds ``t``."""
        if grad_fn(t) is None:
            return
        for entry in self.saved:  # (a saved output, or a value saved through hooks, is
            # re-attached or handed back by them: autograd raises for neither)
            if entry.origin is not None and entry.origin() is t and entry.in_graph \
                    and not entry.output and not entry.kept_as:
                where, code = self.here("detach_()")
                self.add(INPLACE_MODIFIES_SAVED_TENSOR.id, where, self.node_name("detach_"),
                         f"`{code}` detaches in place a tensor that `{entry.op}` saved for "
                         "backward: backward fails with 'Trying to use a saved tensor that has "
                         "been detached in-place'.",
                         "detach out of place, `x = x.detach()`: the saved tensor keeps its "
                         "history", related=entry.op, related_location=entry.where)
                return

    def _report_segment_input_writes(self, written: list[Tensor], code: str,
                                     where: Location | None, node: str, op: str) -> None:
        """A write into an input of a reentrant checkpoint segment that requires grad:
        backward re-runs the segment on detached copies of its inputs, leaves that require
        grad, and refuses the write (the forward, run as a plain call here, does not)."""
        for segment in self.segments:
            if any(same_storage(t, i) for t in written for i in segment.inputs):
                what, hint = self.locator.write_site(code, where, node, op)
                called = f" called at {segment.where}" if segment.where is not None else ""
                self.add(INPLACE_ON_LEAF.id, where, node,
                         f"{what} writes in place into an input of the reentrant "
                         f"torch.utils.checkpoint segment{called}: backward re-runs the segment "
                         "on detached copies of its inputs, leaves that require grad, and "
                         "fails with 'a leaf Variable that requires grad is being used in an "
                         "in-place operation'.",
                         f"{hint}; or pass use_reentrant=False to checkpoint",
                         related="checkpoint", related_location=segment.where)
                return

    def _report_saved(self, entry: SavedTensor, code: str, where: Location | None, node: str,
                      op: str = "") -> None:
        what, hint = self.locator.write_site(code, where, node, op)
        self.add(INPLACE_MODIFIES_SAVED_TENSOR.id, where, node,
                 f"{what} writes in place into a tensor that `{entry.op}` "
                 "saved for backward: backward fails with 'modified by an inplace operation' "
                 "(anomaly mode names the saving line instead of this one).",
                 hint, related=entry.op, related_location=entry.where)

    def _report_unversioned(self, entry: SavedTensor, code: str, where: Location | None,
                            node: str, op: str) -> None:
        """FXQ001 for a write through a fused kernel (``torch._fused_adam_``: the fused
        optimizers' step), which moves no version counter, so backward does not refuse it."""
        what, hint = self.locator.write_site(code, where, node, op)
        self.add(INPLACE_MODIFIES_SAVED_TENSOR.id, where, node,
                 f"{what} writes in place into a tensor that `{entry.op}` saved for "
                 f"backward, through `{op}`, a fused kernel that moves no version counter: "
                 "backward does not fail but computes with the changed value, so the "
                 "gradients are wrong, silently.",
                 hint, related=entry.op, related_location=entry.where)


def _argument_write(argument: DifferentiatedArgument, code: str) -> str:
    called = f" called at {argument.where}" if argument.where is not None else ""
    return (f"`{code}` writes in place into the argument of the function given to "
            f"torch.autograd.functional.{argument.api}{called}, which differentiates with "
            "respect to the tensor this write produced, not the argument the function received: "
            f"its result is not the derivative of the function as written")


#: Python calls that cast on the user's request (a cast the user keeps is not autocast's)
_EXPLICIT_CASTS: Final = frozenset({"to", "type", "type_as", "half", "bfloat16", "float",
                                    "double"})


def _tensors_within(value: Any, depth: int = 2) -> Iterator[Tensor]:
    """The tensors in ``value``: its pytree leaves, and those kept as attributes of the
    objects among them (a holder a pack hook returns), ``depth`` levels down."""
    for leaf in tree_leaves(value):
        if isinstance(leaf, Tensor):
            yield leaf
        elif depth and hasattr(leaf, "__dict__") and not isinstance(leaf, (nn.Module, type)):
            yield from _tensors_within(list(vars(leaf).values()), depth - 1)


def _zero_derivative(func: Any, args: tuple, kwargs: dict) -> bool:
    call = op_call(func, args, kwargs)
    if call is not None:
        return call.zero_gradient
    return bool(func.overloadpacket.__name__ in ZERO_DERIVATIVE_OPS)
