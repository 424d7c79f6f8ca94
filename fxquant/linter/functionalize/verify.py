"""Step 4 of :func:`~fxquant.linter.functionalize.functionalize_inplace`: verify a candidate.

On the example inputs, from the same RNG state, the outputs (values, dtypes,
``requires_grad``), the buffers after forward, the module state the forward changes, the
state_dict's entries and every parameter's and input's gradient must match the reference
(the protected run's gradients; where the original forward itself raises, a dot-product
test against the original's directional derivative). From another RNG state the outputs
must match too (no random draw frozen into the graph), and the module hooks must still
run.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from fxquant.linter.functionalize.compare import close, output_weights, weighted_loss
from fxquant.linter.functionalize.diagnose import Reference
from fxquant.linter.state import clone_inputs, copy_model, named_buffers, restored_state
from fxquant.linter.torch_internals import (
    MODULE_HOOK_TABLES,
    tree_flatten,
    tree_leaves,
    tree_map_only,
)

__all__ = ["verify"]

def _dropped_hooks(candidate: nn.Module, original: nn.Module) -> str | None:
    """The first module of ``original`` with hooks (``register_forward_hook``,
    ``register_full_backward_hook``, ...) that ``candidate`` no longer calls with them: a
    graph that inlined it, or replaced the call, runs no hook, and no output or gradient
    comparison sees a hook's side effects."""
    graph = getattr(candidate, "graph", None)
    called = {str(n.target) for n in graph.nodes if n.op == "call_module"} \
        if isinstance(graph, torch.fx.Graph) else None
    for name, module in original.named_modules():
        counts = [len(getattr(module, table, {})) for table in MODULE_HOOK_TABLES]
        if not any(counts):
            continue
        try:
            twin = candidate.get_submodule(name)
        except AttributeError:
            twin = None
        kept = twin is not None and (not name or called is None or name in called) and \
            [len(getattr(twin, table, {})) for table in MODULE_HOOK_TABLES] == counts
        if not kept:
            where = f"module {name!r} ({type(module).__name__})" if name else "the model itself"
            return (f"it no longer runs the hooks registered on {where} (a forward or backward "
                    "hook), which its graph does not call as a module")
    return None


def verify(candidate: nn.Module, original: nn.Module, ref: Reference, inputs: tuple,
            rng: Tensor, rtol: float, atol: float) -> str | None:
    """None when ``candidate`` matches the reference; else what differs."""
    dropped = _dropped_hooks(candidate, original)
    if dropped is not None:
        return dropped
    with restored_state(candidate):
        torch.set_rng_state(rng)
        for p in candidate.parameters():
            p.grad = None
        copies = clone_inputs(inputs)
        leaves = [t for t in tree_leaves(copies) if isinstance(t, Tensor) and t.requires_grad]
        try:
            out = candidate(*copies)
        except Exception as e:
            return f"its forward raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        got, got_spec = tree_flatten(out)
        want, want_spec = tree_flatten(ref.outputs)
        if got_spec != want_spec:
            return f"its output has another structure ({got_spec} instead of {want_spec})"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            if isinstance(w, Tensor):
                if not isinstance(g, Tensor) or not close(g, w, rtol, atol):
                    return f"output {i} differs"
            elif g != w:
                return f"output {i} differs ({g!r} instead of {w!r})"
        flags = [t.requires_grad for t in got if isinstance(t, Tensor)]
        if ref.requires_grad is not None and flags != ref.requires_grad:
            return f"its outputs' requires_grad is {flags}, the original's {ref.requires_grad}"
        buffers = dict(named_buffers(candidate))
        for name, value in ref.buffers.items():
            if name not in buffers:
                return f"it has no buffer {name!r}"
            if not close(buffers[name], value, rtol, atol):
                return f"buffer {name!r} differs after forward"
        mine, theirs = set(candidate.state_dict()), set(original.state_dict())
        if mine != theirs:
            return (f"its state_dict has other entries (missing {sorted(theirs - mine)}, "
                    f"extra {sorted(mine - theirs)}): the original's would not load into it")
        for name, value in ref.state.items():
            module_name, _, attribute = name.rpartition(".")
            try:
                got_value = getattr(candidate.get_submodule(module_name), attribute)
            except AttributeError:
                got_value = None
            if isinstance(value, Tensor):
                ok = isinstance(got_value, Tensor) and close(got_value, value, rtol, atol)
            else:
                ok = got_value == value
            if not ok:
                return (f"the original's forward changes `{name}`, module state the rewrite "
                        "does not reproduce")
        carried = sorted(n for n, b in named_buffers(candidate)
                         if isinstance(b, Tensor) and b.grad_fn is not None
                         and n not in ref.carried)
        if carried:
            return (f"buffer {carried[0]!r} carries autograd history after its forward (the "
                    "original's does not): the next step's backward would go through this "
                    "step's graph")
        try:
            weighted_loss(out).backward()
        except Exception as e:
            return f"its backward raised {type(e).__name__}: {str(e).splitlines()[0]}"
        grads = {n: None if p.grad is None else p.grad.detach().clone()
                 for n, p in candidate.named_parameters() if p.requires_grad}
        input_grads = [t.grad for t in leaves]
        if not ref.second_step_fails:  # training takes more than one step
            try:
                weighted_loss(candidate(*clone_inputs(inputs))).backward()
            except Exception as e:
                return (f"a second forward and backward raised {type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}")
    with restored_state(candidate), torch.no_grad():  # random draws must not be frozen
        torch.set_rng_state(ref.other_rng)
        again = tree_leaves(candidate(*clone_inputs(inputs)))
        if not all(close(a, b, rtol, atol) if isinstance(b, Tensor) else a == b
                   for a, b in zip(again, tree_leaves(ref.other_outputs), strict=True)):
            return ("from another RNG state its outputs differ from the original's: a random "
                    "draw of the forward (torch.randn, dropout) was frozen into the graph")
    if ref.grads is not None and not ref.forward_raised:
        for name, want_grad in ref.grads.items():
            if name not in grads:
                return f"it has no parameter {name!r}"
            got_grad = grads[name]
            if (got_grad is None) != (want_grad is None) or (
                    got_grad is not None and want_grad is not None
                    and not close(got_grad, want_grad, rtol, atol)):
                return f"the gradient of {name!r} differs"
        for i, (g, w) in enumerate(zip(input_grads, ref.input_grads, strict=False)):
            if (g is None) != (w is None) or (g is not None and w is not None
                                              and not close(g, w, rtol, atol)):
                return f"the gradient of input {i} differs"
        return None
    return _dot_product_test(original, inputs, rng, grads, ref, rtol)


def _directional_derivative(original: nn.Module, inputs: tuple, rng: Tensor,
                            tangents: dict[str, Tensor]) -> list[Tensor | None]:
    """d(outputs)/d(parameters) along ``tangents``, of the original program: forward-mode
    AD (no saved tensors, so it runs where backward cannot), or, for ops without a forward
    derivative (``out=``), central differences in float64."""
    import torch.autograd.forward_ad as fwad

    params = {n: p for n, p in original.named_parameters() if n in tangents}
    with restored_state(original):
        torch.set_rng_state(rng)
        try:
            with torch.no_grad(), fwad.dual_level():
                duals = {n: fwad.make_dual(p.detach(), tangents[n]) for n, p in params.items()}
                out = torch.func.functional_call(original, duals, clone_inputs(inputs))
                return [fwad.unpack_dual(t).tangent if isinstance(t, Tensor) else None
                        for t in tree_leaves(out)]
        except (NotImplementedError, RuntimeError):
            pass
    wide = copy_model(original).double()
    wide_inputs = tree_map_only(Tensor, lambda t: t.double() if t.is_floating_point() else t,
                                clone_inputs(inputs))
    eps = 1e-6

    def at(sign: float) -> list[Any]:
        shifted = {n: (p.detach().double() + sign * eps * tangents[n].double())
                   for n, p in params.items()}
        torch.set_rng_state(rng)
        with torch.no_grad():
            return tree_leaves(torch.func.functional_call(wide, shifted, wide_inputs))

    with restored_state(wide):
        plus, minus = at(1.0), at(-1.0)
    return [(a - b) / (2 * eps) if isinstance(a, Tensor) and a.is_floating_point() else None
            for a, b in zip(plus, minus, strict=True)]


def _dot_product_test(original: nn.Module, inputs: tuple, rng: Tensor,
                      grads: dict[str, Tensor | None], ref: Reference, rtol: float) -> str | None:
    """Where the original's backward cannot run at all: <w, J v> from the original's
    directional derivative must equal <J^T w, v> from the candidate's backward."""
    g = torch.Generator().manual_seed(7)
    tangents = {n: torch.randn(p.shape, generator=g, dtype=p.dtype).to(p.device)
                for n, p in original.named_parameters() if p.requires_grad}
    try:
        jvp = _directional_derivative(original, inputs, rng, tangents)
    except Exception as e:
        return ("its gradients cannot be checked: the original's directional derivative "
                f"raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    weights = output_weights(ref.outputs)
    lhs = sum((float((w.double() * t.double()).sum()) for w, t in zip(weights, jvp, strict=True)
               if w is not None and t is not None), 0.0)
    present = {n: g for n, g in grads.items() if g is not None}
    rhs = sum((float((present[n].double() * tangents[n].double()).sum())
               for n in tangents if n in present), 0.0)
    eps = max((torch.finfo(t.dtype).eps for t in tangents.values()), default=0.0)
    if abs(lhs - rhs) > max(rtol * 10, 1e-4, 8 * eps) * (abs(lhs) + abs(rhs)) + 1e-5:
        return f"its gradients fail the dot-product test (<w, Jv> = {lhs:.6g}, <J^T w, v> = {rhs:.6g})"
    return None
