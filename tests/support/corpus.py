"""Scores fxquant's lint, check and auto-fix (and anomaly mode) on the corpus of real bugs.

``python -m tests.support.corpus`` prints the table the README shows; the tests in
``tests/linter/test_corpus.py`` assert what it must say.

Each case in ``tests/linter/corpus/`` reproduces a public thread (its ``SOURCE``): ``KIND``
is ``"crash"`` (backward raises), ``"silent"`` (backward runs, wrong gradients) or
``"legal"`` (correct code with in-place ops); the culprit line ends in ``# CULPRIT``;
``FIXABLE`` is False where no out-of-place rewrite can be equivalent (writes into leaves).
"""

from __future__ import annotations

import importlib
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
from tests.linter import corpus

CORPUS = Path(corpus.__file__).resolve().parent


@dataclass
class Case:
    name: str
    module: ModuleType
    kind: str
    fixable: bool
    culprit: int | None
    path: Path
    results: dict[str, Any] = field(default_factory=dict)

    def make(self) -> tuple[torch.nn.Module, tuple[Any, ...]]:
        return self.module.make()


def cases() -> list[Case]:
    found = []
    for info in sorted(pkgutil.iter_modules([str(CORPUS)]), key=lambda i: i.name):
        module = importlib.import_module(f"tests.linter.corpus.{info.name}")
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
    with torch.no_grad(), fwad.dual_level():
        params = {n: fwad.make_dual(p.detach(), tangents[n])
                  for n, p in model.named_parameters() if n in tangents}
        out = torch.func.functional_call(model, params, inputs)
        outs = out if isinstance(out, tuple) else (out,)
        return [fwad.unpack_dual(t).tangent for t in outs]


def _fix(case: Case) -> str:
    """'fixed' (verified here independently of the tool), 'refused', or what went wrong."""
    model, inputs = case.make()
    try:
        gm = fxquant.functionalize_inplace(model, *inputs)
    except FunctionalizeError as e:
        return "refused" if case.culprit is not None and f":{case.culprit}" in str(e) \
            else f"refused without naming the line: {e}"
    except Exception as e:  # the tool itself must not crash
        return f"tool raised {type(e).__name__}: {e}"
    _, fresh_inputs = case.make()
    torch.manual_seed(0)
    with torch.no_grad():
        expected = case.make()[0](*case.make()[1])
    expected = expected if isinstance(expected, tuple) else (expected,)
    g = torch.Generator().manual_seed(1)
    weights = [torch.randn(t.shape, generator=g) for t in expected]
    try:
        out, grads = _outputs_and_grads(gm, fresh_inputs, weights)
    except RuntimeError as e:
        return f"backward still fails: {str(e)[:80]}"
    if not all(torch.allclose(a, b, atol=1e-6, equal_nan=True)
               for a, b in zip(out, expected, strict=True)):
        return "forward differs"
    if case.kind == "legal":
        _, want = _outputs_and_grads(*case.make(), weights)
        for name, grad in grads.items():
            if name in want and (grad is None) != (want[name] is None):
                return f"gradient of {name} differs"
            if grad is not None and want.get(name) is not None and not torch.allclose(
                    grad, want[name], atol=1e-6):
                return f"gradient of {name} differs"
        return "fixed"
    original = case.make()[0]
    tangents = {n: torch.randn(p.shape, generator=g) for n, p in original.named_parameters()}
    jvp = _jvp(original, case.make()[1], tangents)
    lhs = sum(float((w * t).sum()) for w, t in zip(weights, jvp, strict=True))
    rhs = sum(float((grads[n] * v).sum()) for n, v in tangents.items() if grads.get(n) is not None)
    if abs(lhs - rhs) > 1e-4 * (abs(lhs) + abs(rhs)) + 1e-5:
        return f"gradients fail the dot-product test ({lhs:.6g} vs {rhs:.6g})"
    return "fixed"


def _meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return torch.empty(x.shape, dtype=x.dtype, device="meta").requires_grad_(x.requires_grad)
    return x


def _from_shapes(case: Case, real: fxquant.LintReport) -> bool:
    """Linted on fake tensors (no fallback to data), with the findings of the real lint."""
    model, inputs = case.make()
    report = fxquant.lint(model, *(_meta(x) for x in inputs))
    found = [(f.rule, f.location) for f in report.findings if f.rule != "FXQ010"]
    return report.mode == "shapes" and found == [(f.rule, f.location) for f in real.findings]


def evaluate() -> list[Case]:
    found = cases()
    for case in found:
        model, inputs = case.make()
        lint = fxquant.lint(model, *inputs)
        model, inputs = case.make()
        check = fxquant.check(model, *inputs)
        rules = ("FXQ001", "FXQ003", "FXQ013") if case.kind == "crash" else ("FXQ012",)
        case.results = {
            "lint": _at_culprit(lint, case, rules) if case.kind == "crash" else None,
            "check": _at_culprit(check, case, rules) if case.kind != "legal" else None,
            "lint errors": len(lint.errors),
            "check errors": len(check.errors),
            "anomaly": _anomaly_names_culprit(case) if case.kind == "crash" else None,
            "fix": _fix(case),
            "shapes": _from_shapes(case, lint),
        }
    return found


def summary(found: list[Case]) -> dict[str, tuple[int, int]]:
    """Numerators and denominators of the table's rows."""
    crash = [c for c in found if c.kind == "crash"]
    silent = [c for c in found if c.kind == "silent"]
    legal = [c for c in found if c.kind == "legal"]
    fixable = [c for c in crash if c.fixable]
    unfixable = [c for c in [*crash, *silent] if not c.fixable or c.kind == "silent"]
    bad_fix = [c for c in found if c.results["fix"] not in ("fixed", "refused")
               and not c.results["fix"].startswith("refused")]
    return {
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
        "unfixable bugs refused, naming the line (leaf, `.data`, `.detach()` writes)":
            (sum(c.results["fix"] == "refused" for c in unfixable), len(unfixable)),
        "legal models rewritten out of place (verified)":
            (sum(c.results["fix"] == "fixed" for c in legal), len(legal)),
        "legal models refused with a reason (cannot be traced or captured)":
            (sum(c.results["fix"].startswith("refused") for c in legal), len(legal)),
        "models returned that differ from the original, or tool crashes":
            (len(bad_fix), len(found)),
        "models that lint from shapes alone (meta tensors)":
            (sum(bool(c.results.get("shapes")) for c in found), len(found)),
    }


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
