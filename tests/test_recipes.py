"""fxquant.recipes: each recipe builds its mapping on any PyG model and says what training
does around it (tests/experiments/test_recipe_commands.py: each reproduces the accuracy of
the experiment command it stands for)."""

import copy
import warnings

import pytest
import torch
import torch_geometric.transforms as T
from torch_geometric.data import Data
from torch_geometric.nn.models import GAT, GCN, GraphSAGE

import fxquant
from fxquant.datasets import load_planetoid
from fxquant.recipes import HubMessages, LearnedBits, LsqProtect, QuantTraining
from tests.support.data import needs_data
from tests.support.models import PygGCN


def _learned_widths(model: torch.nn.Module) -> list[torch.Tensor]:
    """The learned per-node bit-width tables of a model's points (a shared one per point)."""
    return [point.node_widths.bits for _, point in fxquant.quantization_points(model)
            if point.node_widths is not None and point.node_widths.learned]


def graph(n=12, features=6, binary=True):
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(n, features, generator=g) < 0.5).float() if binary else \
        torch.randn(n, features, generator=g)
    x = x / x.sum(1, keepdim=True).clamp(min=1)
    edge_index = torch.randint(0, n, (2, 4 * n), generator=g)
    return Data(x=x, edge_index=edge_index, y=torch.randint(0, 3, (n,), generator=g),
                num_nodes=n)


@pytest.mark.parametrize("name", fxquant.recipes.available())
@pytest.mark.parametrize("zoo", [GCN, GraphSAGE, GAT])
def test_every_recipe_runs_on_pyg_models(name, zoo):
    """Each recipe transforms PyG's zoo models, trains a step, and leaves the model as is."""
    data = graph()
    torch.manual_seed(0)
    model = zoo(6, 8, num_layers=2, out_channels=3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    run = fxquant.recipes.get(name).prepare(model, data, lint="off")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    if run.distill:  # (the recommended recipe)
        run.set_teacher(torch.randn(data.num_nodes, 3))
    optimizer = torch.optim.Adam(run.param_groups(), lr=0.01)
    run.model.train()
    run.start_epoch()
    out = run.model(data.x, data.edge_index)
    run.loss(torch.nn.functional.cross_entropy(out, data.y), output=out).backward()
    optimizer.step()
    run.model.eval()
    with torch.no_grad():
        run.model(data.x, data.edge_index)
    run.observe(0.5, test=0.4)
    assert run.best is not None and run.best.metrics == {"test": 0.4}


def test_bit_recipes_read_the_graph():
    """Unsigned grids where values are non-negative (after a ReLU), a shared step across the
    ReLU, the raw features on the input format, float32 logits."""
    run = HubMessages().prepare(GCN(6, 8, num_layers=2, out_channels=3), graph(), lint="off")
    points = {(p.layer, p.site.value): p for _, p in fxquant.quantization_points(run.model)}
    assert points[("convs.0", "input")].config.format.spec() == "uint1"
    assert points[("convs.0", "output")].config.format.spec() == "uint8"  # feeds the ReLU
    assert points[("convs.1", "input")].config.format.spec() == "uint8"  # after the ReLU
    assert points[("convs.0", "message")].config.format.spec() == "int8:midrise"
    assert ("convs.1", "output") not in points
    assert points[("convs.1", "input")].log_step is points[("convs.0", "output")].log_step
    agg = points[("convs.1", "aggregate")].node_widths.bits
    assert agg is not None and bool((agg == 4).all())  # last_aggregate_bits


def test_hub_messages_gives_hubs_messages_one_bit_fewer():
    """Messages into the top in-degree decile get floor(B) - 1 bits, the rest floor(B)."""
    data = graph(n=50)
    run = HubMessages(target_bits=3.0, anneal_every=0).prepare(
        GCN(6, 8, num_layers=2, out_channels=3), data, lint="off")
    msg = dict(fxquant.quantization_points(run.model))["convs_0_message_quant"].node_widths.bits
    deg = torch.zeros(50).index_add_(0, data.edge_index[1], torch.ones(data.edge_index.shape[1]))
    hubs = deg > torch.quantile(deg, 0.9)
    assert bool((msg[hubs] == 2).all()) and bool((msg[~hubs] == 3).all())


def _final_count(run, data):
    return fxquant.bit_report(copy.deepcopy(run.model), data.x, data.edge_index).avg_bits


def test_hub_messages_fits_its_budget_on_a_graph_without_hubs():
    """A graph whose in-degrees have no tail: at the 0.9 quantile the final widths count
    more than the budget; fit_budget (the default) lowers the quantile until they fit,
    says so, records the quantile in run.recipe, and never runs the model it returns."""
    data = graph(n=60)
    model = GCN(6, 8, num_layers=2, out_channels=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kept = HubMessages(fit_budget=False).prepare(model, data, lint="off")
    assert _final_count(kept, data) > 2.0 and kept.recipe == HubMessages(fit_budget=False)
    with pytest.warns(UserWarning, match=r"hub_quantile=0\.9 .* more than target_bits=2\.0.*"
                                         r"hub_quantile=0\.\d+ is used"):
        run = HubMessages().prepare(model, data, lint="off")
    assert isinstance(run.recipe, HubMessages) and run.recipe.hub_quantile < 0.9
    assert _final_count(run, data) <= 2.0
    assert not any(p.learned_step.step_ready for _, p in fxquant.quantization_points(run.model)
                   if p.log_step is not None)  # counted on a copy: no step fitted yet
    msg = dict(fxquant.quantization_points(run.model))["convs_0_message_quant"].node_widths.bits
    deg = torch.zeros(60).index_add_(0, data.edge_index[1], torch.ones(data.edge_index.shape[1]))
    hubs = deg > torch.quantile(deg, run.recipe.hub_quantile)
    assert bool(hubs.any()) and bool((msg[hubs] == 1).all()) and bool((msg[~hubs] == 2).all())
    with pytest.warns(UserWarning, match="even hub_quantile=0.05 counts .* raise target_bits"):
        HubMessages(target_bits=1.0).prepare(model, data, lint="off")
    with pytest.raises(TypeError, match=r"fit_budget must be a bool \(True or False\)"):
        HubMessages(fit_budget="yes")


def test_fit_budget_warns_where_it_cannot_count():
    """A model whose forward needs more than (x, edge_index): the recipe still prepares it,
    and a warning says the budget was not checked and how to check it."""

    class Pooled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gcn = GCN(6, 8, num_layers=2, out_channels=3)

        def forward(self, x, edge_index, batch):
            return self.gcn(x, edge_index)[batch]

    with pytest.warns(UserWarning, match="could not count the bits.*fit_budget=False"):
        run = HubMessages().prepare(Pooled(), graph(n=60), lint="off")
    assert run.recipe == HubMessages()


@needs_data
@pytest.mark.parametrize("name", ["Cora", "CiteSeer"])
def test_the_recommended_recipe_fits_cora_and_citeseer_as_chosen(name):
    """On the graphs it was chosen on, the rule is within its budget at the 0.9 quantile:
    fit_budget changes nothing there (no warning, the same quantile and widths)."""
    dataset = load_planetoid(name, transform=T.NormalizeFeatures(), download=False)
    data = dataset[0]
    model = PygGCN(data.num_features, 16, dataset.num_classes)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run = fxquant.recipes.get("recommended").prepare(model, data, lint="off")
    assert run.recipe == fxquant.recipes.get("recommended")
    assert run.recipe.hub_quantile == 0.9 and _final_count(run, data) <= 2.0


def test_annealing_starts_above_and_drops_one_bit_every_e_epochs():
    """anneal_every=E: the fixed widths start anneal_bits above and drop by one every E."""
    run = HubMessages(anneal_every=2, anneal_bits=2).prepare(
        GCN(6, 8, num_layers=2, out_channels=3), graph(), lint="off")
    table = dict(fxquant.quantization_points(run.model))["convs_0_aggregate_quant"].node_widths.bits
    final = table.clone()
    seen = []
    for epoch in range(6):
        run.start_epoch(epoch)
        seen.append(int((table - final).max()))
    assert seen == [2, 2, 1, 1, 0, 0]



@pytest.mark.parametrize("recipe", [HubMessages, fxquant.recipes.BudgetBits])
def test_steps_are_fitted_again_after_each_annealing_drop(recipe):
    """anneal_refit_epochs=R: the learned steps are fitted again on the first R epochs after
    each drop (and only then)."""
    data = graph(n=40)
    run = recipe(anneal_every=3, anneal_bits=2, anneal_refit_epochs=2).prepare(
        GCN(6, 8, num_layers=2, out_channels=3), data, lint="off")
    points = [p for _, p in fxquant.quantization_points(run.model)  # those owning a step
              if p.log_step is not None and p.__dict__.get("step_source") is None]
    refits = []
    for epoch in range(12):
        run.model.train()
        run.start_epoch(epoch)
        refits.append(not any(p.learned_step.step_ready for p in points))
        run.model(data.x, data.edge_index)  # fits what was marked
        assert all(p.learned_step.step_ready for p in points)
    assert [e for e, r in enumerate(refits) if r] == [0, 3, 4, 6, 7]
    assert "anneal_refit_epochs=2" in repr(run)
    with pytest.raises(ValueError, match="anneal_refit_epochs"):
        recipe(anneal_refit_epochs=-1)


@pytest.mark.parametrize("widen", [False, True])
def test_refit_widen_keeps_the_steps_from_narrowing_in_the_warm_up(widen):
    """refit_widen=True: the refits of the first epochs never shrink a learned step (the
    features shrinking 100x leave the grids); without it they follow the smaller values."""
    data = graph(n=40)
    run = HubMessages(refit_epochs=3, refit_widen=widen, anneal_every=0).prepare(
        GCN(6, 8, num_layers=2, out_channels=3), data, lint="off")
    points = [p for _, p in fxquant.quantization_points(run.model)
              if p.log_step is not None and p.__dict__.get("step_source") is None]
    run.model.train()
    run.start_epoch(0)
    run.model(data.x, data.edge_index)
    before = [p.step.item() for p in points]
    run.start_epoch(1)
    run.model(data.x / 100, data.edge_index)
    after = [p.step.item() for p in points]
    if widen:  # never narrower (a value with a bias in it may even ask for a wider grid)
        assert all(a >= b for a, b in zip(after, before, strict=True))
    else:
        assert all(a < b / 10 for a, b in zip(after, before, strict=True))
    assert ("refit_widen=True" in repr(run)) == widen
    with pytest.raises(TypeError, match="refit_widen"):
        HubMessages(refit_widen="yes")


def test_float_epochs_train_unrounded_then_fit_the_steps_to_the_trained_activations():
    """float_epochs=2: training forwards of epochs 0-1 are the float32 model's (evaluation
    rounds); epoch 2 rounds and fits the steps, to the activations of that time."""
    data = graph(n=40)
    torch.manual_seed(0)
    model = GCN(6, 8, num_layers=2, out_channels=3)
    plain = copy.deepcopy(model).train()
    run = HubMessages(float_epochs=2, anneal_every=0).prepare(model, data, lint="off")
    points = [p for _, p in fxquant.quantization_points(run.model)
              if p.log_step is not None and p.__dict__.get("step_source") is None]
    for epoch in range(2):
        run.model.train()
        run.start_epoch(epoch)
        torch.manual_seed(epoch)
        out = run.model(data.x, data.edge_index)
        torch.manual_seed(epoch)
        assert torch.equal(out, plain(data.x, data.edge_index))
        run.model.eval()
        assert not torch.equal(run.model(data.x, data.edge_index), plain.eval()(data.x,
                                                                               data.edge_index))
        plain.train()
    steps = [p.step.item() for p in points]
    run.model.train()
    run.start_epoch(2)
    assert not any(p.learned_step.step_ready for p in points) and not any(p.float_training for p in points)
    torch.manual_seed(2)
    out = run.model(data.x, data.edge_index)  # rounds, and fits the steps
    torch.manual_seed(2)
    assert not torch.equal(out, plain(data.x, data.edge_index))
    assert steps == [1.0] * len(points)  # never fitted in the float epochs (exp(0))
    assert all(p.learned_step.step_ready and p.step.item() != 1.0 for p in points)
    assert "float_epochs=2" in repr(run)
    with pytest.raises(ValueError, match="float_epochs"):
        HubMessages(float_epochs=-1)


@pytest.mark.parametrize("stale", [False, True])
def test_widening_refits_past_the_float_epochs_start_from_a_fresh_fit(stale):
    """refit_widen with refits past float_epochs: the first rounded epoch fits every step
    afresh, as without refit_widen (neither the placeholder of a step never fitted, exp(0),
    nor a fit made before the float epochs, ``stale``, is a grid to keep); the widening
    refits after it never go below that fit."""
    data = graph(n=40)

    def steps(widen):
        torch.manual_seed(0)
        model = GCN(6, 8, num_layers=2, out_channels=3)
        run = HubMessages(float_epochs=2, refit_epochs=4, refit_widen=widen,
                          anneal_every=0).prepare(model, data, lint="off")
        points = [p for _, p in fxquant.quantization_points(run.model)
                  if p.log_step is not None and p.__dict__.get("step_source") is None]
        if stale:  # a fit on activations 100x larger than the ones to come
            run.model.train()
            run.model(100 * data.x, data.edge_index)
        seen = []
        for epoch in range(4):
            run.model.train()
            run.start_epoch(epoch)
            torch.manual_seed(epoch)
            run.model(data.x, data.edge_index)
            seen.append([p.step.item() for p in points])
        return seen

    plain, widened = steps(False), steps(True)
    assert widened[2] == plain[2]  # the first rounded epoch: the same fresh fit
    assert all(s < 1.0 for s in plain[2])  # fitted to small activations
    assert all(w >= f for w, f in zip(widened[3], widened[2], strict=True))
    if stale:
        assert all(f < s for f, s in zip(plain[2], plain[1], strict=True))


def test_lsq_protect_passes_float_epochs_to_its_training():
    """LsqProtect(float_epochs=N): the run trains its first N epochs unrounded (the
    dq_table.py --float-epochs rows in a recipe of their own)."""
    data = graph(n=40)
    run = LsqProtect(bits=8, float_epochs=3).prepare(GCN(6, 8, num_layers=2, out_channels=3),
                                                      data, lint="off")
    assert run.float_epochs == 3 and "float_epochs=3" in repr(run)
    run.start_epoch(0)
    assert all(p.float_training for _, p in fxquant.quantization_points(run.model))
    assert LsqProtect().prepare(GCN(6, 8, num_layers=2, out_channels=3)).float_epochs == 0
    with pytest.raises(ValueError, match="float_epochs"):
        LsqProtect(float_epochs=-1)


@pytest.mark.parametrize("name", ["lsq-protect", "hub-messages", "learned-bits", "budget-bits"])
def test_message_rounding_rounds_the_messages_stochastically_and_nothing_else(name):
    """message_rounding="stochastic": the message points round stochastically (two
    forwards of one input differ there), every other point to nearest; a GAT's messages
    train; a bad value names the setting."""
    data = graph(n=40)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # hub-messages lowers its quantile on this graph
        run = fxquant.recipes.get(name, message_rounding="stochastic").prepare(
            GAT(6, 8, num_layers=2, out_channels=3), data, lint="off")
        nearest = fxquant.recipes.get(name).prepare(GAT(6, 8, num_layers=2, out_channels=3),
                                                    data, lint="off")
    points = dict(fxquant.quantization_points(run.model))
    rounding = {p.site.value: p.config.rounding.value for p in points.values()}
    sites = {p.site.value for p in points.values() if p.config.rounding.value == "stochastic"}
    assert sites == {"message"} and rounding["aggregate"] == "nearest"
    _train_epochs(run, data, 2)
    run.model.eval()
    seen = []
    for point in points.values():
        if point.site.value == "message":
            point.register_forward_hook(lambda m, i, o: seen.append(o.detach().clone()))
    with torch.no_grad():
        run.model(data.x, data.edge_index)
        run.model(data.x, data.edge_index)
    half = len(seen) // 2
    assert half and any(not torch.equal(a, b) for a, b in zip(seen[:half], seen[half:], strict=True))
    assert {p.config.rounding.value for _, p in fxquant.quantization_points(nearest.model)} \
        == {"nearest"}
    with pytest.raises(ValueError, match="message_rounding must be 'nearest' or 'stochastic'"):
        fxquant.recipes.get(name, message_rounding="toward_zero")


@pytest.mark.parametrize("recipe", [LearnedBits, fxquant.recipes.BudgetBits])
def test_float_epochs_with_learned_widths_add_no_penalty_until_values_round(recipe):
    """In the float epochs nothing rounds in training: the loss is the model's own (no bit
    penalty, no projection to measure); afterwards the learned widths train as ever."""
    data = graph(n=40)
    torch.manual_seed(0)
    extra = {"anneal_every": 0} if recipe is fxquant.recipes.BudgetBits else {}
    run = recipe(float_epochs=2, **extra).prepare(
        GCN(6, 8, num_layers=2, out_channels=3), data, lint="off")
    optimizer = torch.optim.Adam(run.param_groups(), lr=0.01)
    widths = [w.detach().clone() for w in _learned_widths(run.model)]
    for epoch in range(4):
        run.model.train()
        run.start_epoch(epoch)
        optimizer.zero_grad()
        plain = torch.nn.functional.cross_entropy(run.model(data.x, data.edge_index), data.y)
        loss = run.loss(plain)
        if epoch < 2:
            assert loss is plain
        elif recipe is LearnedBits:
            assert loss is not plain  # the bit penalty
        loss.backward()
        optimizer.step()
        run.after_step()
        run.model.eval()
        with torch.no_grad():
            run.model(data.x, data.edge_index)
        run.observe(0.5)
    after = [w.detach() for w in _learned_widths(run.model)]
    assert any(not torch.equal(a, b) for a, b in zip(after, widths, strict=True))


def test_param_groups_keep_decay_off_the_quantizers_and_widths_at_their_rate():
    """Steps and widths leave the user's groups for groups without weight decay."""
    run = LearnedBits(bits_lr=0.05).prepare(GCN(6, 8, num_layers=2, out_channels=3), graph(),
                                            lint="off")
    groups = run.param_groups([{"params": list(run.model.parameters()), "weight_decay": 5e-4}])
    widths = _learned_widths(run.model)
    assert groups[-1]["lr"] == 0.05 and groups[-1]["weight_decay"] == 0.0
    assert {id(p) for p in groups[-1]["params"]} == {id(p) for p in widths}
    assert groups[-2]["weight_decay"] == 0.0
    decayed = {id(p) for p in groups[0]["params"]}
    assert not decayed & {id(p) for g in groups[1:] for p in g["params"]}
    assert sum(len(g["params"]) for g in groups) == len(list(run.model.parameters()))


def test_step_lr_gives_the_learned_steps_a_rate_of_their_own():
    """step_lr: the learned steps' group takes it (and still no decay); the model's groups
    keep the optimizer's rate; a bad value is refused before anything is built."""
    run = HubMessages(step_lr=0.05).prepare(GCN(6, 8, num_layers=2, out_channels=3), graph(),
                                            lint="off")
    steps = {id(p.log_step) for _, p in fxquant.quantization_points(run.model)
             if p.log_step is not None}
    groups = run.param_groups()
    (mine,) = [g for g in groups if {id(p) for p in g["params"]} & steps]
    assert {id(p) for p in mine["params"]} == steps
    assert mine["lr"] == 0.05 and mine["weight_decay"] == 0.0
    assert all("lr" not in g for g in groups if g is not mine)
    assert "step_lr=0.05" in repr(run)
    default = HubMessages().prepare(GCN(6, 8, num_layers=2, out_channels=3), graph(),
                                    lint="off").param_groups()
    assert all("lr" not in g for g in default)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="step_lr"):
            HubMessages(step_lr=bad)


def test_select_budget_reports_the_best_epoch_within_the_budget():
    """select='budget': the best validation epoch whose bits meet the target wins; with none
    within, the best overall, marked."""
    gm = fxquant.transform(GCN(6, 8, num_layers=2, out_channels=3), bits=8, lint="off")
    data = graph()
    with torch.no_grad():
        gm(data.x, data.edge_index)
    run = QuantTraining(gm, target_bits=4.0, select="budget")
    run.observe(0.9, test=0.1)
    assert run.best is not None and run.best.within_budget is False  # 8 bits > 4
    assert run.best.metrics["test"] == 0.1
    tight = QuantTraining(gm, target_bits=8.0, select="budget")
    tight.observe(0.5, test=0.2)
    tight.observe(0.9, test=0.3)
    tight.observe(0.9, test=0.4)  # a tie keeps the first
    assert tight.best is not None and tight.best.metrics["test"] == 0.3 and tight.best.within_budget
    assert QuantTraining(gm).best is None


def test_recipe_errors_are_clear():
    """Missing graph, a model without GNN layers, bad settings: errors naming the fix."""
    with pytest.raises(fxquant.FxquantError, match="needs the graph"):
        HubMessages().prepare(GCN(6, 8, num_layers=2, out_channels=3))
    with pytest.raises(fxquant.FxquantError, match="calls none"):
        LsqProtect().prepare(torch.nn.Sequential(torch.nn.Linear(3, 3)))
    with pytest.raises(fxquant.FxquantError, match="shared_bits"):
        LearnedBits(shared_bits="some")
    with pytest.raises(fxquant.FxquantError, match="no setting"):
        fxquant.recipes.get("mx", bits=4)
    with pytest.raises(ValueError, match="protect"):
        LsqProtect(protect=(0.5, 0.1))


def test_inexact_raw_features_warn():
    """Real-valued features are not exact on a 1-bit grid: a warning says what to pass."""
    with pytest.warns(UserWarning, match="input_format=None"):
        HubMessages().prepare(GCN(6, 8, num_layers=2, out_channels=3), graph(binary=False),
                              lint="off")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        HubMessages(input_format=None, fit_budget=False).prepare(  # no hubs: see above
            GCN(6, 8, num_layers=2, out_channels=3), graph(binary=False), lint="off")


def _budget_run(target=2.0, n=40, **settings):
    data = graph(n=n)
    torch.manual_seed(0)
    recipe = fxquant.recipes.BudgetBits(target_bits=target, anneal_every=0, **settings)
    return recipe.prepare(GCN(6, 8, num_layers=2, out_channels=3), data, lint="off"), data


def _train_epochs(run, data, epochs, lr=0.01, after=None):
    """The training loop's calls, with the counted bits of each epoch's evaluation."""
    optimizer = torch.optim.Adam(run.param_groups(), lr=lr)
    counted = []
    for epoch in range(epochs):
        run.model.train()
        run.start_epoch(epoch)
        optimizer.zero_grad()
        out = run.model(data.x, data.edge_index)
        run.loss(torch.nn.functional.cross_entropy(out, data.y)).backward()
        if after is not None:
            after(run)
        optimizer.step()
        counted.append(fxquant.bit_report(run.model, data.x, data.edge_index).avg_bits)
    return counted


@pytest.mark.parametrize("target", [1.5, 2.0, 2.7])
@pytest.mark.parametrize("shared_bits", ["none", "all"])
def test_budget_bits_land_at_or_under_the_budget(target, shared_bits):
    """Projected learned widths: every epoch's counted average is within the budget and
    fills it (within what one node's width is worth), whatever the loss asks."""
    run, data = _budget_run(target, shared_bits=shared_bits, bits_lr=0.5)
    counted = _train_epochs(run, data, 8)
    assert all(c <= target for c in counted[1:])  # from the first projection on
    assert all(c >= target - 0.25 for c in counted[1:])
    widths = _learned_widths(run.model)
    assert len({id(w) for w in widths}) == (1 if shared_bits == "all" else len(widths))


def test_budget_bits_hold_against_a_loss_that_wants_every_width_up():
    """A gradient pushing every width up (the loss's pull, at any strength) cannot take
    the count over the budget: the projection takes back what the step adds."""
    run, data = _budget_run(2.0, bits_lr=3.0)

    def every_width_up(run):
        for widths in _learned_widths(run.model):
            widths.grad = -torch.ones_like(widths)

    counted = _train_epochs(run, data, 5, after=every_width_up)
    assert min(counted[1:]) >= 1.75 and max(counted[1:]) <= 2.0


def test_budget_bits_step_size_is_their_own():
    """Projected widths are not in the model's optimizer: the model's learning rate does
    not move them, their own step size does."""
    moves = []
    for lr in (1e-4, 1e-1):
        run, data = _budget_run(2.0, bits_lr=0.05)
        assert not any(m.node_widths is not None and p is m.node_widths.bits
                       for g in run.param_groups() for p in g["params"]
                       for _, m in fxquant.quantization_points(run.model))
        before = [w.detach().clone() for w in _learned_widths(run.model)]
        _train_epochs(run, data, 3, lr=lr)
        after = [w.detach() for w in _learned_widths(run.model)]
        moves.append([float((a - b).abs().max()) for a, b in zip(after, before, strict=True)])
    assert moves[0] == pytest.approx(moves[1], abs=0.2)


def test_budget_projection_counts_as_the_bit_report():
    """The projection's own count of the widths is the bit report's, to float32 rounding."""
    run, data = _budget_run(2.0)
    _train_epochs(run, data, 3)
    run.model.train()
    out = run.model(data.x, data.edge_index)
    run.loss(torch.nn.functional.cross_entropy(out, data.y))
    assert run._budget.count() == pytest.approx(fxquant.bit_report(run.model).avg_bits, abs=1e-5)


def test_an_empty_batch_leaves_the_penalty_and_the_budgeted_widths_alone():
    """A batch without nodes counts no value: its penalty is 0 (not storage over one
    value), and the projection keeps the last batch's costs instead of taking the
    widths to their floor as if the budget could not be met."""
    run, data = _budget_run(2.0, bits_lr=0.05)
    _train_epochs(run, data, 2)
    before = [w.detach().clone() for w in _learned_widths(run.model)]
    optimizer = torch.optim.Adam(run.param_groups(), lr=0.01)
    run.model.train()
    out = run.model(data.x[:0], torch.empty(2, 0, dtype=torch.long))
    assert float(fxquant.bit_penalty(run.model, 2.0)) == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "below what the narrowest widths cost"
        run.loss(out.sum()).backward()
        optimizer.step()
        run.after_step()
    after = [w.detach() for w in _learned_widths(run.model)]
    assert all(float((a - b).abs().max()) < 0.2 for a, b in zip(after, before, strict=True))
    assert not run._budget.infeasible


def test_budget_annealing_and_infeasible_budgets():
    """The budget starts anneal_bits above and drops one bit every anneal_every epochs; a
    budget below the narrowest widths warns and leaves them at their floor."""
    data = graph(n=40)
    run = fxquant.recipes.BudgetBits(target_bits=2.0, anneal_every=2, anneal_bits=2).prepare(
        GCN(6, 8, num_layers=2, out_channels=3), data, lint="off")
    seen = []
    for epoch in range(6):
        run.start_epoch(epoch)
        seen.append(run.budget_now())
    assert seen == [4.0, 4.0, 3.0, 3.0, 2.0, 2.0]
    run, data = _budget_run(0.5)
    with pytest.warns(UserWarning, match="below what the narrowest widths cost") as caught:
        _train_epochs(run, data, 2)
    assert [w.filename for w in caught if "narrowest" in str(w.message)] == [__file__]
    assert all(bool((widths == 1).all()) for widths in _learned_widths(run.model))
    with pytest.raises(fxquant.FxquantError, match="init"):
        fxquant.recipes.BudgetBits(init="hubs")
    with pytest.raises(fxquant.FxquantError, match="project=True"):
        QuantTraining(run.model, project=True)


@pytest.mark.parametrize("name", ["degree-quant", "lsq-protect", "mx"])
def test_every_site_recipes_skip_the_weights_of_a_layer_without_any(name):
    """APPNP has no weight: the recipe's own weight site refused the model ("APPNP has no
    weight to round"), and the user could not take it out."""
    from torch_geometric.nn import APPNP, GCNConv

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.prop = GCNConv(6, 3), APPNP(K=2, alpha=0.1)

        def forward(self, x, edge_index):
            return self.prop(self.conv(x, edge_index), edge_index)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = fxquant.recipes.get(name).prepare(Net(), graph())
    points = [p for _, p in fxquant.quantization_points(run.model)]
    weights = {p.layer for p in points if p.site.value == "weight"}
    assert weights == {"conv"}
    assert {p.site.value for p in points if p.layer == "prop"} >= {"input", "message", "output"}


def _distilling(distill=0.5, temperature=2.0, float_epochs=0):
    data = graph(n=30)
    torch.manual_seed(0)
    run = HubMessages(target_bits=2.0, fit_budget=False, input_format=None,
                      float_epochs=float_epochs, distill=distill,
                      temperature=temperature).prepare(
        GCN(6, 8, num_layers=2, out_channels=3), data, lint="off")
    return run, data


@pytest.mark.parametrize("float_epochs", [0, 3])
def test_distillation_adds_the_tempered_kl_to_the_teacher(float_epochs):
    """loss(loss, output=out) adds distill * T**2 * KL(softmax(teacher / T) || softmax(out /
    T)) averaged over the nodes, in the float epochs too; nothing in evaluation."""
    run, data = _distilling(float_epochs=float_epochs)
    teacher = torch.randn(30, 3, generator=torch.Generator().manual_seed(1)) * 3
    run.set_teacher(teacher)
    teacher.zero_()  # a copy is kept
    teacher = torch.randn(30, 3, generator=torch.Generator().manual_seed(1)) * 3
    run.model.train()
    run.start_epoch(0)
    out = run.model(data.x, data.edge_index)
    plain = torch.nn.functional.cross_entropy(out, data.y)
    p = torch.softmax(teacher / 2, -1)
    kl = (p * (p.log() - torch.log_softmax(out / 2, -1))).sum(-1).mean()
    torch.testing.assert_close(run.loss(plain, output=out), plain + 0.5 * 4 * kl)
    run.loss(plain, output=out).backward()  # the gradient reaches the model's weights
    weights = [w for n, w in run.model.named_parameters() if n.endswith("lin.weight")]
    assert len(weights) == 2 and all(w.grad is not None and w.grad.abs().sum() > 0
                                     for w in weights)
    run.model.eval()
    assert run.loss(plain, output=out) is plain
    # rows of a mini-batch: the teacher's rows of the batch's nodes
    run.model.train()
    nodes = torch.tensor([4, 0, 7])
    p = torch.softmax(teacher[nodes] / 2, -1)
    kl = (p * (p.log() - torch.log_softmax(out[nodes] / 2, -1))).sum(-1).mean()
    torch.testing.assert_close(run.loss(plain, output=out[nodes], node_ids=nodes),
                               plain + 0.5 * 4 * kl)


def test_distillation_errors_are_clear():
    """A loop that gives no teacher or no output trains without distillation, with one
    FutureWarning naming the call; bad teachers and mismatched rows raise."""
    run, data = _distilling()
    run.model.train()
    out = run.model(data.x, data.edge_index)
    plain = out.sum()
    with pytest.warns(FutureWarning, match=r"run.set_teacher\(logits\).*without distillation"):
        assert run.loss(plain, output=out) is plain
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert run.loss(plain, output=out) is plain  # once per run
    with pytest.raises(fxquant.FxquantError, match=r"float \[num_nodes, num_classes\] tensor"):
        run.set_teacher(torch.arange(30))
    with pytest.raises(fxquant.FxquantError, match="inf or NaN"):
        run.set_teacher(torch.full((30, 3), float("nan")))
    run, data = _distilling()
    run.model.train()
    out = run.model(data.x, data.edge_index)
    run.set_teacher(torch.randn(30, 3))
    with pytest.warns(FutureWarning, match=r"output=out"):
        assert run.loss(out.sum()) is not None
    with pytest.raises(fxquant.FxquantError, match="pass node_ids="):
        run.loss(out.sum(), output=out[:5])
    run.set_teacher(torch.randn(30, 4))
    with pytest.raises(fxquant.FxquantError, match="the same classes"):
        run.loss(out.sum(), output=out)
    with pytest.raises(fxquant.FxquantError, match="distill"):
        HubMessages(distill=-1.0)
    with pytest.raises(fxquant.FxquantError, match="temperature"):
        QuantTraining(run.model, temperature=0.0)
    assert "distill=0.5, temperature=2.0" in repr(run)
    with pytest.warns(UserWarning, match="does not distill"):
        QuantTraining(run.model).set_teacher(torch.randn(30, 3))


@pytest.mark.parametrize("name", fxquant.recipes.available())
def test_command_is_deprecated_and_names_no_script(name):
    """``Recipe.command`` warns at the caller's line and is empty: the library names no
    command line (the docs' results list each recipe's command)."""
    recipe = fxquant.recipes.get(name)
    with pytest.warns(FutureWarning, match="Recipe.command is deprecated") as caught:
        assert recipe.command == ""
    assert caught[0].filename == __file__
    with pytest.warns(FutureWarning):
        assert type(recipe).command == ""
