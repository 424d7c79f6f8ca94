"""The policy from the same repository as crash_12: `build_mlp` places one shared `nn.ReLU(inplace=True)`
(the default argument of StateDependentPolicy) after every hidden Linear, and `forward` returns
`torch.tanh(self.net(states).chunk(2, dim=-1)[0])`. Linear saves its input, not its output, and the chunk
view is only read, so this path is legal; only `sample`'s `log_stds.clamp_` raises.

Source: https://github.com/toshikwa/gail-airl-ppo.pytorch/issues/13
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "legal"
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

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.net(states).chunk(2, dim=-1)[0])


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return StateDependentPolicy((3,), (2,)), (torch.randn(4, 3, generator=g),)
