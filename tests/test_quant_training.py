"""QuantTraining, the loop's side of a recipe: scores that are not numbers never win, a
resumed run ends as the uninterrupted one, node ids of every integer dtype name the same
teacher rows, and a call with a wrong argument fails naming it, leaving the run as it was."""

from __future__ import annotations

import copy
import functools
import math
import os
import tempfile
import warnings
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_geometric.data import Data
from torch_geometric.nn.models import GCN

import fxquant
from fxquant.errors import FxquantIndexError, FxquantTypeError, FxquantValueError
from fxquant.recipes import BudgetBits, HubMessages, QuantTraining

DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _graph(n: int = 24, seed: int = 0) -> Data:
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(n, 6, generator=g) < 0.5).float()
    x = x / x.sum(1, keepdim=True).clamp(min=1)
    return Data(x=x, edge_index=torch.randint(0, n, (2, 4 * n), generator=g),
                y=torch.randint(0, 3, (n,), generator=g), num_nodes=n)


def _evaluated_model() -> torch.fx.GraphModule:
    """An 8-bit model that has run a forward (observe counts its bits)."""
    data = _graph()
    torch.manual_seed(0)
    gm = fxquant.transform(GCN(6, 8, num_layers=2, out_channels=3), bits=8, lint="off")
    with torch.no_grad():
        gm(data.x, data.edge_index)
    return gm


_GM = _evaluated_model()


def _same(a: Any, b: Any) -> bool:
    """Nested dicts / lists / tensors / numbers equal (NaN equal to NaN)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) \
            and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return isinstance(b, list | tuple) and len(a) == len(b) \
            and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


# -- scores that are not numbers ----------------------------------------------------------


@pytest.mark.parametrize("select", ["best-val", "budget"])
def test_a_nan_score_is_never_best_nor_displaces_the_best(select):
    """[0.8, nan, 0.6] reports epoch 0, [0.7, nan] too; a NaN epoch counts as an epoch,
    returns False and warns once, at the caller's line."""
    run = QuantTraining(_GM, select=select, target_bits=8.0)
    assert run.observe(0.8) is True
    with pytest.warns(UserWarning, match="score of epoch 1 is nan.*never reported") as caught:
        assert run.observe(math.nan) is False
    assert caught[0].filename == __file__
    assert run.observe(0.6) is False
    assert run.best is not None and (run.best.epoch, run.best.val) == (0, 0.8)
    run = QuantTraining(_GM, select=select, target_bits=8.0)
    run.observe(0.7)
    with pytest.warns(UserWarning):
        run.observe(float("nan"))
    assert run.best is not None and run.best.epoch == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run.observe(torch.tensor(float("nan")))  # once per run
        assert run.observe(torch.tensor(0.9)) is True  # the epochs count the NaN ones
    assert run.best.epoch == 3 and run.best.val == pytest.approx(0.9)


SCORES = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from([math.nan, math.inf, -math.inf, 0.0, 0.5]))


@settings(max_examples=60)
@given(scores=st.lists(SCORES, max_size=10), select=st.sampled_from(["best-val", "budget"]),
       kind=st.sampled_from(["float", "tensor", "numpy"]))
def test_the_best_is_the_first_highest_finite_score(scores, select, kind):
    """Any sequence of scores, NaN and infinities among them, given as floats, tensors or
    numpy numbers: best is the first epoch with the highest finite score above 0, and
    observe says True exactly for the epochs that become it."""
    run = QuantTraining(_GM, select=select, target_bits=8.0)
    wrap = {"float": float, "numpy": np.float64,
            "tensor": lambda s: torch.tensor(s, dtype=torch.float64)}[kind]
    became = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for epoch, score in enumerate(scores):
            if run.observe(wrap(score)):
                became.append(epoch)
    finite = [(s, -e) for e, s in enumerate(scores) if math.isfinite(s) and s > 0]
    if not finite:
        assert run.best is None and became == []
        return
    top, first = max(finite)
    assert run.best is not None and run.best.epoch == -first and run.best.val == top
    assert math.isfinite(run.best.val) and became and became[-1] == -first
    expected, high = [], 0.0
    for e, s in enumerate(scores):
        if math.isfinite(s) and s > high:
            expected.append(e)
            high = s
    assert became == expected


# -- wrong arguments leave the run as it was ------------------------------------------------


@functools.cache
def _busy() -> tuple[QuantTraining, Data]:
    """A distilling run with learned, projected widths, a few epochs in (copy it)."""
    data = _graph()
    torch.manual_seed(0)
    recipe = BudgetBits(target_bits=2.0, anneal_every=2, distill=0.5, input_format=None)
    run = recipe.prepare(GCN(6, 8, num_layers=2, out_channels=3), data, lint="off")
    run.set_teacher(torch.randn(data.num_nodes, 3, generator=torch.Generator().manual_seed(1)))
    optimizer = torch.optim.Adam(run.param_groups(), lr=0.01)
    for epoch in range(2):
        _epoch(run, optimizer, data, epoch)
    return run, data


def _snapshot(run: QuantTraining) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    return copy.deepcopy(run.state_dict()), copy.deepcopy(run.model.state_dict())


BAD_CALLS = {
    "epoch": ["3", 1.0, True, -1, [2], np.float64(2.0)],
    "val": ["0.91", None, True, [0.9], torch.tensor([0.1, 0.2]), 1j],
    "node_ids": [[0, 1], torch.tensor([0.0, 1.0]), torch.tensor([True, False]),
                 torch.tensor([[0, 1]]), torch.tensor([7, -1]), torch.tensor([0, 24]), (0, 1)],
    "loss": ["1.0", 1.0, None],
    "output": [[[0.1]], "out"],
}


def _call(run: QuantTraining, out: torch.Tensor, argument: str, value: Any) -> Any:
    if argument == "epoch":
        return run.start_epoch(value)
    if argument == "val":
        return run.observe(value)
    if argument == "node_ids":
        return run.loss(out[:2].sum(), output=out[:2], node_ids=value)
    if argument == "loss":
        return run.loss(value, output=out)
    return run.loss(out.sum(), output=value)


@settings(max_examples=40)
@given(case=st.sampled_from([(a, v) for a, vs in BAD_CALLS.items() for v in vs]))
def test_a_wrong_argument_names_itself_and_changes_nothing(case):
    """start_epoch, observe and loss with a wrong type or value: an fxquant error naming
    the argument, and the run (its state_dict) and the model's state as they were."""
    argument, value = case
    run, data = copy.deepcopy(_busy())
    run.model.train()
    out = run.model(data.x, data.edge_index)
    before = _snapshot(run)
    with pytest.raises(fxquant.FxquantError, match=argument):
        _call(run, out, argument, value)
    after = _snapshot(run)
    assert _same(before[0], after[0]) and _same(before[1], after[1])


def test_the_loop_methods_refuse_the_wrong_types_of_the_issue():
    """start_epoch("3"), observe("0.91"), observe(None), loss(nodes=[0, 1]): clear errors,
    and a failed observe does not count an epoch."""
    run = QuantTraining(_GM, target_bits=8.0)
    with pytest.raises(FxquantTypeError, match=r"start_epoch: epoch must be an int, "
                                                        r"got '3' \(a str\)"):
        run.start_epoch("3")
    assert run.state_dict()["epoch"] == -1
    for bad in ("0.91", None):
        with pytest.raises(FxquantTypeError, match=r"observe: val must be a number"):
            run.observe(bad)
    assert run.state_dict()["observed"] == -1
    run.observe(0.5)
    assert run.best is not None and run.best.epoch == 0
    out = _GM(_graph().x, _graph().edge_index)
    with pytest.raises(FxquantTypeError, match="node_ids must be a 1-D integer tensor"), \
            pytest.warns(FutureWarning):
        run.loss(out.sum(), nodes=[0, 1])
    run.start_epoch(np.int64(2))  # numpy's integers are ints
    assert run.state_dict()["epoch"] == 2


# -- node ids in the loss -------------------------------------------------------------------


def _distilling() -> tuple[QuantTraining, Data, torch.Tensor]:
    """A distilling run in training mode and its teacher's logits (a fresh copy)."""
    return copy.deepcopy(_distilling_once())


@functools.cache
def _distilling_once() -> tuple[QuantTraining, Data, torch.Tensor]:
    data = _graph()
    torch.manual_seed(0)
    gm = fxquant.transform(GCN(6, 8, num_layers=2, out_channels=3), bits=8, lint="off")
    run = QuantTraining(gm, distill=1.0, temperature=2.0)
    teacher = torch.randn(data.num_nodes, 3, generator=torch.Generator().manual_seed(3))
    run.set_teacher(teacher)
    run.model.train()
    return run, data, teacher


def test_node_ids_of_the_issue():
    """tensor([7, 2, -1]) is refused (it read the last teacher row); int16 ids work (torch
    refused them); uint8 ids are ids, not a mask."""
    run, data, _ = _distilling()
    out = run.model(data.x, data.edge_index)[:3]
    with pytest.raises(FxquantIndexError, match=r"node_ids holds node -1.*0\.\.23"):
        run.loss(out.sum(), output=out, node_ids=torch.tensor([7, 2, -1]))
    expected = run.loss(out.sum(), output=out, node_ids=torch.tensor([7, 2, 1]))
    for dtype in (torch.int16, torch.uint8):
        got = run.loss(out.sum(), output=out, node_ids=torch.tensor([7, 2, 1], dtype=dtype))
        assert torch.equal(got, expected)


@settings(max_examples=60)
@given(dtype=st.sampled_from(DTYPES),
       ids=st.lists(st.integers(-30, 60), min_size=1, max_size=8))
def test_node_ids_of_every_integer_dtype_name_the_same_rows(dtype, ids):
    """ids of any integer dtype give what int64 ids give; any id < 0 or >= the teacher's
    rows is refused naming node_ids (whatever the dtype holds)."""
    info = torch.iinfo(dtype)
    ids = [i for i in ids if info.min <= i <= info.max] or [0]
    run, data, teacher = _distilling()
    out = run.model(data.x, data.edge_index)[:len(ids)]
    given_ids = torch.tensor(ids, dtype=dtype)
    if all(0 <= i < data.num_nodes for i in ids):
        got = run.loss(out.sum(), output=out, node_ids=given_ids)
        assert torch.equal(got, run.loss(out.sum(), output=out,
                                         node_ids=torch.tensor(ids, dtype=torch.int64)))
        t = teacher[torch.tensor(ids)]
        p = torch.softmax(t / 2, -1)
        kl = (p * (p.log() - torch.log_softmax(out / 2, -1))).sum(-1).mean()
        torch.testing.assert_close(got, out.sum() + 4 * kl)
    else:
        with pytest.raises(FxquantIndexError, match="node_ids holds node"):
            run.loss(out.sum(), output=out, node_ids=given_ids)


@pytest.mark.parametrize("dtype", [torch.bool, torch.float16, torch.float32, torch.float64,
                                   torch.complex64])
def test_node_ids_that_are_not_integers_are_refused(dtype):
    """A bool mask or float or complex ids: a type error naming node_ids."""
    run, data, _ = _distilling()
    out = run.model(data.x, data.edge_index)[:2]
    with pytest.raises(FxquantTypeError, match=r"QuantTraining\.loss: node_ids must be"):
        run.loss(out.sum(), output=out, node_ids=torch.tensor([1, 0]).to(dtype))


def test_nodes_is_the_old_name_of_node_ids():
    """loss(nodes=) works as node_ids= with a FutureWarning at the caller's line; both at
    once are refused."""
    run, data, _ = _distilling()
    out = run.model(data.x, data.edge_index)[:2]
    ids = torch.tensor([5, 9])
    with pytest.warns(FutureWarning, match=r"loss\(nodes=\) is deprecated.*node_ids=") as caught:
        old = run.loss(out.sum(), output=out, nodes=ids)
    assert caught[0].filename == __file__
    assert torch.equal(old, run.loss(out.sum(), output=out, node_ids=ids))
    with pytest.raises(FxquantTypeError, match="node_ids= alone"):
        run.loss(out.sum(), output=out, node_ids=ids, nodes=ids)


def _future_warnings() -> dict[str, Any]:
    run, data, _ = _distilling()
    out = run.model(data.x, data.edge_index)
    quiet = QuantTraining(run.model, distill=1.0)
    return {"Recipe.command": lambda: HubMessages().command,
            "loss(nodes=)": lambda: run.loss(out[:2].sum(), output=out[:2],
                                             nodes=torch.tensor([0, 1])),
            "distill without a teacher": lambda: quiet.loss(out.sum(), output=out)}


@pytest.mark.parametrize("name", ["Recipe.command", "loss(nodes=)", "distill without a teacher"])
def test_every_future_warning_of_the_recipes_points_at_the_callers_line(name):
    """Each FutureWarning the recipes give names the line that calls them."""
    with pytest.warns(FutureWarning) as caught:
        _future_warnings()[name]()
    assert [w.filename for w in caught if w.category is FutureWarning] == [__file__]


# -- resuming ---------------------------------------------------------------------------------


def _epoch(run: QuantTraining, optimizer: torch.optim.Optimizer, data: Data,
           epoch: int | None) -> None:
    run.model.train()
    run.start_epoch(epoch)
    optimizer.zero_grad()
    out = run.model(data.x, data.edge_index)
    loss = run.loss(F.cross_entropy(out[:16], data.y[:16]), output=out)
    loss.backward()
    optimizer.step()
    run.model.eval()
    with torch.no_grad():
        pred = run.model(data.x, data.edge_index).argmax(-1)
    run.observe(float((pred[16:] == data.y[16:]).float().mean()))


def _tables(run: QuantTraining) -> list[torch.Tensor]:
    return [p.node_widths.bits.detach().clone() for _, p in fxquant.quantization_points(run.model)
            if p.node_widths is not None]


def _train(recipe: Any, data: Data, epochs: range, run: QuantTraining | None = None,
           optimizer: torch.optim.Optimizer | None = None, named: bool = True
           ) -> tuple[QuantTraining, torch.optim.Optimizer, list[list[torch.Tensor]]]:
    if run is None:
        torch.manual_seed(0)
        run = recipe.prepare(GCN(6, 8, num_layers=2, out_channels=3), data, lint="off")
    if optimizer is None:
        optimizer = torch.optim.Adam(run.param_groups(), lr=0.01)
    schedule = []
    for epoch in epochs:
        _epoch(run, optimizer, data, epoch if named else None)
        schedule.append(_tables(run))
    return run, optimizer, schedule


RECIPES = {"hub-messages": HubMessages(target_bits=2.0, anneal_every=2, fit_budget=False,
                                       input_format=None),
           "budget-bits": BudgetBits(target_bits=2.0, anneal_every=2, input_format=None)}


@pytest.mark.parametrize(("name", "with_state"), [("hub-messages", False), ("hub-messages", True),
                                                  ("budget-bits", True)])
def test_resuming_mid_annealing_ends_as_the_uninterrupted_run(tmp_path, name, with_state):
    """Saved with fxquant.save after epoch 1 (anneal_every=2), continued with
    QuantTraining(fxquant.load(...), **recipe.training()): the width schedule, the final
    tables and weights equal the uninterrupted run's. Fixed tables need only the model
    file and the epochs named; with the run's state_dict the epochs may go unnamed, and
    the best epoch and the projected widths' optimizer (the run's own state) carry over
    too."""
    recipe, data = RECIPES[name], _graph()
    whole, _, schedule = _train(recipe, data, range(6))
    first, optimizer, head = _train(recipe, data, range(2), named=not with_state)
    fxquant.save(first.model, tmp_path / "model.pt")
    torch.save({"optimizer": optimizer.state_dict(),
                "run": first.state_dict() if with_state else None}, tmp_path / "run.pt")
    loaded = torch.load(tmp_path / "run.pt", weights_only=True)
    model = fxquant.load(tmp_path / "model.pt", GCN(6, 8, num_layers=2, out_channels=3))
    run = QuantTraining(model, **recipe.training())
    if with_state:
        run.load_state_dict(loaded["run"])
    optimizer = torch.optim.Adam(run.param_groups(), lr=0.01)
    optimizer.load_state_dict(loaded["optimizer"])
    run, _, tail = _train(recipe, data, range(2, 6), run, optimizer, named=not with_state)
    assert _same(head + tail, schedule)
    assert _same(_tables(run), _tables(whole))
    assert _same(run.model.state_dict(), whole.model.state_dict())
    if with_state:
        assert run.best == whole.best and _same(run.state_dict(), whole.state_dict())


@settings(max_examples=20)
@given(anneal_every=st.integers(1, 3), anneal_bits=st.integers(0, 3),
       stop=st.integers(0, 11), target=st.sampled_from([2.0, 3.0]))
def test_the_annealing_schedule_resumes_at_any_epoch(anneal_every, anneal_bits, stop, target):
    """Annealing stopped after any epoch, saved and loaded, goes on with the same widths
    each epoch as the run that was never stopped (and ends at the final widths)."""
    recipe = HubMessages(target_bits=target, anneal_every=anneal_every, anneal_bits=anneal_bits,
                         fit_budget=False, input_format=None)
    data = _graph()
    epochs = anneal_every * anneal_bits + 2  # the last two at the final widths
    stop = min(stop, epochs)
    torch.manual_seed(0)
    whole = recipe.prepare(GCN(6, 8, num_layers=2, out_channels=3), data, lint="off")
    final = _tables(whole)
    expected = []
    for epoch in range(epochs):
        whole.start_epoch(epoch)
        expected.append(_tables(whole))
    assert _same(expected[-1], final)
    torch.manual_seed(0)
    part = recipe.prepare(GCN(6, 8, num_layers=2, out_channels=3), data, lint="off")
    got = []
    for epoch in range(stop):
        part.start_epoch(epoch)
        got.append(_tables(part))
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.pt")
        fxquant.save(part.model, path)
        model = fxquant.load(path, GCN(6, 8, num_layers=2, out_channels=3))
    resumed = QuantTraining(model, **recipe.training())
    for epoch in range(stop, epochs):
        resumed.start_epoch(epoch)
        got.append(_tables(resumed))
    assert _same(got, expected)


def test_a_run_state_from_other_settings_or_another_model_is_refused():
    """load_state_dict of a run with other settings, or without the projection this one
    has: an error naming what differs, and the run unchanged."""
    run, _ = copy.deepcopy(_busy())
    state = run.state_dict()
    other = QuantTraining(run.model, **{**state["settings"], "anneal_every": 3})
    before = copy.deepcopy(other.state_dict())
    with pytest.raises(FxquantValueError, match=r"anneal_every=2 \(this run: 3\)"):
        other.load_state_dict(state)
    assert _same(other.state_dict(), before)
    with pytest.raises(FxquantValueError, match="state_dict"):
        other.load_state_dict({"epoch": 3})
    fixed = QuantTraining(_GM)
    with pytest.raises(FxquantValueError, match="settings"):
        fixed.load_state_dict(state)
    plain = QuantTraining(_GM, **state["settings"])  # no learned widths to project
    with pytest.raises(FxquantValueError, match="same model"):
        plain.load_state_dict(state)
