"""Helpers for users' own test suites (and fxquant's).

- :func:`assert_backward_safe`: fail a test when a model's backward crashes, gives wrong
  gradients, or starves a parameter, with fxquant's findings (source lines) in the message.
- :func:`devices_touched`: the devices of every tensor an ATen op reads or makes while a
  function runs, e.g. to prove that no constant is pinned to the CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from fxquant.errors import BackwardSafetyError, FxquantValueError

__all__ = ["assert_backward_safe", "devices_touched"]


def assert_backward_safe(
    model: torch.nn.Module,
    *example_inputs: Any,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    allow: Iterable[str] = (),
    strict: bool = False,
) -> None:
    """Assert that ``model``'s backward runs and gives the gradients its forward implies.

    Runs :func:`fxquant.check` (forward and backward on copies; the model and global state
    are left as they were) and raises :class:`AssertionError` listing every error finding
    with its source line and fix: in-place writes into saved tensors or leaves, writes
    autograd does not see, a forward or backward that raises. Warnings (a parameter with a
    None or all-zero gradient, factory calls without device=) fail too when ``strict``.

    Args:
        model (torch.nn.Module): the model under test.
        *example_inputs: its forward arguments (real tensors: backward runs on them).
        loss_fn (callable, optional): maps the output to a scalar loss.
        allow (iterable of str, optional): rule ids to ignore, e.g. ``["FXQ008"]``.
        strict (bool, optional): warnings fail too. (default: :obj:`False`)

    Example:
        >>> class Doubler(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.lin = torch.nn.Linear(3, 3)
        ...     def forward(self, x):
        ...         y = self.lin(x).sigmoid()
        ...         y *= 2  # sigmoid saved y for backward
        ...         return y
        >>> assert_backward_safe(torch.nn.Linear(3, 3), torch.randn(4, 3))  # passes
        >>> try:
        ...     assert_backward_safe(Doubler(), torch.randn(4, 3))
        ... except AssertionError as e:
        ...     print(str(e).splitlines()[0])
        backward is not safe: 1 finding(s)
    """
    from fxquant.linter import RULES, check

    allowed = set(allow)
    unknown = allowed - set(RULES)
    if unknown:
        raise FxquantValueError(f"allow: unknown rule ids {sorted(unknown)}; known: {sorted(RULES)}")
    report = check(model, *example_inputs, loss_fn=loss_fn)
    failing = [f for f in report.findings if f.rule not in allowed and (
        f.severity == "error" or (strict and f.severity == "warning"))]
    if failing:
        lines = [f"backward is not safe: {len(failing)} finding(s)"]
        for f in failing:
            lines.append(f"  {f.rule} {f.severity} at {f.where or f.node}: {f.message}")
            lines.append(f"    fix: {f.hint}")
        raise BackwardSafetyError("\n".join(lines))


class _Devices(TorchDispatchMode):
    """Collects the device of every tensor any ATen op reads or makes."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves((args, kwargs, out)):
            if isinstance(t, torch.Tensor):
                self.seen.add(t.device.type)
        return out


def devices_touched(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> set[str]:
    """Device types of all tensors the ATen ops inside ``fn(*args, **kwargs)`` touch.

    Example:
        >>> import fxquant
        >>> devices_touched(fxquant.truncate, torch.empty(4, 4, device="meta"), 10, "nearest")
        {'meta'}
    """
    with _Devices() as mode:
        fn(*args, **kwargs)
    return mode.seen
