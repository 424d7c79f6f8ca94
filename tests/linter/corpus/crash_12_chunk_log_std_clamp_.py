"""StateDependentPolicy.sample: `means, log_stds = self.net(states).chunk(2, dim=-1)` and then
`reparameterize(means, log_stds.clamp_(-20, 2))`. `log_stds` is one of several views returned by chunk, so
the in-place clamp raises "Output 1 of SplitBackward0 is a view and is being modified inplace" in the
forward; `clamp` works. The Gaussian noise that `reparameterize` draws with `randn_like` is passed in as an
input so that the example is deterministic.

Source: https://github.com/toshikwa/gail-airl-ppo.pytorch/issues/13
"""

from __future__ import annotations

import math

import torch
from torch import nn

KIND = "crash"
FIXABLE = True
SOURCE = "https://github.com/toshikwa/gail-airl-ppo.pytorch/issues/13"


def build_mlp(
    input_dim: int,
    output_dim: int,
    hidden_units: tuple[int, ...] = (8, 8),
    hidden_activation: nn.Module = nn.Tanh(),  # noqa: B008
) -> nn.Sequential:
    layers: list[nn.Module] = []
    units = input_dim
    for next_units in hidden_units:
        layers.append(nn.Linear(units, next_units))
        layers.append(hidden_activation)
        units = next_units
    layers.append(nn.Linear(units, output_dim))
    return nn.Sequential(*layers)


def calculate_log_pi(log_stds: torch.Tensor, noises: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    gaussian_log_probs = (-0.5 * noises.pow(2) - log_stds).sum(dim=-1, keepdim=True) - 0.5 * math.log(
        2 * math.pi
    ) * log_stds.size(-1)
    return gaussian_log_probs - torch.log(1 - actions.pow(2) + 1e-6).sum(dim=-1, keepdim=True)


def reparameterize(
    means: torch.Tensor, log_stds: torch.Tensor, noises: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    us = means + noises * log_stds.exp()
    actions = torch.tanh(us)
    return actions, calculate_log_pi(log_stds, noises, actions)


class StateDependentPolicy(nn.Module):
    def __init__(
        self,
        state_shape: tuple[int, ...],
        action_shape: tuple[int, ...],
        hidden_units: tuple[int, ...] = (8, 8),
        hidden_activation: nn.Module = nn.ReLU(inplace=True),  # noqa: B008
    ) -> None:
        super().__init__()
        self.net = build_mlp(
            input_dim=state_shape[0],
            output_dim=2 * action_shape[0],
            hidden_units=hidden_units,
            hidden_activation=hidden_activation,
        )

    def forward(self, states: torch.Tensor, noises: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.sample(states, noises)

    def sample(self, states: torch.Tensor, noises: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        means, log_stds = self.net(states).chunk(2, dim=-1)
        return reparameterize(means, log_stds.clamp_(-20, 2), noises)  # CULPRIT


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    states = torch.randn(4, 3, generator=g)
    noises = torch.randn(4, 2, generator=g)
    return StateDependentPolicy((3,), (2,)), (states, noises)
