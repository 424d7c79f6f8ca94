"""Scores fxquant's lint, check and auto-fix (and anomaly mode) on the corpus of real bugs.

``python -m tests.support.corpus`` prints the table the README shows; the tests in
``tests/linter/test_corpus.py`` assert what it must say.

Each case in ``tests/linter/corpus/`` reproduces a public thread (its ``SOURCE``): ``KIND``
is ``"crash"`` (backward raises), ``"silent"`` (backward runs, wrong gradients) or
``"legal"`` (correct code with in-place ops); the culprit line ends in ``# CULPRIT``;
``FIXABLE`` is False where no out-of-place rewrite can be equivalent (writes into leaves).
A fixed model's gradients are checked against forward-mode derivatives of the original, or
against the case's ``fixed_by_hand()`` where forward mode cannot run through it.
A case may name a ``CATEGORY`` (a kind of model the linter once failed on; each has a row
of the table) and the packages it ``REQUIRES`` (the case is left out when one is missing).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

import fxquant
from fxquant.linter import FunctionalizeError
from fxquant.linter.state import copy_model, held_tensors, named_buffers
from tests.linter import corpus

CORPUS = Path(corpus.__file__).resolve().parent


#: The categories of models the linter once failed on, and the row each has in the table.
CATEGORIES = {
    "sparse": "sparse state (COO, CSR buffers; SparseTensor when installed): linted, checked "
              "and fixed like dense state",
    "container": "in-place modules built in containers: error at the line that built them "
                 "(lint, shapes, check)",
    "unseen": "silent writes no instrument sees (NumPy views): error at the writing line (check)",
    "custom backward": "custom backwards writing into their gradient: error at the line "
                       "(check), warning there (lint)",
    "instruments": "legal models fxquant's recording cannot follow: no error, and a note of "
                   "what was not checked where it fell back",
    "data without effect": "`.data` writes that change no gradient: no error (check compares "
                           "the gradients)",
    "hooks": "modules with forward or backward hooks: error at the line (lint, check); the "
             "rewrite keeps calling the hooks",
    "buffers": "legal models updating buffers (counters, EMAs, a VQ codebook, `Variable`, a "
               "memory bank, a power iteration): rewritten equivalent, buffers after forward "
               "and state_dict included, and a second training step runs",
    "custom function views": "writes into a view a custom `autograd.Function` returned: error "
                             "at the write, not at the later read (lint, check)",
    "functional derivatives": "functions given to `torch.autograd.functional` writing into "
                              "their argument: error at the write (check), warning there "
                              "(lint); none where they write only their own values",
    "autocast": "weights swapped through `.data` inside `torch.autocast`: error where autocast's "
                "weight cache goes stale (check), none for one region per forward or "
                "`cache_enabled=False`",
    "mark_dirty": "custom Functions writing into their input without `ctx.mark_dirty`: a "
                  "warning naming it, an error (check) where the input is read again",
    "checkpoint": "reentrant checkpoints around dropout: no error where the RNG state is kept, "
                  "an error (check) where it is not",
}
#: Categories whose rows hold each kind to what the overall rows ask, and silent cases to
#: a warning from lint at the line too.
_BY_KIND = ("custom function views", "functional derivatives", "autocast", "mark_dirty",
            "checkpoint")
_LINT_WARNS = ("functional derivatives", "autocast", "mark_dirty")


@dataclass
class Case:
    name: str
    module: ModuleType
    kind: str
    fixable: bool
    culprit: int | None
    path: Path
    results: dict[str, Any] = field(default_factory=dict)

    @property
    def category(self) -> str:
        return str(getattr(self.module, "CATEGORY", ""))

    def make(self) -> tuple[torch.nn.Module, tuple[Any, ...]]:
        return self.module.make()


def missing(module: ModuleType) -> list[str]:
    """The packages a case requires that are not installed."""
    return [r for r in getattr(module, "REQUIRES", ()) if importlib.util.find_spec(r) is None]


def cases() -> list[Case]:
    """Every case of the corpus whose required packages are installed."""
    found = []
    for info in sorted(pkgutil.iter_modules([str(CORPUS)]), key=lambda i: i.name):
        module = importlib.import_module(f"tests.linter.corpus.{info.name}")
        if missing(module):
            continue
        path = Path(module.__file__ or "")
        lines = path.read_text().splitlines()
        culprit = next((i for i, line in enumerate(lines, 1) if line.rstrip().endswith("# CULPRIT")),
                       None)
        found.append(Case(info.name, module, module.KIND, module.FIXABLE, culprit, path))
    return found


def _at_culprit(report: fxquant.LintReport, case: Case, rules: tuple[str, ...]) -> bool:
    return any(f.rule in rules and f.location is not None and f.line == case.culprit
               and Path(f.location.path).resolve() == case.path for f in report.errors)


def _anomaly_names_culprit(case: Case) -> bool:
    """Does anomaly mode's traceback of the forward call end at the culprit line?"""
    model, inputs = case.make()
    text = ""
    with warnings.catch_warnings(record=True) as caught, torch.autograd.detect_anomaly():
        warnings.simplefilter("always")
        try:
            out = model(*inputs)
            loss = sum(t.sum() for t in (out if isinstance(out, tuple) else (out,)))
            loss.backward()
        except RuntimeError as e:
            text = str(e)
    text += "\n".join(str(w.message) for w in caught)
    lines = [int(n) for n in re.findall(rf'File "{re.escape(str(case.path))}", line (\d+)', text)]
    return bool(lines) and lines[-1] == case.culprit


def _outputs_and_grads(model: torch.nn.Module, inputs: tuple[Any, ...],
                       weights: list[torch.Tensor] | None = None) -> tuple[Any, Any]:
    torch.manual_seed(0)
    out = model(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    weights = weights or [torch.ones_like(t) for t in outs]
    sum((t * w).sum() for t, w in zip(outs, weights, strict=True)).backward()
    return [t.detach() for t in outs], {n: p.grad for n, p in model.named_parameters()}


def _jvp(model: torch.nn.Module, inputs: tuple[Any, ...],
         tangents: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """Forward-mode derivatives of the original's outputs along ``tangents`` (no saved
    tensors, so it runs where the original's backward crashes)."""
    import torch.autograd.forward_ad as fwad

    torch.manual_seed(0)
    try:
        with torch.no_grad(), fwad.dual_level():
            params = {n: fwad.make_dual(p.detach(), tangents[n])
                      for n, p in model.named_parameters() if n in tangents}
            out = torch.func.functional_call(model, params, inputs)
            outs = out if isinstance(out, tuple) else (out,)
            return [fwad.unpack_dual(t).tangent for t in outs]
    except (NotImplementedError, RuntimeError):  # an op (or a custom Function) without a
        pass  # forward derivative: central differences in float64, as fxquant's verify does
    wide = copy_model(model).double()
    wide_inputs = tuple(x.double() if isinstance(x, torch.Tensor) and x.is_floating_point()
                        else x for x in inputs)
    eps = 1e-6

    def at(sign: float) -> list[torch.Tensor]:
        shifted = {n: p.detach().double() + sign * eps * tangents[n].double()
                   for n, p in wide.named_parameters() if n in tangents}
        torch.manual_seed(0)
        with torch.no_grad():
            out = torch.func.functional_call(wide, shifted, wide_inputs)
        return list(out if isinstance(out, tuple) else (out,))

    return [((a - b) / (2 * eps)).float() for a, b in zip(at(1.0), at(-1.0), strict=True)]


def _state(model: torch.nn.Module) -> dict[str, list[torch.Tensor]]:
    """Every entry of the state dict as copies of the dense tensors behind it (a sparse
    tensor's index and value tensors, a SparseTensor's storage)."""
    return {name: [c.detach().clone() for c in held_tensors(value)]
            for name, value in model.state_dict().items()}


def _bits(t: torch.Tensor) -> torch.Tensor:
    flat = t.reshape(-1).contiguous()
    return flat.view(torch.uint8) if t.is_floating_point() else flat


def _same_state(a: dict[str, list[torch.Tensor]], b: dict[str, list[torch.Tensor]]) -> bool:
    """The same entries with bit-identical tensors (NaN payloads included)."""
    return a.keys() == b.keys() and all(
        len(a[n]) == len(b[n]) and all(
            s.shape == t.shape and s.dtype == t.dtype and torch.equal(_bits(s), _bits(t))
            for s, t in zip(a[n], b[n], strict=True))
        for n in a)


def _buffers_after(model: torch.nn.Module, inputs: tuple[Any, ...]) -> dict[str, Any]:
    torch.manual_seed(0)
    with torch.no_grad():
        model(*inputs)
    return {n: b.detach().clone() for n, b in named_buffers(model)
            if isinstance(b, torch.Tensor) and b.layout == torch.strided}


def _same_buffers(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> bool:
    return all(n in got and torch.allclose(got[n].double(), b.double(), atol=1e-6,
                                           equal_nan=True) for n, b in want.items())


def _loads_its_own_state(model: torch.nn.Module) -> bool:
    try:
        model.load_state_dict(model.state_dict())
    except RuntimeError:
        return False
    return True


def _carried(model: torch.nn.Module, inputs: tuple[Any, ...] | None = None) -> set[str]:
    """The buffers that hold autograd history (after a forward on ``inputs``, if given)."""
    if inputs is not None:
        try:
            torch.manual_seed(0)
            model(*inputs)
        except RuntimeError:
            return set()
    return {n for n, b in named_buffers(model)
            if isinstance(b, torch.Tensor) and b.grad_fn is not None}


def _second_step_runs(case: Case) -> bool:
    """Whether a second training step of the original runs (or its first one fails: then
    its fix must run two)."""
    model, inputs = case.make()
    try:
        _outputs_and_grads(model, inputs)
    except RuntimeError:
        return True
    try:
        _outputs_and_grads(model, case.make()[1])
    except RuntimeError:
        return False
    return True


def _fix(case: Case) -> str:
    """'fixed' or 'untouched' (a legal model returned as it is), both verified here
    independently of the tool, 'refused', or what went wrong."""
    model, inputs = case.make()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            gm = fxquant.functionalize_inplace(model, *inputs)
    except FunctionalizeError as e:
        return "refused" if case.culprit is not None and f":{case.culprit}" in str(e) \
            else f"refused without naming the line: {e}"
    except Exception as e:  # the tool itself must not crash
        return f"tool raised {type(e).__name__}: {e}"
    untouched = not isinstance(gm, torch.fx.GraphModule)
    if untouched and not any("nothing needed rewriting" in str(w.message) for w in caught):
        return "returned a model that is not rewritten, without saying so"
    if not _same_state(_state(gm), _state(case.make()[0])):
        return "its state differs from the original's (parameters, buffers, state_dict keys)"
    if _loads_its_own_state(case.make()[0]):  # (torch cannot load a SparseTensor buffer)
        case.make()[0].load_state_dict(gm.state_dict())
    want_buffers = _buffers_after(case.make()[0], case.make()[1])
    if not _same_buffers(_buffers_after(copy_model(gm), case.make()[1]), want_buffers):
        return "buffers differ after forward"
    _, fresh_inputs = case.make()
    reference, reference_inputs = case.make()
    torch.manual_seed(0)  # the same random draws (dropout masks) as _outputs_and_grads
    with torch.no_grad():
        expected = reference(*reference_inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    g = torch.Generator().manual_seed(1)
    weights = [torch.randn(t.shape, generator=g) for t in expected]
    try:
        out, grads = _outputs_and_grads(gm, fresh_inputs, weights)
    except RuntimeError as e:
        return f"backward still fails: {str(e)[:80]}"
    grads = {n: None if g is None else g.clone() for n, g in grads.items()}
    carried = _carried(gm) - _carried(case.make()[0], case.make()[1])
    if carried:
        return f"buffers carry autograd history after forward: {sorted(carried)}"
    try:
        _outputs_and_grads(gm, case.make()[1], weights)
    except RuntimeError as e:
        if _second_step_runs(case):
            return f"a second training step fails: {str(e)[:80]}"
    if not all(torch.allclose(a, b, atol=1e-6, equal_nan=True)
               for a, b in zip(out, expected, strict=True)):
        return "forward differs"
    done = "untouched" if untouched else "fixed"
    fired = getattr(case.module, "FIRED", None)  # what the case's hooks record
    if fired is not None:
        fired.clear()
        _outputs_and_grads(copy_model(gm), case.make()[1], weights)
        if not fired:
            return "its hooks no longer run"
    if case.kind == "legal":
        _, want = _outputs_and_grads(*case.make(), weights)
        for name, grad in grads.items():
            if name in want and (grad is None) != (want[name] is None):
                return f"gradient of {name} differs"
            if grad is not None and want.get(name) is not None and not torch.allclose(
                    grad, want[name], atol=1e-6):
                return f"gradient of {name} differs"
        return done
    by_hand = getattr(case.module, "fixed_by_hand", None)
    if by_hand is not None:  # (forward-mode AD cannot run through the original)
        _, want = _outputs_and_grads(by_hand(), case.make()[1], weights)
        if any((grads.get(n) is None) != (w is None) or (w is not None and not torch.allclose(
                grads[n], w, atol=1e-6)) for n, w in want.items()):
            return "gradients differ from the fix by hand"
        return done
    original = case.make()[0]
    tangents = {n: torch.randn(p.shape, generator=g) for n, p in original.named_parameters()}
    jvp = _jvp(original, case.make()[1], tangents)
    lhs = sum(float((w * t).sum()) for w, t in zip(weights, jvp, strict=True))
    rhs = sum(float((grads[n] * v).sum()) for n, v in tangents.items() if grads.get(n) is not None)
    if abs(lhs - rhs) > 1e-4 * (abs(lhs) + abs(rhs)) + 1e-5:
        return f"gradients fail the dot-product test ({lhs:.6g} vs {rhs:.6g})"
    return done


def hint_means_the_line(code: str, hint: str) -> bool | None:
    """For an augmented assignment ``code``, whether every assignment the hint suggests
    to the same target computes the same expression (compared with ``ast``); None when
    ``code`` is not one or the hint rewrites no assignment to its target."""
    text = code.split("#", 1)[0].strip()
    try:
        aug = ast.parse(text).body[0]
    except (SyntaxError, IndexError):
        return None
    if not isinstance(aug, ast.AugAssign):
        return None
    left = ast.parse(ast.unparse(aug.target), mode="eval").body
    want = ast.dump(ast.BinOp(left=left, op=aug.op, right=aug.value))
    target = ast.dump(left)
    rewrites = []  # the hint's statements that assign to the line's own target
    for quoted in re.findall(r"`([^`]*)`", hint):
        try:
            stmt = ast.parse(quoted).body[0]
        except (SyntaxError, IndexError):
            continue
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and ast.dump(
                ast.parse(ast.unparse(stmt.targets[0]), mode="eval").body) == target:
            rewrites.append(ast.dump(stmt.value))
    if not rewrites:
        return None  # the hint does not rewrite this line (`use .detach()`, `pass device=`)
    return all(r == want for r in rewrites)


def _plain_runs(case: Case) -> bool:
    """Whether the model's own forward and backward run (no fxquant involved)."""
    model, inputs = case.make()
    try:
        out = model(*inputs)
        outs = out if isinstance(out, tuple) else (out,)
        sum(t.sum() for t in outs if isinstance(t, torch.Tensor) and t.requires_grad).backward()
    except Exception:
        return False
    return True


def _run(fn: Any, *args: Any) -> tuple[fxquant.LintReport | None, str]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn(*args), ""
    except Exception as e:  # the tool itself must not crash
        return None, f"{type(e).__name__}: {e}"


def _untouched_by_the_tools(case: Case) -> bool:
    """lint, check and functionalize_inplace leave the model they are given bit-identical."""
    model, inputs = case.make()
    before = _state(model)
    grads = [p.grad for p in model.parameters()]
    _run(fxquant.lint, model, *inputs)
    _run(fxquant.check, model, *inputs)
    _run(fxquant.functionalize_inplace, model, *inputs)
    return _same_state(before, _state(model)) and all(
        p.grad is g for p, g in zip(model.parameters(), grads, strict=True))


def _meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return torch.empty(x.shape, dtype=x.dtype, device="meta").requires_grad_(x.requires_grad)
    return x


def _from_shapes(case: Case, real: fxquant.LintReport) -> bool:
    """Linted on fake tensors (no fallback to data), with the findings of the real lint."""
    model, inputs = case.make()
    report = fxquant.lint(model, *(_meta(x) for x in inputs))
    found = [(f.rule, f.location) for f in report.findings if f.rule != "FXQ010"]
    return report.mode == "shapes" and found == [(f.rule, f.location) for f in real.findings
                                                 if f.rule != "FXQ010"]


def evaluate() -> list[Case]:
    found = cases()
    for case in found:
        model, inputs = case.make()
        lint, lint_raised = _run(fxquant.lint, model, *inputs)
        model, inputs = case.make()
        check, check_raised = _run(fxquant.check, model, *inputs)
        symbolic, symbolic_raised = _run(fxquant.lint, case.make()[0])
        lint = lint or fxquant.LintReport()
        check = check or fxquant.LintReport()
        rules = ("FXQ001", "FXQ003", "FXQ013") if case.kind == "crash" else ("FXQ012",)
        hints = [hint_means_the_line(f.location.code, f.hint)
                 for f in [*lint.findings, *check.findings] if f.location is not None]
        case.results = {
            "lint": _at_culprit(lint, case, rules) if case.kind == "crash" else None,
            "check": _at_culprit(check, case, rules) if case.kind != "legal" else None,
            "lint warning": any(f.location is not None and f.line == case.culprit
                                for f in lint.findings),
            "lint errors": len(lint.errors),
            "check errors": len(check.errors),
            "notes": [f.node for f in [*lint.findings, *check.findings] if f.rule == "FXQ010"],
            "fxq009": any(f.rule == "FXQ009" for f in [*lint.findings, *check.findings]),
            "raised": lint_raised or check_raised or symbolic_raised,
            "plain runs": _plain_runs(case),
            "partial": symbolic is not None and str(symbolic).startswith("PARTIAL CHECK")
            and "ShapeSpec" in str(symbolic).splitlines()[0],
            "hints": [h for h in hints if h is not None],
            "anomaly": _anomaly_names_culprit(case) if case.kind == "crash" else None,
            "fix": _fix(case),
            "shapes": _from_shapes(case, lint),
            "untouched by the tools": _untouched_by_the_tools(case),
        }
    return found


def _category_ok(case: Case) -> bool:
    """Whether a case of a category gets what its row promises."""
    r = case.results
    fix_ok = r["fix"] in ("fixed", "untouched", "refused")
    if r["raised"]:
        return False
    if case.category in ("sparse", "container"):
        if case.kind == "crash":
            shapes = r["shapes"] if case.category == "container" else True
            return bool(r["lint"] and r["check"] and shapes and fix_ok)
        return r["lint errors"] + r["check errors"] == 0 and fix_ok
    if case.category in ("unseen", "custom backward"):
        warned = r["lint warning"] if case.category == "custom backward" else True
        return bool(r["check"] and warned and fix_ok)
    if case.category == "instruments":
        return r["lint errors"] + r["check errors"] == 0 and not r["fxq009"] and fix_ok
    if case.category == "data without effect":
        return r["lint errors"] + r["check errors"] == 0 and r["fix"] in ("fixed", "untouched")
    if case.category == "hooks":
        return bool(r["lint"] and r["check"] and r["fix"] == "fixed" and not r["fxq009"])
    if case.category == "buffers":
        return r["lint errors"] + r["check errors"] == 0 and r["fix"] in ("fixed", "untouched")
    if case.category in _BY_KIND:
        if case.kind == "legal":  # (a `# CULPRIT` line in a legal case: a warning belongs there)
            warned = r["lint warning"] if case.culprit is not None else True
            return bool(r["lint errors"] + r["check errors"] == 0 and warned
                        and r["fix"] in ("fixed", "untouched"))
        if case.kind == "crash":
            return bool(r["lint"] and r["check"] and fix_ok)
        warned = r["lint warning"] if case.category in _LINT_WARNS else True
        return bool(r["check"] and warned and r["fix"] == "refused")
    return True


def summary(found: list[Case]) -> dict[str, tuple[int, int]]:
    """Numerators and denominators of the table's rows."""
    crash = [c for c in found if c.kind == "crash"]
    silent = [c for c in found if c.kind == "silent"]
    legal = [c for c in found if c.kind == "legal"]
    fixable = [c for c in crash if c.fixable]
    unfixable = [c for c in [*crash, *silent] if not c.fixable or c.kind == "silent"]
    bad_fix = [c for c in found if c.results["fix"] not in ("fixed", "refused", "untouched")
               and not c.results["fix"].startswith("refused")]
    runs = [c for c in found if c.results["plain runs"]]
    hints = [h for c in found for h in c.results["hints"]]
    rows = {
        "crashing bugs: error at the culprit line (lint)":
            (sum(bool(c.results["lint"]) for c in crash), len(crash)),
        "crashing bugs: error at the culprit line (check)":
            (sum(bool(c.results["check"]) for c in crash), len(crash)),
        "crashing bugs: anomaly mode names the culprit line":
            (sum(bool(c.results["anomaly"]) for c in crash), len(crash)),
        "silent bugs: error at the culprit line (check)":
            (sum(bool(c.results["check"]) for c in silent), len(silent)),
        "legal models with an error (lint or check)":
            (sum(c.results["lint errors"] + c.results["check errors"] > 0 for c in legal),
             len(legal)),
        "fixable crashing bugs fixed by functionalize_inplace (verified)":
            (sum(c.results["fix"] == "fixed" for c in fixable), len(fixable)),
        "unfixable bugs refused, naming the line (leaf, `.data`, `.detach()` writes, custom "
        "backwards, unseen writes)":
            (sum(c.results["fix"] == "refused" for c in unfixable), len(unfixable)),
        "legal models rewritten out of place (verified)":
            (sum(c.results["fix"] == "fixed" for c in legal), len(legal)),
        "legal models returned as they are (nothing needed rewriting, no rewrite reproduced "
        "them; verified)":
            (sum(c.results["fix"] == "untouched" for c in legal), len(legal)),
        "models returned that differ from the original (outputs, gradients, buffers, "
        "state_dict), or tool crashes":
            (len(bad_fix), len(found)),
        "models that lint from shapes alone (meta tensors)":
            (sum(bool(c.results.get("shapes")) for c in found), len(found)),
    }
    for category, label in CATEGORIES.items():
        members = [c for c in found if c.category == category]
        if members:
            rows[label] = (sum(_category_ok(c) for c in members), len(members))
    rows.update({
        "reports without inputs whose first line says the check was partial (and how to "
        "give shapes)":
            (sum(bool(c.results["partial"]) for c in found), len(found)),
        "hints at augmented assignments that mean the original line (compared with ast)":
            (sum(hints), len(hints)),
        "models whose plain forward and backward run, on which fxquant raised or reported "
        "FXQ009":
            (sum(bool(c.results["raised"] or c.results["fxq009"]) for c in runs), len(runs)),
        "models that lint, check or functionalize_inplace changed (parameters, buffers, grads)":
            (sum(not c.results["untouched by the tools"] for c in found), len(found)),
    })
    return rows


def markdown(found: list[Case]) -> str:
    lines = ["| on the corpus | count |", "| --- | --- |"]
    for label, (num, den) in summary(found).items():
        lines.append(f"| {label} | {num} / {den} |")
    return "\n".join(lines)


if __name__ == "__main__":
    evaluated = evaluate()
    print(markdown(evaluated))
    for case in evaluated:
        print(case.name, case.results)
