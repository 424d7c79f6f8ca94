"""The corpus of real in-place bugs (tests/linter/corpus/, each citing its public thread):
what lint, check and functionalize_inplace must say about every case.

``python -m tests.support.corpus`` prints the table the README shows.
"""

from __future__ import annotations

import pytest
import torch

import fxquant
from tests.support import corpus

CASES = corpus.cases()
pytestmark = pytest.mark.filterwarnings("ignore:Sparse")


@pytest.fixture(scope="module")
def evaluated():
    return {c.name: c for c in corpus.evaluate()}


def test_corpus_is_large_enough_and_cites_its_sources():
    kinds = [c.kind for c in CASES]
    assert kinds.count("crash") + kinds.count("silent") >= 30
    assert kinds.count("legal") >= 20
    for case in CASES:
        assert case.module.SOURCE.startswith("https://"), case.name
        assert case.module.SOURCE in (case.module.__doc__ or ""), case.name
        assert case.kind == "legal" or case.culprit is not None, f"{case.name}: no # CULPRIT line"


@pytest.mark.parametrize("case", [c for c in CASES if c.kind == "crash"], ids=lambda c: c.name)
def test_crashing_bug_gets_an_error_at_its_culprit_line(case, evaluated):
    got = evaluated[case.name].results
    assert got["lint"], f"lint: {got}"
    assert got["check"], f"check: {got}"


@pytest.mark.parametrize("case", [c for c in CASES if c.kind == "silent"], ids=lambda c: c.name)
def test_silent_bug_gets_an_error_from_check(case, evaluated):
    assert evaluated[case.name].results["check"]


@pytest.mark.parametrize("case", [c for c in CASES if c.kind == "legal"], ids=lambda c: c.name)
def test_legal_model_gets_no_error(case, evaluated):
    got = evaluated[case.name].results
    assert got["lint errors"] == 0 and got["check errors"] == 0


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_functionalize_fixes_or_refuses_never_differs(case, evaluated):
    """Fixed (verified independently: outputs, gradients, buffers after forward, state) where
    a rewrite can be equivalent; refused, naming the culprit line, where it cannot; a legal
    model no rewrite reproduces comes back as it is, saying so."""
    fix = evaluated[case.name].results["fix"]
    if case.kind == "legal":
        assert fix in ("fixed", "untouched"), fix
    elif case.fixable and case.kind == "crash":
        assert fix == "fixed", fix
    else:
        assert fix == "refused", fix


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_fxquant_never_fails_where_the_plain_run_works(case, evaluated):
    """No exception from lint, check or the symbolic lint, and no FXQ009, on a model whose
    own forward and backward run; the model given to the tools is left bit-identical."""
    got = evaluated[case.name].results
    assert not got["raised"], got["raised"]
    if got["plain runs"]:
        assert not got["fxq009"]
    assert got["untouched by the tools"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_lint_without_inputs_says_first_it_was_partial(case, evaluated):
    assert evaluated[case.name].results["partial"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_every_hint_for_an_augmented_assignment_means_the_line(case, evaluated):
    assert all(evaluated[case.name].results["hints"])


@pytest.mark.parametrize("case", [c for c in CASES if c.category], ids=lambda c: c.name)
def test_each_category_case_gets_what_its_row_promises(case, evaluated):
    """The rows of the categories the linter once failed on (sparse state, containers,
    unseen writes, custom backwards, instrument failures, `.data` without effect, buffers)."""
    case = evaluated[case.name]
    assert corpus._category_ok(case), case.results


def test_every_category_has_cases_from_real_threads():
    """Each category has cases (all citing their threads, checked above), and no case names
    a category the table does not know."""
    assert {c.category for c in CASES if c.category} == set(corpus.CATEGORIES)


def test_cases_that_need_a_missing_package_are_left_out():
    """A case REQUIRES its packages: without them it is not in the corpus (and not run)."""
    names = {c.name for c in corpus.cases()}
    for info in corpus.pkgutil.iter_modules([str(corpus.CORPUS)]):
        module = corpus.importlib.import_module(f"tests.linter.corpus.{info.name}")
        assert (info.name in names) == (not corpus.missing(module)), info.name


def test_the_table_has_a_row_per_category(evaluated):
    table = corpus.markdown(list(evaluated.values()))
    for category, label in corpus.CATEGORIES.items():
        if any(c.category == category for c in CASES):
            assert label in table


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_lint_from_shapes_alone(case, evaluated):
    """Meta-tensor inputs: linted on fake tensors with the findings of the real lint, or (a
    forward that needs values) on random data, saying so."""
    if evaluated[case.name].results["shapes"]:
        return
    model, inputs = case.make()
    report = fxquant.lint(model, *(corpus._meta(x) for x in inputs))
    assert report.mode == "dynamic"
    (note,) = [f for f in report.by_rule("FXQ010") if f.node == "shapes"]
    assert "fake tensors" in note.message or "needs values" in note.message
    assert "random data" in note.message


def test_most_of_the_corpus_lints_from_shapes(evaluated):
    shapes, total = corpus.summary(list(evaluated.values()))[
        "models that lint from shapes alone (meta tensors)"]
    assert shapes >= 0.9 * total


def test_anomaly_mode_is_the_baseline_we_beat(evaluated):
    """The table's comparison row is measured, not assumed: anomaly mode names some."""
    crash = [c for c in evaluated.values() if c.kind == "crash"]
    named = sum(bool(c.results["anomaly"]) for c in crash)
    assert 0 < named < len(crash)
    assert not torch.is_anomaly_enabled()


def test_the_forward_mode_reference_falls_back_where_a_function_has_no_jvp():
    """A custom Function without a forward derivative: central differences, as fxquant's
    own verification does, instead of an error."""

    class Cube(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x ** 3

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 3 * x ** 2 * g

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.tensor([0.5, -1.0, 2.0]))

        def forward(self, x):
            return Cube.apply(self.w * x)

    x, v = torch.tensor([1.0, 2.0, 0.5]), torch.tensor([1.0, -1.0, 0.5])
    (got,) = corpus._jvp(Model(), (x,), {"w": v})
    w = Model().w.detach()
    assert torch.allclose(got, 3 * (w * x) ** 2 * x * v, rtol=1e-4)
