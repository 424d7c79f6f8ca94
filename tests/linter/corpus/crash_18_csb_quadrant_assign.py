"""TSAN's CSB block sets `out = x` and writes the four quadrants of a 1x1-conv output back into it with
slice assignments, `out[:, :, 0:x.size(2)//2, 0:x.size(3)//2] = f_all[:, 0:f_all.size(1)//4, :, :]` and so on.
`x` is the block input, which the dense branch's convolution saved and which is the output of an in-place
ReLU, so backward raises; the reporter's fix is `out = x.clone()`. The four assignments are folded into one
loop here so that the file has a single culprit line; the dense branch is reduced to one conv.

Source: https://github.com/Jee-King/TSAN/issues/3
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

KIND = "crash"
FIXABLE = True
SOURCE = "https://github.com/Jee-King/TSAN/issues/3"


class CSB(nn.Module):
    def __init__(self, n_feats: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(n_feats * 4, n_feats * 4, kernel_size=1, padding=0, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h2, w2 = x.size(2) // 2, x.size(3) // 2
        f1 = x[:, :, 0:h2, 0:w2]
        f2 = x[:, :, h2:, 0:w2]
        f3 = x[:, :, 0:h2, w2:]
        f4 = x[:, :, h2:, w2:]
        f_all = torch.cat([f1, f2, f3, f4], 1)
        f_all = self.conv1(f_all)
        c = f_all.size(1) // 4
        out = x
        quadrants = [
            (slice(0, h2), slice(0, w2)),
            (slice(h2, None), slice(0, w2)),
            (slice(0, h2), slice(w2, None)),
            (slice(h2, None), slice(w2, None)),
        ]
        for k, (hs, ws) in enumerate(quadrants):
            out[:, :, hs, ws] = f_all[:, k * c : (k + 1) * c, :, :]  # CULPRIT
        return out


class MCAB(nn.Module):
    def __init__(self, n_feats: int) -> None:
        super().__init__()
        self.drb = nn.Conv2d(n_feats, n_feats, kernel_size=1)
        self.csb = CSB(n_feats)
        self.conv3 = nn.Conv2d(n_feats, n_feats, kernel_size=3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        down_b = x + self.drb(x)
        top_b = self.csb(x)
        top_b = F.sigmoid(self.conv3(top_b))
        return down_b * top_b


class Model(nn.Module):
    def __init__(self, n_colors: int = 1, n_feats: int = 2) -> None:
        super().__init__()
        self.first_conv = nn.Conv2d(n_colors, n_feats, 1, padding=0, stride=1)
        self.relu = nn.ReLU(inplace=True)
        self.body1 = MCAB(n_feats)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first_out = self.relu(self.first_conv(x))
        return self.body1(first_out)


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.randn(1, 1, 4, 4, generator=g),)
