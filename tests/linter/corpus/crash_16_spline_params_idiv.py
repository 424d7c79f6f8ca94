"""nflows' PiecewiseRationalQuadraticCouplingTransform slices the conditioner output,
`unnormalized_widths = transform_params[..., : self.num_bins]`, and scales the slice in place,
`unnormalized_widths /= np.sqrt(self.transform_net.hidden_features)`. The reporter's conditioner ended in a
ReLU (the error names "output 0 of ReluBackward0, [256, 71]"), so the in-place division of a view of the
saved ReLU output makes backward raise; the fix is `unnormalized_widths = unnormalized_widths / ...`. The
original applies the same `/=` to the heights; that line is written out of place here so that the file has
a single culprit, and the spline itself is replaced by a small differentiable stand-in.

Source: https://github.com/bayesiains/nflows/issues/89
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

KIND = "crash"
FIXABLE = True
SOURCE = "https://github.com/bayesiains/nflows/issues/89"


class ReluNet(nn.Module):
    def __init__(self, in_features: int, out_features: int, hidden_features: int) -> None:
        super().__init__()
        self.hidden_features = hidden_features
        self.net = nn.Sequential(
            nn.Linear(in_features, hidden_features),
            nn.ReLU(),
            nn.Linear(hidden_features, out_features),
            nn.ReLU(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Model(nn.Module):
    def __init__(self, num_bins: int = 3) -> None:
        super().__init__()
        self.num_bins = num_bins
        self.transform_net = ReluNet(1, num_bins * 3 - 1, hidden_features=4)

    def _piecewise_cdf(self, inputs: torch.Tensor, transform_params: torch.Tensor) -> torch.Tensor:
        unnormalized_widths = transform_params[..., : self.num_bins]
        unnormalized_heights = transform_params[..., self.num_bins : 2 * self.num_bins]
        unnormalized_derivatives = transform_params[..., 2 * self.num_bins :]

        if hasattr(self.transform_net, "hidden_features"):
            unnormalized_widths /= np.sqrt(self.transform_net.hidden_features)  # CULPRIT
            unnormalized_heights = unnormalized_heights / np.sqrt(self.transform_net.hidden_features)

        widths = F.softmax(unnormalized_widths, dim=-1)
        heights = F.softmax(unnormalized_heights, dim=-1)
        derivatives = F.softplus(unnormalized_derivatives)
        return inputs * (widths * heights).sum(-1, keepdim=True) + derivatives.sum(-1, keepdim=True)

    def forward(self, identity_split: torch.Tensor, transform_split: torch.Tensor) -> torch.Tensor:
        transform_params = self.transform_net(identity_split)
        return self._piecewise_cdf(transform_split, transform_params)


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.randn(5, 1, generator=g), torch.randn(5, 1, generator=g))
