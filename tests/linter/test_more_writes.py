"""Writes the recording follows beyond plain in-place calls: a reentrant checkpoint's saved
inputs, ``detach_()`` of saved values, RReLU's noise; legal and buggy variants."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import fxquant


def _errors(report):
    return [(f.rule, f.line) for f in report.errors]


class WriteAfterCheckpoint(nn.Module):
    """A reentrant checkpoint saves its inputs; writing one after the call breaks backward,
    though nothing inside the segment saved it."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(4, 4)

    def forward(self, x):
        h = self.stem(x)
        y = checkpoint(lambda t: torch.tanh(t * 2.0), h, use_reentrant=True)
        h += 1  # the write
        return y + h


def test_a_write_into_what_a_reentrant_checkpoint_saved_is_named():
    line = WriteAfterCheckpoint.forward.__code__.co_firstlineno + 3
    x = torch.randn(3, 4)
    assert _errors(fxquant.lint(WriteAfterCheckpoint(), x)) == [("FXQ001", line)]
    assert _errors(fxquant.check(WriteAfterCheckpoint(), x)) == [("FXQ001", line)]


class DetachSavedOutput(nn.Module):
    """``detach_()`` of an op's saved *output* is legal (autograd re-attaches it to its own
    node); of a saved *input* it is not."""

    def __init__(self, saved_input):
        super().__init__()
        self.lin, self.w = nn.Linear(4, 4), nn.Parameter(torch.rand(4))
        self.saved_input = saved_input

    def forward(self, x):
        if self.saved_input:
            weight = self.w * 1.0
            out = (weight * self.lin(x)).sum()
            weight.detach_()
            return out
        act = torch.tanh(self.lin(x))  # tanh saves its output
        out = act.sum()
        act.detach_()
        return out


def test_detach_in_place_is_an_error_for_saved_inputs_only():
    x = torch.randn(3, 4)
    assert not fxquant.check(DetachSavedOutput(saved_input=False), x).errors
    assert not fxquant.lint(DetachSavedOutput(saved_input=False), x).errors
    assert [f.rule for f in fxquant.lint(DetachSavedOutput(saved_input=True), x).errors] == \
        ["FXQ001"]


def test_rrelu_in_place_in_training_is_legal():
    """RReLU writes its noise tensor without a version bump, on purpose: no error."""
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.RReLU(inplace=True),
                          nn.Linear(4, 2)).train()
    assert not [f for f in fxquant.lint(model, torch.randn(8, 4)).errors if f.rule == "FXQ001"]


def test_check_leaves_no_wrapper_on_a_parameters_hook():
    """A hook registered in forward on a parameter outlives the check: it is the user's own
    (fxquant gives a copy of the gradient only to hooks of the forward's own tensors), and
    no recorder stays alive through it."""
    import gc
    import weakref

    from fxquant.linter import recorder

    class Hooked(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.hooked = False

        def forward(self, x):
            if not self.hooked:  # (the tools put this flag back after each of their runs)
                self.lin.weight.register_hook(lambda g: g * 0.5)
                self.hooked = True
            return self.lin(x)

    alive = []
    init = recorder.Recorder.__init__

    def tracked(self, *args, **kwargs):
        alive.append(weakref.ref(self))
        init(self, *args, **kwargs)

    model = Hooked()
    recorder.Recorder.__init__ = tracked
    try:
        fxquant.check(model, torch.randn(3, 4))
    finally:
        recorder.Recorder.__init__ = init
    gc.collect()
    assert alive and not [r for r in alive if r() is not None]
    assert all("guarded" not in getattr(h, "__qualname__", "")
               for h in model.lin.weight._backward_hooks.values())


def test_an_optimizer_stepped_in_forward_gets_its_state_back():
    """A forward that fits an auxiliary net (backward and a momentum step inside forward)
    is legal: check's runs start from the same optimizer state (the first run's momentum
    buffers made the second run step differently: a false FXQ012), and the model's
    optimizer is left as it was."""

    class Fits(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(4, 4)
            self.aux = nn.Linear(4, 4)
            self.opt = torch.optim.SGD(self.aux.parameters(), lr=0.1, momentum=0.9)

        def forward(self, x):
            with torch.enable_grad():
                self.opt.zero_grad()
                (self.aux(x.detach()) ** 2).mean().backward()
                self.opt.step()
            return self.net(x) + self.aux(x).detach()

    model = Fits()
    assert not fxquant.check(model, torch.randn(3, 4)).errors
    assert len(model.opt.state) == 0


def test_a_pack_hook_that_keeps_the_tensor_in_a_holder_passes_it_through():
    """Saved-tensor hooks whose pack returns the same tensor inside an object of its own:
    a write after the save changes what backward computes with (check: wrong gradients)."""

    class Holder:
        def __init__(self, t):
            self.t = t

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            with torch.autograd.graph.saved_tensors_hooks(Holder, lambda h: h.t):
                y = torch.exp(self.lin(x))
            y += 1  # the write
            return y * 2

    line = Net.forward.__code__.co_firstlineno + 3
    assert [(f.rule, f.line) for f in fxquant.check(Net(), torch.randn(3, 4)).errors] == [
        ("FXQ012", line)]


class StepsInForward(nn.Module):
    """Steps an optimizer over the head after the head ran: the step writes weights the
    graph saved (``fused``: one kernel, which moves no version counter)."""

    def __init__(self, fused: bool, head_saved: bool = True):
        super().__init__()
        self.body, self.head, self.aux = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)
        self.head_saved = head_saved
        stepped = self.head if head_saved else self.aux
        self.opt = torch.optim.Adam(stepped.parameters(), lr=0.1, fused=fused,
                                    foreach=None if fused else False)
        for p in stepped.parameters():
            p.grad = torch.ones_like(p)

    def forward(self, x):
        y = self.head(self.body(x))
        self.opt.step()  # the step
        return y


def test_a_fused_optimizer_step_into_saved_weights_is_named_as_silent():
    """The fused step (``torch._fused_adam_``) bumps no version counter: backward runs and
    computes with the stepped weights. lint names the step as a silent write (the
    for-loop step's FXQ001 still says backward fails); stepping weights nothing saved is
    no finding."""
    line = StepsInForward.forward.__code__.co_firstlineno + 2
    x = torch.randn(3, 4)
    fused = fxquant.lint(StepsInForward(fused=True), x)
    assert _errors(fused) == [("FXQ001", line)]
    assert "moves no version counter" in fused.errors[0].message
    assert "silently" in fused.errors[0].message
    loop = fxquant.lint(StepsInForward(fused=False), x)
    assert _errors(loop) == [("FXQ001", line)] and "backward fails" in loop.errors[0].message
    assert not fxquant.lint(StepsInForward(fused=True, head_saved=False), x).errors
