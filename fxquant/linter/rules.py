"""The rule table and the messages both lints share.

Severity is a property of the rule, looked up here, never passed at a finding's site. The
hints fit the op that was written: ``+=`` gets ``x = x + y``, an index assignment gets
``torch.where`` / ``index_put``, an ``inplace=True`` module gets ``inplace=False``.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "ANOMALY_MODE_IN_FORWARD",
    "BACKWARD_WRITES_GRADIENT",
    "DATA_ATTRIBUTE",
    "FACTORY_WITHOUT_DEVICE",
    "FORWARD_FAILED",
    "HIDDEN_WRITE_THEN_READ",
    "INPLACE_MAYBE_SAVED",
    "INPLACE_MODIFIES_SAVED_TENSOR",
    "INPLACE_ON_DIFFERENTIATED_ARGUMENT",
    "INPLACE_ON_LEAF",
    "INPLACE_OVERWRITES_GRAD_TENSOR",
    "INPLACE_REFUSED_IN_FORWARD",
    "INPLACE_WITHOUT_MARK_DIRTY",
    "NOT_VISIBLE",
    "PARAMETER_WITHOUT_GRADIENT",
    "RULES",
    "SILENTLY_WRONG_GRADIENT",
    "STALE_AUTOCAST_CAST",
    "ZERO_GRADIENT_OP",
    "Rule",
    "Severity",
    "hint_for_inplace",
    "out_of_place",
    "rules_table",
    "severity_of",
    "split_augmented",
    "strip_comment",
]

Severity = Literal["error", "warning", "info"]


@dataclass(frozen=True)
class Rule:
    """A lint rule: its stable id, short name, severity, what it finds (one line, for
    tables), what it means, and how to fix it in general (a finding's own hint fits the
    line it names).

    Each rule is a constant of this module named after it (``INPLACE_ON_LEAF`` is
    ``inplace-on-leaf``); code refers to a rule through it, never by its id written out.

    Example:
        >>> INPLACE_ON_LEAF.id, INPLACE_ON_LEAF.severity
        ('FXQ003', 'error')
        >>> RULES["FXQ003"] is INPLACE_ON_LEAF
        True
    """

    id: str
    name: str
    severity: Severity
    summary: str
    description: str
    hint: str


INPLACE_MODIFIES_SAVED_TENSOR: Final = Rule(
    "FXQ001", "inplace-modifies-saved-tensor", "error",
    "an in-place write into a tensor (or a view of its base) that an earlier op saved for "
    "backward: backward fails",
    "An in-place op writes into a tensor (or a view of its base) that an earlier op saved for "
    "backward; backward fails with 'modified by an inplace operation'.",
    "write it out of place (`y = y * 2` for `y *= 2`), or write into a `.clone()`; "
    "fxquant.functionalize_inplace rewrites such writes")
INPLACE_OVERWRITES_GRAD_TENSOR: Final = Rule(
    "FXQ002", "inplace-overwrites-grad-tensor", "warning",
    "an in-place overwrite of a tensor that requires grad (legal; those elements get no "
    "gradient)",
    "An in-place write overwrites elements of a tensor that requires grad; legal, but the "
    "overwritten elements no longer pass gradient to what computed them.",
    "if they should train, build the result with torch.where(mask, value, x)")
INPLACE_ON_LEAF: Final = Rule(
    "FXQ003", "inplace-on-leaf", "error",
    "an in-place write into a leaf that requires grad (a parameter)",
    "An in-place op (or out=) writes into a leaf tensor that requires grad (e.g. a "
    "parameter); autograd refuses it.",
    "initialize or modify parameters under `with torch.no_grad():` (or with torch.nn.init), "
    "or compute out of place")
DATA_ATTRIBUTE: Final = Rule(
    "FXQ004", "data-attribute", "warning",
    "`.data` on a tensor that requires grad",
    "`.data` on a tensor that requires grad: writes through it are invisible to autograd and "
    "give silently wrong gradients.",
    "use .detach() (autograd still checks writes) or `with torch.no_grad():`")
FACTORY_WITHOUT_DEVICE: Final = Rule(
    "FXQ005", "factory-without-device", "warning",
    "a tensor created without `device=` that meets input-derived data",
    "A tensor is created without device= and then meets data derived from the inputs or "
    "parameters; it stays on the CPU when the model moves to a GPU.",
    "pass device=x.device, dtype=x.dtype (x: the tensor it meets)")
ANOMALY_MODE_IN_FORWARD: Final = Rule(
    "FXQ006", "anomaly-mode-in-forward", "warning",
    "`set_detect_anomaly` / `detect_anomaly` called from forward",
    "torch.autograd.set_detect_anomaly / detect_anomaly is called from forward: it slows "
    "every step and stays on for the whole process.",
    "remove it from forward; to debug, wrap one step in "
    "`with torch.autograd.detect_anomaly():` or run fxquant.check(model, *inputs)")
ZERO_GRADIENT_OP: Final = Rule(
    "FXQ007", "zero-gradient-op", "warning",
    "an op with zero derivative almost everywhere between parameters and the output",
    "An op whose derivative is zero almost everywhere (floor, round, sign, comparisons, "
    "reinterpreted bits, argmax, ...) lies between parameters and the output: parameters "
    "upstream receive zero gradient through it.",
    "simulate precision with fxquant.truncate (straight-through gradient), or use a "
    "straight-through estimator: x + (f(x) - x).detach()")
PARAMETER_WITHOUT_GRADIENT: Final = Rule(
    "FXQ008", "parameter-without-gradient", "warning",
    "(check) a parameter whose gradient is None or all zero",
    "After one backward, a parameter's gradient is None or exactly zero.",
    f"make the ops between it and the loss differentiable (see the {ZERO_GRADIENT_OP.id} "
    "findings), e.g. fxquant.truncate instead of bit-plane code")
FORWARD_FAILED: Final = Rule(
    "FXQ009", "forward-failed", "error",
    "the forward or backward raised",
    "Running the model (forward or backward) raised an exception.",
    "fix the exception first; findings before it are listed")
NOT_VISIBLE: Final = Rule(
    "FXQ010", "not-visible", "info",
    "what this mode could not see (symbolic graph, shapes only, a fallback instrument)",
    "Something the linter could not see in this mode.",
    "nothing to fix in the model: the note says what was not checked and how to check it")
INPLACE_MAYBE_SAVED: Final = Rule(
    "FXQ011", "inplace-maybe-saved", "warning",
    "(symbolic) an in-place write into a value an earlier op may have saved",
    "An in-place op writes into a value an earlier op may have saved for backward; the "
    "symbolic graph cannot tell. Lint with example inputs to know.",
    "lint with example inputs (fxquant.lint(model, *inputs)), or write out of place")
SILENTLY_WRONG_GRADIENT: Final = Rule(
    "FXQ012", "silently-wrong-gradient", "error",
    "(check) backward runs but gives wrong gradients: a write autograd does not see",
    "Backward runs but gives wrong gradients: a write autograd does not see (through "
    "`.data`, a `.detach()`ed alias, or under no_grad) changed a value autograd saved, or "
    "changed a tensor that requires grad where backward then sends it gradient (found by "
    "fxquant.check).",
    "compute the new value out of place with autograd on and use it (`w = f(w)`); a "
    "straight-through change on purpose: `y = y + (f(y) - y).detach()`")
INPLACE_REFUSED_IN_FORWARD: Final = Rule(
    "FXQ013", "inplace-refused-in-forward", "error",
    "a write autograd refuses in forward (a view of `split`/`chunk` or of a custom "
    "`autograd.Function`, `out=` with grad, an `expand`ed tensor)",
    "A write autograd refuses already in forward: into one of the views split/chunk/unbind "
    "return, into a view made under no_grad, through out= with inputs that require grad, or "
    "into a view a custom autograd.Function returned (under no_grad the write goes through "
    "and the next op reading the view raises, naming its own line).",
    "write out of place (a new tensor), or write into a `.clone()` of the view")
HIDDEN_WRITE_THEN_READ: Final = Rule(
    "FXQ014", "hidden-write-then-read", "warning",
    "a write autograd does not see, then computed with (check tells whether it matters)",
    "A write autograd does not see changes a tensor that requires grad, and a "
    "differentiable op then computes with it: the gradient may skip the change; "
    f"fxquant.check runs backward and tells ({SILENTLY_WRONG_GRADIENT.id}).",
    "compute the new value out of place with autograd on and use it, e.g. "
    "`w = F.normalize(self.weight, dim=1)` then `F.linear(x, w)` (or "
    "torch.nn.utils.parametrize); a straight-through change on purpose: "
    "`y = y + (f(y) - y).detach()`")
BACKWARD_WRITES_GRADIENT: Final = Rule(
    "FXQ015", "backward-writes-gradient", "warning",
    "a custom `autograd.Function`'s backward writes into the gradient it receives",
    "A custom autograd.Function's backward writes in place into the gradient it receives; "
    "autograd may hand that tensor to other branches too, whose gradients then change "
    f"(fxquant.check tells whether they do: {SILENTLY_WRONG_GRADIENT.id}).",
    "compute a new tensor instead of changing the gradient received (`grad = grad * 2` for "
    "`grad *= 2`)")

INPLACE_ON_DIFFERENTIATED_ARGUMENT: Final = Rule(
    "FXQ016", "inplace-on-differentiated-argument", "warning",
    "a function given to `torch.autograd.functional` (vjp, jvp, jacobian, hessian, ...) "
    "writes in place into its argument",
    "A function given to torch.autograd.functional (vjp, jvp, jacobian, hessian, vhp, hvp) "
    "writes in place into its argument: the derivative is then taken with respect to the "
    "tensor the write produced, not the argument the function received, and the result "
    f"is silently wrong (fxquant.check tells whether it changes: {SILENTLY_WRONG_GRADIENT.id}).",
    "write it out of place inside the function (`z = z.sin()` for `z.sin_()`), or clone "
    "the argument first (`z = z.clone()`)")
STALE_AUTOCAST_CAST: Final = Rule(
    "FXQ017", "stale-autocast-cast", "warning",
    "a write into a parameter that autocast already cast in the same region, whose "
    "cached cast a later op then uses",
    "Inside one torch.autocast region the low-precision cast of each parameter is cached "
    "(cache_enabled=True, the default) and autograd does not see writes through `.data` "
    "or under no_grad: after such a write into a parameter already cast in the region, "
    "later ops in the region compute with the cached cast of the old values (found by "
    f"fxquant.check where the values differ: {SILENTLY_WRONG_GRADIENT.id}).",
    "leave the autocast region before changing the weights and open a new one for the next "
    "forward (one region per forward), or pass cache_enabled=False to torch.autocast")
INPLACE_WITHOUT_MARK_DIRTY: Final = Rule(
    "FXQ018", "inplace-without-mark-dirty", "warning",
    "a custom `autograd.Function`'s forward writes in place into an input that requires "
    "grad without `ctx.mark_dirty`",
    "A custom autograd.Function's forward writes in place into an input that requires grad "
    "and does not call ctx.mark_dirty on it, as PyTorch's contract asks: autograd keeps the "
    "input's old history, so a later read of the input sends its gradient past the "
    f"Function (fxquant.check tells whether one does: {SILENTLY_WRONG_GRADIENT.id}).",
    "call ctx.mark_dirty(x) in the forward for every input it writes in place (autograd "
    "then moves the input's history onto the Function), or write into a copy "
    "(`x = x.clone()` first)")

#: Every rule the linter and the autograd check report, by stable id.
RULES: Final[dict[str, Rule]] = {
    r.id: r
    for r in (
        INPLACE_MODIFIES_SAVED_TENSOR, INPLACE_OVERWRITES_GRAD_TENSOR, INPLACE_ON_LEAF,
        DATA_ATTRIBUTE, FACTORY_WITHOUT_DEVICE, ANOMALY_MODE_IN_FORWARD, ZERO_GRADIENT_OP,
        PARAMETER_WITHOUT_GRADIENT, FORWARD_FAILED, NOT_VISIBLE, INPLACE_MAYBE_SAVED,
        SILENTLY_WRONG_GRADIENT, INPLACE_REFUSED_IN_FORWARD, HIDDEN_WRITE_THEN_READ,
        BACKWARD_WRITES_GRADIENT, INPLACE_ON_DIFFERENTIATED_ARGUMENT, STALE_AUTOCAST_CAST,
        INPLACE_WITHOUT_MARK_DIRTY,
    )
}


def rules_table() -> str:
    """The rule table of the documentation, in Markdown: one row per rule with its id,
    name, severity, what it finds and how to fix it (the docs' page holds this text).

    Example:
        >>> print(rules_table().splitlines()[2][:60])
        | FXQ001 | inplace-modifies-saved-tensor | error | an in-pla
    """
    rows = ["| rule | name | severity | finds | fix |", "| --- | --- | --- | --- | --- |"]
    rows += [f"| {r.id} | {r.name} | {r.severity} | {r.summary} | {r.hint} |"
             for r in RULES.values()]
    return "\n".join(rows)


def severity_of(rule: str) -> Severity:
    """The severity of a rule id."""
    return RULES[rule].severity


_INDEXED_WRITE = re.compile(r"\]\s*=(?!=)")
_METHOD = re.compile(r"\.(\w+)_\(")
#: Expressions that bind tighter than any binary operator: written after one without
#: parentheses they keep their meaning.
_ATOMS = (ast.Name, ast.Constant, ast.Attribute, ast.Subscript, ast.Call, ast.List,
          ast.Tuple, ast.Dict, ast.Set, ast.ListComp, ast.SetComp, ast.DictComp,
          ast.GeneratorExp, ast.JoinedStr)
_SYMBOLS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
            ast.Mod: "%", ast.Pow: "**", ast.MatMult: "@", ast.BitAnd: "&", ast.BitOr: "|",
            ast.BitXor: "^", ast.LShift: "<<", ast.RShift: ">>"}
_AUGMENTED = re.compile(r"(?<![=!<>])(\*\*|//|<<|>>|[-+*/%@&|^])=(?!=)")


def strip_comment(code: str) -> str:
    """``code`` without its trailing ``# comment`` (a ``#`` inside a string stays).

    Example:
        >>> strip_comment("x += y  # exp saved x")
        'x += y'
        >>> strip_comment("s = '#' + t")
        "s = '#' + t"
    """
    try:  # a line of a longer statement ends in an error, after its comment token
        for token in tokenize.generate_tokens(io.StringIO(code).readline):
            if token.type == tokenize.COMMENT:
                return code[: token.start[1]].strip()
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return code.strip()


def _parenthesized(value: str) -> str:
    """``value`` as the right operand of a binary operator: as it is when it is a single
    atom (a name, a number, a call, an attribute, a subscript), else in parentheses."""
    try:
        node = ast.parse(value.strip(), mode="eval").body
    except SyntaxError:
        return f"({value.strip()})"
    if isinstance(node, _ATOMS) and not (isinstance(node, ast.Constant)
                                         and isinstance(node.value, complex)):
        return value.strip()
    return f"({value.strip()})"


def split_augmented(code: str) -> tuple[str, str, str] | None:
    """``(target, operator, value)`` of an augmented assignment ``target op= value``
    (comments dropped), or None.

    Example:
        >>> split_augmented("out *= 1.0 + torch.sum(m * x, dim=-1)  # scale")
        ('out', '*', '1.0 + torch.sum(m * x, dim=-1)')
    """
    text = strip_comment(code)
    try:
        tree = ast.parse(text)
    except SyntaxError:
        tree = None
    if tree is not None:
        if len(tree.body) == 1 and isinstance(tree.body[0], ast.AugAssign):
            node = tree.body[0]
            target = ast.get_source_segment(text, node.target) or ast.unparse(node.target)
            value = ast.get_source_segment(text, node.value) or ast.unparse(node.value)
            return target.strip(), _SYMBOLS[type(node.op)], value.strip()
        return None
    found = _AUGMENTED.search(text)  # a line of a longer statement
    if found is None:
        return None
    return text[: found.start()].strip(), found.group(1), text[found.end():].strip()


def out_of_place(code: str) -> str | None:
    """``target = target op (value)`` for the augmented assignment ``code``: the same
    value, computed into a new tensor; None when ``code`` is not one.

    Example:
        >>> out_of_place("out *= 1.0 + torch.sum(m * x, dim=-1)")
        'out = out * (1.0 + torch.sum(m * x, dim=-1))'
        >>> out_of_place("h += self.bias  # bias")
        'h = h + self.bias'
    """
    parts = split_augmented(code)
    if parts is None:
        return None
    target, operator, value = parts
    return f"{target} = {target} {operator} {_parenthesized(value)}"


def hint_for_inplace(code: str, op: str = "") -> str:
    """How to write the in-place statement ``code`` (ATen op ``op``) out of place. The
    suggested code means what ``code`` means (an augmented assignment's right side is
    parenthesized unless it is a single atom; comments are dropped).

    Example:
        >>> hint_for_inplace("out *= 2**e")
        'write it out of place: `out = out * (2**e)` (a new tensor; what autograd saved stays intact)'
        >>> print(hint_for_inplace("x[idx] = v"))
        build a new tensor instead: `x = torch.where(mask, v, x)` or `x = x.index_put((idx,), v)`, \
or write into `x.clone()`
        >>> hint_for_inplace("h = F.relu(h, inplace=True)  # saves memory")
        'pass inplace=False (the default): `F.relu(h, inplace=False)` returns a new tensor'
        >>> hint_for_inplace("y.clamp_(0, 1)")
        'call the out-of-place version: `y.clamp(...)` instead of `y.clamp_(...)`, and use its result'
    """
    text = strip_comment(code)
    if re.search(r"\.step\(", text) and (op.startswith("_foreach") or op.endswith("_")):
        return ("step the optimizer after backward, outside the forward: the step writes "
                "parameters that the graph saved for backward")
    if ".data" in text:
        return ("use `.detach()` (autograd then checks the write) and compute a new tensor out of "
                "place, or make the change under `with torch.no_grad():` where nothing saved it")
    if "inplace=True" in text.replace(" ", ""):
        call = text.split("=", 1)[1].strip() if re.match(r"^\w+\s*=[^=]", text) else text
        return ("pass inplace=False (the default): "
                f"`{call.replace('inplace=True', 'inplace=False')}` returns a new tensor")
    parts = split_augmented(text)
    if parts is not None:
        target, operator, value = parts
        rewritten = f"{target} = {target} {operator} {_parenthesized(value)}"
        if "[" not in target:
            return (f"write it out of place: `{rewritten}` (a new tensor; what autograd saved "
                    "stays intact)")
        base = target.split("[", 1)[0].strip()
        return (f"write into a copy: `{base} = {base}.clone()` first (or, for a list element, "
                f"`{rewritten}`), so the saved value stays intact")
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
