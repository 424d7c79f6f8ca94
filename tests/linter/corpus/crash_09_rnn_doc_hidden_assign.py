"""The "efficient implementation" loop from the nn.RNN docstring: hidden states live in `h_t = hx.clone()`
and each layer writes `h_t[layer] = torch.tanh(...)`. Layer 1 multiplies `h_t[0]` (a view of `h_t`) by its
weights, which saves that view, and the next write into `h_t` bumps the shared version, so backward raises.
The docstring's parameter lookups are bound to names so that the assignment fits on one line.

Source: https://github.com/pytorch/pytorch/issues/165621
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "crash"
FIXABLE = True
SOURCE = "https://github.com/pytorch/pytorch/issues/165621"


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.RNN(3, 4, 2)

    def forward(self, x: torch.Tensor, hx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rnn = self.rnn
        params = dict(rnn.named_parameters())
        seq_len, _batch_size, _ = x.size()
        h_t_minus_1 = hx.clone()
        h_t = hx.clone()
        output = []
        for _t in range(seq_len):
            for layer in range(rnn.num_layers):
                input_t = x[_t] if layer == 0 else h_t[layer - 1]
                wi, wh = params[f"weight_ih_l{layer}"], params[f"weight_hh_l{layer}"]
                b_ih, b_hh = params[f"bias_ih_l{layer}"], params[f"bias_hh_l{layer}"]
                h_t[layer] = torch.tanh(input_t @ wi.T + h_t_minus_1[layer] @ wh.T + b_hh + b_ih)  # CULPRIT
            output.append(h_t[-1].clone())
            h_t_minus_1 = h_t.clone()
        return torch.stack(output), h_t


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.randn(3, 2, 3, generator=g), torch.randn(2, 2, 4, generator=g))
