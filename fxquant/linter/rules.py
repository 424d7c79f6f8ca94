"""The rule table and the messages both lints share.

Severity is a property of the rule, looked up here, never passed at a finding's site. The
hints fit the op that was written: ``+=`` gets ``x = x + y``, an index assignment gets
``torch.where`` / ``index_put``, an ``inplace=True`` module gets ``inplace=False``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

__all__ = ["RULES", "Rule", "Severity", "hint_for_inplace", "severity_of"]

Severity = Literal["error", "warning", "info"]


@dataclass(frozen=True)
class Rule:
    """A lint rule: stable id, short name, severity and what it means."""

    id: str
    name: str
    severity: Severity
    description: str


#: Every rule the linter and the autograd check report, by stable id.
RULES: Final[dict[str, Rule]] = {
    r.id: r
    for r in (
        Rule("FXQ001", "inplace-modifies-saved-tensor", "error",
             "An in-place op writes into a tensor (or a view of its base) that an earlier op "
             "saved for backward; backward fails with 'modified by an inplace operation'."),
        Rule("FXQ002", "inplace-overwrites-grad-tensor", "warning",
             "An in-place write overwrites elements of a tensor that requires grad; legal, "
             "but the overwritten elements no longer pass gradient to what computed them."),
        Rule("FXQ003", "inplace-on-leaf", "error",
             "An in-place op (or out=) writes into a leaf tensor that requires grad "
             "(e.g. a parameter); autograd refuses it."),
        Rule("FXQ004", "data-attribute", "warning",
             "`.data` on a tensor that requires grad: writes through it are invisible to "
             "autograd and give silently wrong gradients."),
        Rule("FXQ005", "factory-without-device", "warning",
             "A tensor is created without device= and then meets data derived from the "
             "inputs or parameters; it stays on the CPU when the model moves to a GPU."),
        Rule("FXQ006", "anomaly-mode-in-forward", "warning",
             "torch.autograd.set_detect_anomaly / detect_anomaly is called from forward: it "
             "slows every step and stays on for the whole process."),
        Rule("FXQ007", "zero-gradient-op", "warning",
             "An op whose derivative is zero almost everywhere (floor, round, sign, "
             "comparisons, reinterpreted bits, argmax, ...) lies between parameters and the "
             "output: parameters upstream receive zero gradient through it."),
        Rule("FXQ008", "parameter-without-gradient", "warning",
             "After one backward, a parameter's gradient is None or exactly zero."),
        Rule("FXQ009", "forward-failed", "error",
             "Running the model (forward or backward) raised an exception."),
        Rule("FXQ010", "not-visible", "info",
             "Something the linter could not see in this mode."),
        Rule("FXQ011", "inplace-maybe-saved", "warning",
             "An in-place op writes into a value an earlier op may have saved for backward; "
             "the symbolic graph cannot tell. Lint with example inputs to know."),
        Rule("FXQ012", "silently-wrong-gradient", "error",
             "Backward runs but gives wrong gradients: a write autograd does not see "
             "(through `.data`, a `.detach()`ed alias, or under no_grad) changed a value "
             "autograd saved, or changed a tensor that requires grad where backward then "
             "sends it gradient (found by fxquant.check)."),
        Rule("FXQ013", "inplace-refused-in-forward", "error",
             "A write autograd refuses already in forward: into one of the views "
             "split/chunk/unbind return, into a view made under no_grad, or through out= "
             "with inputs that require grad."),
        Rule("FXQ014", "hidden-write-then-read", "warning",
             "A write autograd does not see changes a tensor that requires grad, and a "
             "differentiable op then computes with it: the gradient may skip the change; "
             "fxquant.check runs backward and tells (FXQ012)."),
    )
}


def severity_of(rule: str) -> Severity:
    """The severity of a rule id."""
    return RULES[rule].severity


_AUGMENTED = re.compile(r"(?<![=!<>])([-+*/%@&|^]|//|\*\*|<<|>>)=(?!=)")
_INDEXED_WRITE = re.compile(r"\]\s*=(?!=)")
_METHOD = re.compile(r"\.(\w+)_\(")


def hint_for_inplace(code: str, op: str = "") -> str:
    """How to write the in-place statement ``code`` (ATen op ``op``) out of place.

    Example:
        >>> hint_for_inplace("out *= 2**e")
        'write it out of place: `out = out * 2**e` (a new tensor; what autograd saved stays intact)'
        >>> print(hint_for_inplace("x[idx] = v"))
        build a new tensor instead: `x = torch.where(mask, v, x)` or `x = x.index_put((idx,), v)`, \
or write into `x.clone()`
        >>> hint_for_inplace("h = F.relu(h, inplace=True)")
        'pass inplace=False (the default): `F.relu(h, inplace=False)` returns a new tensor'
        >>> hint_for_inplace("y.clamp_(0, 1)")
        'call the out-of-place version: `y.clamp(...)` instead of `y.clamp_(...)`, and use its result'
    """
    text = code.strip()
    if ".data" in text:
        return ("use `.detach()` (autograd then checks the write) and compute a new tensor out of "
                "place, or make the change under `with torch.no_grad():` where nothing saved it")
    if "inplace=True" in text.replace(" ", ""):
        call = text.split("=", 1)[1].strip() if re.match(r"^\w+\s*=[^=]", text) else text
        return ("pass inplace=False (the default): "
                f"`{call.replace('inplace=True', 'inplace=False')}` returns a new tensor")
    augmented = _AUGMENTED.search(text)
    if augmented:
        target = text[: augmented.start()].strip()
        operator = augmented.group(1)
        value = text[augmented.end():].strip()
        if "[" not in target:
            return (f"write it out of place: `{target} = {target} {operator} {value}` (a new "
                    "tensor; what autograd saved stays intact)")
        base = target.split("[", 1)[0].strip()
        return (f"write into a copy: `{base} = {base}.clone()` first (or, for a list element, "
                f"`{target} = {target} {operator} {value}`), so the saved value stays intact")
    if _INDEXED_WRITE.search(text) or op in ("index_put_", "_index_put_impl_", "copy_",
                                             "masked_fill_", "index_fill_", "index_copy_",
                                             "masked_scatter_", "scatter_", "fill_"):
        target = text.split("[", 1)[0].split("=")[-1].strip() if "[" in text else "x"
        return (f"build a new tensor instead: `{target} = torch.where(mask, v, {target})` or "
                f"`{target} = {target}.index_put((idx,), v)`, or write into `{target}.clone()`")
    method = _METHOD.search(text)
    if method:
        name = method.group(1)
        obj = text[: method.start()].split("=")[-1].strip() or "x"
        return (f"call the out-of-place version: `{obj}.{name}(...)` instead of "
                f"`{obj}.{name}_(...)`, and use its result")
    if op.endswith("_"):
        return (f"the module or function called here writes in place ({op}): construct it with "
                "inplace=False (e.g. nn.ReLU(inplace=False)), or .clone() its input first")
    return "write it out of place (a new tensor), or .clone() the value before writing into it"
