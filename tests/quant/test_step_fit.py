"""When a learned step (``range="lsq"``) is fitted: on the first training batch with a
finite nonzero value; a state saved before that batch loads unfitted (and is fitted by the
next training batch), one saved after it loads fitted; evaluating an unfitted step warns."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import fxquant
from fxquant.quant.config import QuantConfig


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 8))


def _transform(model=None):
    config = QuantConfig("int8", scale="tensor", range="lsq")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fxquant.transform(model or _model(), config, layers="0")


def _step(gm):
    return float(gm.get_submodule("_0_quant").step)


X = torch.randn(20, 8, generator=torch.Generator().manual_seed(1)) * 0.05


@pytest.mark.parametrize("route", ["state_dict", "save"])
def test_a_step_saved_before_its_first_training_batch_loads_unfitted(route, tmp_path):
    """Keeping the initial state to start each run from is common: the placeholder step
    it holds is fitted by the first training batch after loading, as in a fresh model
    (it used to be taken as fitted: step 1 rounded every output of this layer to 0)."""
    fresh = _transform()
    fresh.train()(X)
    untrained = _transform()
    if route == "state_dict":
        again = _transform()
        again.load_state_dict(copy.deepcopy(untrained.state_dict()))
    else:
        fxquant.save(untrained, tmp_path / "gm.pt")
        again = fxquant.load(tmp_path / "gm.pt", _model())
    again.train()(X)
    assert _step(again) == _step(fresh) != 1.0
    # a trained step loads fitted: the next training batch does not fit it again
    trained = copy.deepcopy(again)
    trained.load_state_dict(again.state_dict())
    trained.train()(X * 100)
    assert _step(trained) == _step(again)


def test_state_dicts_of_older_versions_load_their_steps_fitted():
    """A state dict of 0.9.8 or earlier (a point's keys flat), and one without the fitted
    flag (written before it was saved), load as they did: their steps fitted."""
    state = {key.replace("learned_step.", ""): value
             for key, value in _transform().state_dict().items()}
    assert "_0_quant.log_step" in state
    del state["_0_quant.step_is_fitted"]
    gm = _transform()
    gm.load_state_dict(state, strict=True)
    gm.train()(X)
    assert _step(gm) == 1.0


def test_evaluating_an_unfitted_step_warns_once_per_point():
    gm = _transform().eval()
    with pytest.warns(UserWarning, match="no training batch has fitted"):
        gm(X)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gm(X)
        gm.train()(X)
        gm.eval()(X)


def test_an_all_zero_first_batch_leaves_the_step_to_the_next():
    """An all-zero batch (the aggregation of a batch without edges) says nothing of the
    scale: the step is fitted on the next batch, not to the smallest candidate."""
    gm, reference = _transform(), _transform()
    with torch.no_grad():  # the layer's output on zeros is its bias: 0
        gm.get_submodule("0").bias.zero_()
        reference.get_submodule("0").bias.zero_()
    gm.train()(torch.zeros(5, 8))
    gm(X)
    reference.train()(X)
    assert _step(gm) == _step(reference) != 1.0


class Chain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.b(self.a(x).relu())


def test_a_shared_step_is_taken_from_the_point_that_runs_first(tmp_path):
    """The shared step is fitted on the source's first training batch: a source that runs
    after the point is refused, naming the order to pass (the point rounded that batch
    with the placeholder, and the fit broke its backward with autograd's in-place error)."""
    config = QuantConfig("uint4", scale="tensor", range="lsq")
    mapping = fxquant.QuantMapping().set_name("a", config).set_name("b", config, site="input")
    gm = fxquant.transform(Chain(), mapping, lint="off")
    with pytest.raises(fxquant.FxquantError,
                       match=r"share_step\(model, 'b_input_quant', 'a_quant'\)"):
        fxquant.share_step(gm, "a_quant", "b_input_quant")
    assert gm.get_submodule("a_quant").log_step is not gm.get_submodule("b_input_quant").log_step
    fxquant.share_step(gm, "b_input_quant", "a_quant")
    gm(torch.randn(8, 4)).sum().backward()
    # a fitted (or loaded) source has no fit to come: either order is fine, and a file
    # that shares that way loads
    fitted = fxquant.transform(Chain(), mapping, lint="off")
    fitted(torch.randn(8, 4))
    fxquant.share_step(fitted, "a_quant", "b_input_quant")
    fitted(torch.randn(8, 4)).sum().backward()
    path = tmp_path / "gm.pt"
    fxquant.save(fitted, path)
    again = fxquant.load(path, Chain())
    assert again.get_submodule("a_quant").log_step is again.get_submodule("b_input_quant").log_step


@pytest.mark.parametrize("source_part", ["empty", "nan", "zeros"])
def test_a_bipartite_input_whose_source_part_holds_nothing_to_fit_trains(source_part):
    """One input point rounds both parts of a bipartite layer's input: a source part with
    no finite nonzero value leaves the fit to the target part, in the same forward, and
    the backward runs (the fit wrote the step after the first part used it)."""
    from torch_geometric.nn import SAGEConv

    class Bipartite(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = SAGEConv((8, 8), 16)

        def forward(self, x_src, x_dst, edge_index):
            return self.conv((x_src, x_dst), edge_index)

    x_src = {"empty": torch.randn(0, 8), "nan": torch.full((10, 8), float("nan")),
             "zeros": torch.zeros(10, 8)}[source_part]
    config = QuantConfig("int8", scale="tensor", range="lsq")
    gm = fxquant.transform(Bipartite(), fxquant.QuantMapping().set_global(config, site="input"),
                           lint="off")
    out = gm(x_src, torch.randn(5, 8), torch.empty(2, 0, dtype=torch.long))
    out.nan_to_num().sum().backward()
    point = gm.get_submodule("conv_input_quant")
    assert point.learned_step.step_fitted and float(point.step) != 1.0


def test_a_step_given_otherwise_counts_as_fitted():
    """A copy whose steps come from elsewhere (an AveragedModel made before training,
    a tied step trained by its source) holds steps, not placeholders: its evaluation does
    not warn, and its state says fitted (loading it does not refit the averaged step)."""
    from torch.optim.swa_utils import AveragedModel

    gm = _transform()
    ema = AveragedModel(gm)
    gm.train()(X)
    ema.update_parameters(gm)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ema.module.eval()(X)
    state = ema.module.state_dict()
    assert float(state["_0_quant.learned_step.step_is_fitted"]) == 1.0
    again = _transform()
    again.load_state_dict(state)
    again.train()(X * 100)
    assert _step(again) == pytest.approx(float(ema.module.get_submodule("_0_quant").step.detach()))


def test_an_input_point_passing_integers_through_does_not_warn():
    class Embed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(5, 4)

        def forward(self, kinds):
            return self.emb(kinds)

    config = QuantConfig("int4", scale="tensor", range="lsq")
    gm = fxquant.transform(Embed(), fxquant.QuantMapping().set_name("emb", config, site="input"),
                           lint="off")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gm.eval()(torch.tensor([0, 3, 1]))
