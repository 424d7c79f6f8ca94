"""The entry point: :func:`functionalize_inplace` runs the four steps (diagnose, rewrite
symbolically, capture, verify) and returns the first candidate that verifies."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.fx import GraphModule

from fxquant.errors import FxquantTypeError, FxquantValueError
from fxquant.fx.serial import PROCESS_LOCK
from fxquant.fx.tracer import LeafSpec, refuse_compiled
from fxquant.linter.arguments import with_concrete_args
from fxquant.linter.functionalize.capture import capture
from fxquant.linter.functionalize.diagnose import reference, refuse_unfixable
from fxquant.linter.functionalize.outcome import FunctionalizeError
from fxquant.linter.functionalize.rewrite import rewrite_symbolically
from fxquant.linter.functionalize.verify import verify
from fxquant.linter.rules import INPLACE_WITHOUT_MARK_DIRTY
from fxquant.linter.shapes import shape_only
from fxquant.linter.state import copy_model, named_buffers, refuse_lazy, restored_state
from fxquant.linter.torch_internals import module_buffers, module_parameters, non_persistent_buffers

__all__ = ["carry_state", "functionalize_inplace"]

def carry_state(original: nn.Module, gm: GraphModule) -> None:
    """Give ``gm`` every parameter and buffer of ``original`` its graph does not use (a
    counter the forward only updates, state read elsewhere), under the same name and
    persistence; constants the graph holds (a tensor the forward creates) are not saved:
    state dicts load both ways."""
    keys = set(original.state_dict())
    for name, _ in named_buffers(gm):
        if name not in keys:
            owner_name, _, attr = name.rpartition(".")
            non_persistent_buffers(gm.get_submodule(owner_name)).add(attr)
    for name, value in [*original.named_parameters(), *named_buffers(original)]:
        owner_name, _, attr = name.rpartition(".")
        try:
            there = gm.get_submodule(owner_name)
        except AttributeError:
            there = None
        if there is not None and attr in (module_parameters(there)
                                          if isinstance(value, nn.Parameter)
                                          else module_buffers(there)):
            continue
        owner: nn.Module = gm
        for part in owner_name.split(".") if owner_name else ():
            child = getattr(owner, part, None)
            if not isinstance(child, nn.Module):
                child = nn.Module()
                owner.add_module(part, child)
            owner = child
        source = original.get_submodule(owner_name)
        if isinstance(value, nn.Parameter):
            owner.register_parameter(attr, value)
        else:
            owner.register_buffer(attr, value,
                                  persistent=attr not in non_persistent_buffers(source))


def functionalize_inplace(
    model: nn.Module,
    *example_inputs: Any,
    concrete_args: dict[str, Any] | None = None,
    leaf_modules: Iterable[LeafSpec] = (),
    rtol: float = 1e-5,
    atol: float = 1e-6,
) -> nn.Module:
    """The same forward as ``model`` without in-place ops, verified on ``example_inputs``.

    Fixes what breaks backward (``+=``, ``*=``, ``clamp_``, ``relu_`` ... on saved values;
    ``x[i] = v``, ``x[:, a:b] = v``, ``masked_fill_``, ``index_put_``, ``copy_`` into views,
    also through ``chunk``/``split``/``view``; ``out=``; ``nn.ReLU(inplace=True)``) and keeps
    what was legal. The result is checked on the example inputs before it is returned:
    outputs, their ``requires_grad``, buffers after forward (counters, EMAs), the
    state_dict's entries and every parameter's gradient must match what the original's
    forward implies (see the module docstring). A model in which :func:`fxquant.check`
    finds nothing that breaks backward, and which no rewrite reproduces exactly, is
    returned as it is (a copy), with a warning that nothing needed rewriting.

    Args:
        model (torch.nn.Module): the model; not modified (the result owns a copy).
        *example_inputs: forward arguments; the rewrite is verified on them.
        concrete_args (dict, optional): forward arguments fixed by name, as in
            :func:`fxquant.trace`: the symbolic rewrite is traced with them, and the
            original and the rewrite run with them (put in their places of forward's
            signature) where they are verified.
        leaf_modules: passed to :func:`fxquant.trace`.
        rtol, atol (float, optional): tolerance of the verification.

    Returns:
        torch.fx.GraphModule: ``gm.meta["fxquant_rewrites"]`` lists each :class:`Rewrite`
        (line, before, after); ``gm.meta["fxquant_functionalized"]`` is ``"symbolic"`` or
        ``"captured"`` (an ATen graph specialized to the example's shapes, branches and
        non-tensor arguments, which raises when called with others, or with arguments the
        example did not pass, other than forward's defaults).
        For a model that needed nothing rewritten and that no rewrite reproduces, a copy
        of ``model`` itself (same class and state), with a :class:`UserWarning`.

    Raises:
        FunctionalizeError: the model writes into a leaf that requires grad, writes where
            autograd does not see it (``.data``) in a way that changes gradients, or breaks
            backward and no rewrite reproduced it; the message names the line and the fix.

    Example:
        >>> class Model(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.lin = torch.nn.Linear(3, 3)
        ...     def forward(self, x):
        ...         y = torch.exp(self.lin(x))
        ...         y += 1  # exp saved y: backward fails
        ...         return y * 2
        >>> gm = functionalize_inplace(Model(), torch.randn(2, 3))
        >>> [(r.before, r.after) for r in gm.meta["fxquant_rewrites"]]
        [('`x += y` (in place)', '`x = x + y` (a new tensor)')]
    """
    if not isinstance(model, nn.Module):
        raise FxquantTypeError("fxquant.functionalize_inplace expects a torch.nn.Module, got "
                        f"{type(model).__name__}")
    refuse_compiled(model, "functionalize_inplace")
    refuse_lazy(model, "functionalize_inplace")
    if not example_inputs:
        raise FxquantTypeError("functionalize_inplace verifies its rewrite on example inputs: please "
                        "pass them, functionalize_inplace(model, *inputs)")
    if shape_only(example_inputs):
        raise FxquantValueError("functionalize_inplace verifies its rewrite on values, but some example "
                         "inputs are shapes only (ShapeSpec or meta tensors): pass real tensors")
    example_inputs = with_concrete_args(model, example_inputs, concrete_args,
                                        "functionalize_inplace")
    with PROCESS_LOCK, restored_state(model), torch.enable_grad():
        rng = torch.get_rng_state()
        original = copy_model(model)
        ref = reference(original, example_inputs, rng)
        refuse_unfixable(ref.report, ref.hidden, ref.output_writes, ref.argument_writes)
        for f in ref.report.by_rule(INPLACE_WITHOUT_MARK_DIRTY.id):  # (custom Functions
            # are not rewritten: what they break is said, the rest verified)
            warnings.warn(f"functionalize_inplace: {f.where}: {f.message} Fix: {f.hint}",
                          UserWarning, stacklevel=2)
        failures: list[str] = []
        candidates: list[tuple[str, Callable[[], GraphModule]]] = [
            ("the symbolic rewrite", lambda: rewrite_symbolically(copy_model(model), ref.calls,
                                                       concrete_args, leaf_modules,
                                                       ref.no_grad_lines)),
            ("the captured forward", lambda: capture(copy_model(model), example_inputs,
                                                      ref.calls)),
        ]
        for label, build in candidates:
            try:
                gm = build()
                carry_state(original, gm)
                problem = verify(gm, original, ref, example_inputs, rng, rtol, atol)
            except KeyboardInterrupt:
                raise
            except Exception as e:  # a rewrite fxquant cannot build or run is not returned
                first = str(e).splitlines()[0] if str(e) else type(e).__name__
                failures.append(f"{label} could not be built: {first}")
                continue
            if problem is None:
                return gm
            failures.append(f"{label} does not match the original: {problem}")
        if not ref.report.errors:
            warnings.warn(
                "functionalize_inplace: fxquant.check finds nothing in this model that breaks "
                "backward, so nothing needed rewriting, and no out-of-place rewrite matched it "
                "exactly (" + "; ".join(failures) + "): the model is returned as it is (a "
                "copy, state included)", UserWarning, stacklevel=2)
            return copy_model(model)
    legal = "".join(f"\nfxquant.check reports {f.rule} at {f.where}: {f.message}"
                    for f in ref.report.errors)
    raise FunctionalizeError(
        "functionalize_inplace found no rewrite that matches the original on the example "
        "inputs, so it returns none:\n  " + "\n  ".join(failures) + legal)
