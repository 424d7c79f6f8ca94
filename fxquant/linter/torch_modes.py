"""The two torch modes that watch a forward for the :class:`~fxquant.linter.recorder.Recorder`.

- :class:`FunctionMode` (a :class:`~torch.overrides.TorchFunctionMode`) sees each call as
  written: keyword arguments, ``.data`` reads and writes, the legacy constructor
  ``torch.Tensor([...])``, tensor hooks; it takes the user's line from the Python stack,
  lets a write autograd refuses go on (reporting it), and attributes each call's writes.
- :class:`DispatchMode` (a ``TorchDispatchMode``) sees every ATen op, recognizes writes
  from the op schema (``alias_info.is_write``) and follows where each tensor came from.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from fxquant.fx.locations import is_internal
from fxquant.linter.recorder import Recorder
from fxquant.linter.records import InplaceCall, Provenance
from fxquant.linter.rules import (
    DATA_ATTRIBUTE,
    INPLACE_ON_LEAF,
    INPLACE_REFUSED_IN_FORWARD,
    hint_for_inplace,
)
from fxquant.linter.torch_internals import (
    AFTER_REFUSED_VIEW_WRITE,
    BACKWARD_HOOK_VIEW_MARK,
    CUSTOM_FUNCTION_VIEW_MARK,
    LEAF_WRITE_ERRORS,
    LIFT_FRESH,
    OVERLAP_ERROR,
    REFUSED_VIEW_WRITES,
    TorchDispatchMode,
    autocast_caching,
    bump_version,
    has_internal_overlap,
    in_backward,
    is_data_read,
    is_data_write,
    storage_id,
    torch_function_disabled,
    tree_leaves,
    tree_map_only,
    version,
    written_tensors,
)

__all__ = ["DispatchMode", "FunctionMode"]

_FACTORIES = frozenset({
    torch.arange, torch.tensor, torch.as_tensor, torch.zeros, torch.ones, torch.full,
    torch.empty, torch.rand, torch.randn, torch.randint, torch.randperm, torch.linspace,
    torch.logspace, torch.eye,
})
#: fxquant's linter and torch's overrides: frames between a torch call and its caller
_OWN_FILES = (os.path.dirname(os.path.abspath(__file__)) + os.sep,
              os.path.abspath(torch.overrides.__file__))


def _library_call() -> tuple[bool, bool]:
    """Whether the torch call being handled was made by torch's own Python code, and
    whether that code was asked to write in place (an ``inplace=True`` argument:
    ``F.relu``, ``F.dropout``, ...); one walk of the stack for both."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(_OWN_FILES):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return False, False
    by_library = is_internal(frame.f_code.co_filename) \
        and not frame.f_code.co_filename.startswith("<")
    return by_library, by_library and frame.f_locals.get("inplace") is True


def _call_name(func: Any) -> str:
    name = getattr(func, "__name__", None) or str(func)
    return str(name)


class FunctionMode(TorchFunctionMode):
    def __init__(self, rec: Recorder) -> None:
        super().__init__()
        self.rec = rec

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        rec = self.rec
        if is_data_read(func):
            t = args[0]
            out = func(*args, **kwargs)
            if isinstance(t, Tensor) and t.requires_grad:
                where, code = rec.here(".data")
                rec.add(DATA_ATTRIBUTE.id, where, rec.node_name("data"),
                        f"`{code}` uses `.data` of a tensor that requires grad: in-place writes "
                        "through it bypass autograd's version check and give silently wrong "
                        "gradients.", DATA_ATTRIBUTE.hint)
                rec.prov[out] = Provenance(rec.get(t).input_dep)
            return out
        if is_data_write(func):  # w.data = value: w changes, autograd does not see it
            t, new = args[0], args[1] if len(args) > 1 else None
            if isinstance(t, Tensor) and t.requires_grad and not _library_call()[0]:
                where, code = rec.here(".data = ...")
                changed = None
                if rec.copy_saved and isinstance(new, Tensor) and new.shape == t.shape:
                    changed = new.detach() != t.detach()
                rec.hide([t], code, where, rec.node_name("data"), "through `.data =`", changed)
                rec.note_written(t, code, where, rec.node_name("data"), "through `.data =`")
            return func(*args, **kwargs)
        if _call_name(func) == "detach_" and args and isinstance(args[0], Tensor):
            rec.on_detach_(args[0])
        if rec.copy_saved and _call_name(func) == "register_hook" and len(args) == 2 \
                and isinstance(args[0], Tensor) and not args[0].is_leaf \
                and callable(args[1]):  # check: a tensor hook gets a gradient of its own
            args = (args[0], rec.guarded_hook(args[1]))  # (dies with the forward's graph)
        back = None
        if func is torch.autograd.grad and rec.copy_saved and rec.arguments:
            args, kwargs, back = rec.differentiate_as_given(args, kwargs)  # (check)
        rec.writes = []
        rec.write_versions = []
        first_saved = len(rec.saved)
        grad_enabled = torch.is_grad_enabled()
        if rec.copy_saved:  # (check: what a rewrite detaches)
            rec.locator.ran(grad_enabled)
        reachable = {storage_id(t) for t in tree_leaves((args, kwargs)) if isinstance(t, Tensor)}
        rec.autocast_call, rec.call_name = autocast_caching(), _call_name(func)
        rec.calls_open += 1
        try:
            out = func(*args, **kwargs)
            if back is not None:
                out = back(out)
        except RuntimeError as e:
            if AFTER_REFUSED_VIEW_WRITE in str(e) and rec.changed_outputs:
                rec.report_changed_outputs((args, kwargs))  # a custom Function's view, changed
            if AFTER_REFUSED_VIEW_WRITE in str(e) and rec.report.by_rule(INPLACE_REFUSED_IN_FORWARD.id):
                out = self._go_on(func, args, kwargs)  # a consequence of the write reported
                rec.went_on_without_grad = True
            elif any(m in str(e) for m in (*LEAF_WRITE_ERRORS, *REFUSED_VIEW_WRITES)):
                self._report_refused_write(func, e)
                out = self._go_on(func, args, kwargs,
                                  view=any(m in str(e) for m in REFUSED_VIEW_WRITES))
            else:
                raise
        finally:
            rec.calls_open -= 1
        # Under a dispatch mode torch's foreach ops (`torch._foreach_mul_`, the optimizers'
        # multi-tensor step) write without bumping the version counters: backward would not
        # notice a saved value changed, which it does without fxquant's tools
        for t, before in rec.write_versions:
            if version(t) == before and not t.is_inference():
                bump_version(t)
        rec.write_versions = []
        if len(rec.saved) > first_saved:
            rec.name_victims(first_saved, out)
        # writes into the call's own temporaries (inside gru_cell, say) are not the user's
        rec.writes = [w for w in rec.writes if storage_id(w[1]) in reachable]
        if rec.writes:
            by_library, requested = _library_call()
            rec.after_call(_call_name(func), rec.where(), grad_enabled, by_library, requested)
        if grad_enabled:
            outputs = [t for t in tree_leaves(out) if isinstance(t, Tensor) and t.requires_grad]
            if outputs:
                if len(rec.hidden):
                    rec.on_read([t for t in tree_leaves((args, kwargs)) if isinstance(t, Tensor)])
                for t in outputs:
                    rec.track_grad(t)
        if self._is_device_less_factory(func, args, kwargs) and isinstance(out, Tensor) and out.dim() > 0:
            where = rec.where()
            op = "torch.Tensor(...)" if func is LIFT_FRESH else f"torch.{_call_name(func)}"
            key = rec.origin(op, where, rec.node_name(op.split("(")[0]))
            rec.prov[out] = Provenance(factories=frozenset({key}))
        return out

    def _go_on(self, func: Any, args: tuple, kwargs: dict, view: bool = False) -> Any:
        """Run a write autograd refused so that the forward goes on: a refused view write
        out of place (its result keeps the gradient path), others without autograd."""
        rec = self.rec
        rec.writes = []
        name = _call_name(func)
        augmented = re.fullmatch(r"__i(\w+)__", name)
        plain = f"__{augmented.group(1)}__" if augmented else name[:-1] if name.endswith("_") else ""
        out_of_place = getattr(Tensor, plain, None) if (plain and not plain.startswith("_")) or \
            augmented else None
        if view and out_of_place is not None:
            out = out_of_place(*args, **kwargs)
            rec.writes = []
            return out
        if view and kwargs.get("inplace") is True:  # F.relu(x, inplace=True), nn.ReLU's call
            out = func(*args, **{**kwargs, "inplace": False})
            rec.writes = []
            return out
        try:
            with torch.no_grad():
                out = func(*args, **kwargs)
        except RuntimeError:  # views of split/chunk refuse writes even under no_grad
            detached = tree_map_only(Tensor, Tensor.detach, (args, kwargs))
            out = func(*detached[0], **detached[1])
            if detached[0] and out is detached[0][0]:  # an in-place op returns its target
                out = args[0]
        rec.writes = []
        return out

    def _report_refused_write(self, func: Any, e: RuntimeError) -> None:
        rec = self.rec
        where, code = rec.here(_call_name(func))
        first = str(e).splitlines()[0]
        rec.inplace_calls.append(InplaceCall(where, _call_name(func), False))
        if any(m in str(e) for m in REFUSED_VIEW_WRITES):
            hint = "drop out= and use the returned tensor" if "out=" in first \
                else hint_for_inplace(code, _call_name(func))
            if "out=" in first:
                what = "passes out= with inputs that require grad"
            elif BACKWARD_HOOK_VIEW_MARK in first:  # what a full backward hook returns
                what = ("writes in place into the output (or input) of a module with a full "
                        "backward hook (register_full_backward_hook), which autograd does not "
                        "let you modify")
                hint += ("; or get the gradient from a forward hook that calls "
                         "output.register_hook(...), which allows in-place ops after it")
            elif CUSTOM_FUNCTION_VIEW_MARK in str(e):
                what = ("writes in place into a view a custom autograd Function returned (or "
                        "an input it returned as-is), which autograd does not let you modify")
            else:
                what = ("writes in place into a view autograd does not let you modify (one of "
                        "several views returned by split/chunk/unbind, or a view made under "
                        "no_grad)")
            rec.add(INPLACE_REFUSED_IN_FORWARD.id, where, rec.node_name(_call_name(func)),
                    f"`{code}` {what}; forward raises: {first}", hint)
            return
        rec.add(INPLACE_ON_LEAF.id, where, rec.node_name(_call_name(func)),
                f"`{code}` writes in place (or through out=) into a leaf tensor that "
                f"requires grad; autograd raises: {first}", INPLACE_ON_LEAF.hint)

    @staticmethod
    def _is_device_less_factory(func: Any, args: tuple, kwargs: dict) -> bool:
        if func is LIFT_FRESH:  # the legacy constructor: torch.Tensor([...])
            return True
        if func not in _FACTORIES or kwargs.get("device") is not None:
            return False
        return not (func in (torch.tensor, torch.as_tensor) and args and isinstance(args[0], Tensor))


class DispatchMode(TorchDispatchMode):
    def __init__(self, rec: Recorder) -> None:
        super().__init__()
        self.rec = rec

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        rec = self.rec
        written = [(t, t.requires_grad) for t in written_tensors(func, args, kwargs)]
        before = {}
        for t, _ in written:
            if has_internal_overlap(t):  # fake tensors do not check it
                raise RuntimeError(OVERLAP_ERROR)
            if rec.copy_saved and not (torch.is_grad_enabled() and t.requires_grad) \
                    and rec.grad_owners(t):
                before[id(t)] = (t, t.detach().clone())  # check: which values it changes
        # (only foreach ops: RReLU's noise, say, is written without a bump on purpose)
        versions = [(t, version(t)) for t, _ in written if not t.is_inference()] \
            if func.overloadpacket.__name__.startswith("_foreach_") else []
        out = func(*args, **kwargs)
        rec.write_versions.extend(versions)
        for key, (t, old) in before.items():
            changed = ~((old == t) | (old.isnan() & t.isnan())) if old.is_floating_point() \
                else old != t
            prior = rec.changes.get(key)
            rec.changes[key] = changed if prior is None else prior | changed
        if rec.calls_open or in_backward():
            rec.on_aten(func, args, kwargs, out, written)  # (or autograd's backward ops)
            return out
        # No Python call is open: TorchScript code (a scripted function or module) runs.
        # The function mode is not paused as within its own calls: fxquant's bookkeeping
        # runs without it, and a write is attributed right away to the line that called
        # the scripted code.
        with torch_function_disabled():
            rec.on_aten(func, args, kwargs, out, written)
            if rec.writes:
                rec.after_call(func.overloadpacket.__name__, rec.where(),
                               torch.is_grad_enabled(), bump_pending=True)
        return out
