"""Watching a real forward: the recording behind the dynamic lint and the check.

Symbolic tracing cannot see ``x *= y`` (it records an out-of-place ``mul``), ``x[idx] = v``
(it raises), factory calls (they become constants) or ``.data`` (it looks like
``.detach()``). Here the forward runs for real, under three instruments
(:class:`Instruments`) that share one :class:`~fxquant.linter.recorder.Recorder`:

- a torch-function mode (:class:`~fxquant.linter.torch_modes.FunctionMode`), which sees
  each call as written (keyword arguments, ``.data`` access, the legacy
  ``torch.Tensor([...])`` constructor) and takes the user's source line from the Python
  stack, including frames of helper functions;
- a dispatch mode (:class:`~fxquant.linter.torch_modes.DispatchMode`), which sees every ATen
  op and recognizes writes from the op schema (``alias_info.is_write``), and follows where
  each tensor came from (inputs, parameters, device-less factories, zero-derivative ops);
- saved-tensor hooks (:meth:`~fxquant.linter.recorder.Recorder.pack`), which record every
  tensor autograd saves, with its version counter and the op and line that saved it.
  Which op saves what is therefore observed, never guessed.

An in-place op is the culprit when a saved tensor's version changes during it; the op
that saved the tensor is the victim (the one ``set_detect_anomaly`` would name). A write
into a saved tensor's storage that leaves its version alone (through ``.data``) is a silent
culprit: backward will run with the changed value.

A *hidden* write changes a tensor that requires grad where autograd cannot see it: through
``.data`` (also ``w.data = ...``), through a ``.detach()``ed alias, or under
``torch.no_grad()``. When a differentiable op then computes with that tensor, backward runs
but its gradient skips the change (a silently wrong gradient, at the write, naming the
reading line). Writes PyTorch itself makes (``nn.Embedding(max_norm=...)`` renormalizing
its weight) are its documented behaviour and are not reported. In-place writes into a view
autograd forbids writing (one of the outputs of ``split``/``chunk``/``unbind``) raise in
forward and are reported as refused there.

:func:`installed` pushes the three and pops exactly them again (by identity), whatever the
forward pushed or left behind. Where fxquant's own recording fails on a forward that runs
without it, fewer instruments are tried (:data:`LADDER`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import torch
from torch import Tensor, nn
from torch.fx import GraphModule, Interpreter, Node
from torch.overrides import TorchFunctionMode

from fxquant.fx.locations import traceback_location
from fxquant.linter.recorder import Recorder
from fxquant.linter.report import Finding, LintReport
from fxquant.linter.rules import (
    DATA_ATTRIBUTE,
    FACTORY_WITHOUT_DEVICE,
    FORWARD_FAILED,
    HIDDEN_WRITE_THEN_READ,
    INPLACE_MODIFIES_SAVED_TENSOR,
    INPLACE_OVERWRITES_GRAD_TENSOR,
    NOT_VISIBLE,
    SILENTLY_WRONG_GRADIENT,
    ZERO_GRADIENT_OP,
)
from fxquant.linter.state import held_tensors, named_buffers, pop_saved_tensors_hooks_until
from fxquant.linter.torch_internals import (
    TorchDispatchMode,
    custom_function_apply_watched,
    dispatch_mode_stack,
    function_mode_stack,
    functional_arguments_watched,
    instruments_available,
    pop_dispatch_mode,
    pop_function_mode,
    pop_saved_tensors_hooks,
    push_saved_tensors_hooks,
    reentrant_checkpoint_replaced,
    saved_tensors_hooks_pushes_wrapped,
    top_saved_tensors_hooks,
    tree_leaves,
    warn_missing,
)
from fxquant.linter.torch_modes import DispatchMode, FunctionMode

__all__ = [
    "LADDER",
    "GraphRunner",
    "Instruments",
    "installed",
    "instrument_failure",
    "internal_failure",
    "model_tensors",
    "report_exception",
    "run_forward",
]


class GraphRunner(Interpreter):
    """Runs a GraphModule node by node so findings can name the FX node."""

    def __init__(self, gm: GraphModule, rec: Recorder) -> None:
        super().__init__(gm)
        self.rec = rec

    def run_node(self, n: Node) -> Any:
        self.rec.locator.node = n
        try:
            return super().run_node(n)
        finally:
            self.rec.locator.node = None


@dataclass(frozen=True)
class Instruments:
    """Which recording tools :func:`installed` pushes. Each one that is off costs the
    checks that :meth:`lost` names; fewer tools are used only when fxquant's own tools fail
    on a forward that runs without them (:data:`LADDER`)."""

    functions: bool = True  # the TorchFunctionMode: calls as written, `.data`, lines
    dispatch: bool = True  # the TorchDispatchMode: every ATen op, writes from the schema
    hooks: bool = True  # the saved-tensor hooks: what autograd saves, and when

    def lost(self) -> str:
        """What cannot be checked without the tools that are off ('' with all on)."""
        lost = []
        if not self.hooks:
            lost.append("which op saved which tensor, so in-place writes into saved values "
                        f"({INPLACE_MODIFIES_SAVED_TENSOR.id}) and silent changes to them "
                        f"({SILENTLY_WRONG_GRADIENT.id}) are found only as far as the "
                        "gradients show them")
        if not self.dispatch:
            lost.append("the ATen ops: writes autograd does not see "
                        f"({SILENTLY_WRONG_GRADIENT.id}, {HIDDEN_WRITE_THEN_READ.id}), "
                        f"overwrites ({INPLACE_OVERWRITES_GRAD_TENSOR.id}), device-less "
                        f"factories ({FACTORY_WITHOUT_DEVICE.id}) and zero-derivative ops "
                        f"({ZERO_GRADIENT_OP.id})")
        if not self.functions:
            lost.append(f"the Python calls: `.data` ({DATA_ATTRIBUTE.id}) and the lines of "
                        "in-place calls")
        return "; ".join(lost)

    def within(self, available: set[str]) -> Instruments:
        """These tools, less those not ``available`` (by field name)."""
        return Instruments(self.functions and "functions" in available,
                           self.dispatch and "dispatch" in available,
                           self.hooks and "hooks" in available)

    def describe(self) -> str:
        """The tools that are on, in words."""
        tools = [name for on, name in ((self.functions, "the torch-function mode"),
                                       (self.dispatch, "the dispatch mode"),
                                       (self.hooks, "the saved-tensor hooks")) if on]
        return ", ".join(tools) if tools else "no instrument (the plain forward)"


#: The instruments tried in turn when fxquant's own recording fails on a forward that
#: runs without it: all, then without the saved-tensor hooks, then the function mode
#: alone, then none (the plain run, which still reports what backward raises).
LADDER: Final = (Instruments(), Instruments(hooks=False), Instruments(dispatch=False, hooks=False),
                 Instruments(functions=False, dispatch=False, hooks=False))


@contextlib.contextmanager
def installed(rec: Recorder, tools: Instruments = Instruments()) -> Iterator[None]:
    """Grad mode on, the saved-tensor hooks and both modes pushed (those ``tools`` asks
    for, and this torch has: :func:`~fxquant.linter.torch_internals.instruments_available`);
    popped by identity.

    While the hooks record, reentrant ``torch.utils.checkpoint`` segments run as plain
    calls (``Recorder.run_segment``), each custom Function is watched around its ``apply``
    (``Recorder.watch_function``), and saved-tensor hooks the forward pushes are pushed
    watched (``Recorder.user_hooks``).

    Entries the forward pushed above fxquant's and left there are popped first, so that
    fxquant's own entries come off, and the user's stack is as it was before.
    """
    warn_missing()
    available = instruments_available()
    tools = tools.within(available)
    function_mode, dispatch_mode = FunctionMode(rec), DispatchMode(rec)
    with torch.enable_grad():
        below = top_saved_tensors_hooks() if "hooks" in available else None
        if tools.hooks:
            push_saved_tensors_hooks(rec.pack, rec.unpack)
        try:
            with contextlib.ExitStack() as stack:
                if tools.hooks:  # (these record saved values: part of the hooks' work)
                    stack.enter_context(reentrant_checkpoint_replaced(rec.run_segment))
                    stack.enter_context(custom_function_apply_watched(rec.watch_function))
                    stack.enter_context(saved_tensors_hooks_pushes_wrapped(rec.user_hooks))
                if tools.functions:
                    stack.enter_context(functional_arguments_watched(rec.watch_arguments))
                    function_mode.__enter__()
                    stack.callback(_pop_function_mode, function_mode)
                if tools.dispatch:
                    dispatch_mode.__enter__()
                    stack.callback(_pop_dispatch_mode, dispatch_mode)
                yield
        finally:
            if tools.hooks:
                pop_saved_tensors_hooks_until((rec.pack, rec.unpack))
                top = top_saved_tensors_hooks()
                if top is not None and top[0] is rec.pack:
                    pop_saved_tensors_hooks()
            elif "hooks" in available:
                pop_saved_tensors_hooks_until(below)


def instrument_failure(tools: Instruments, fallback: Instruments, error: BaseException,
                       phase: str) -> Finding:
    """FXQ010: fxquant's recording failed where the plain run works, and what the run with
    fewer instruments could not check."""
    first = str(error).splitlines()[0] if str(error) else ""
    lost = fallback.lost()
    return Finding(
        NOT_VISIBLE.id, "instruments", traceback_location(error),
        f"fxquant's recording ({tools.describe()}) failed on this model's {phase} "
        f"({type(error).__name__}: {first[:200]}), which runs without it: a limit of "
        f"fxquant, not an error in the model. It was checked again with "
        f"{fallback.describe()}" + (f"; not checked: {lost}." if lost else "."),
        "nothing to fix in the model; to check what was skipped, run the forward in "
        "pieces (fxquant.check on a submodule), and please report the failure to fxquant")


def _pop_function_mode(mode: TorchFunctionMode) -> None:
    if not any(m is mode for m in function_mode_stack()):
        return
    while function_mode_stack()[-1] is not mode:
        pop_function_mode()
    mode.__exit__(None, None, None)


def _pop_dispatch_mode(mode: TorchDispatchMode) -> None:
    if not any(m is mode for m in dispatch_mode_stack()):
        return
    while dispatch_mode_stack()[-1] is not mode:
        pop_dispatch_mode()
    mode.__exit__(None, None, None)


def run_forward(model: nn.Module, inputs: tuple, rec: Recorder) -> Any:
    """Call the model (node by node for a GraphModule), findings bounded to its frames."""
    rec.locator.boundary = sys._getframe()
    out = GraphRunner(model, rec).run(*inputs) if isinstance(model, GraphModule) else model(*inputs)
    if rec.changed_outputs:  # (returned as they are: the loss reads them next)
        rec.report_changed_outputs(out)
    return out


def model_tensors(model: nn.Module, inputs: Any) -> list[Tensor]:
    """The tensors a forward starts from: inputs (PyG Data fields too), parameters, buffers."""
    found = [t for t in tree_leaves(inputs) if isinstance(t, Tensor)]
    for obj in (inputs if isinstance(inputs, tuple) else (inputs,)):
        stores = getattr(obj, "stores", None)  # PyG Data / HeteroData
        if stores is not None:
            found += [v for s in stores for v in s.values() if isinstance(v, Tensor)]
    buffers = [t for _, b in named_buffers(model) for t in held_tensors(b)]
    return found + list(model.parameters()) + buffers


def internal_failure(error: BaseException, what: str) -> Finding:
    """FXQ010: fxquant's own analysis raised (never the model's error); what it found
    before is kept."""
    first = str(error).splitlines()[0] if str(error) else ""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    where = next((f"{os.path.relpath(f.filename, os.path.dirname(package.rstrip(os.sep)))}:"
                  f"{f.lineno}" for f in reversed(traceback.extract_tb(error.__traceback__))
                  if f.filename.startswith(package)), "")
    return Finding(
        NOT_VISIBLE.id, "fxquant", None,
        f"fxquant's {what} stopped on an error of its own ({type(error).__name__}: "
        f"{first[:200]}{f' at {where}' if where else ''}); the findings listed were made "
        "before it, and what it had still to check was not checked. This is not an error "
        "in the model.",
        "please report it to fxquant with the model; the model itself needs no change for it")


def report_exception(report: LintReport, phase: str, e: BaseException) -> None:
    """FXQ009 at the user's line that raised."""
    first = str(e).splitlines()[0] if str(e) else ""
    report.add(Finding(FORWARD_FAILED.id, phase, traceback_location(e),
                       f"{phase} raised {type(e).__name__}: {first}",
                       FORWARD_FAILED.hint))
