"""Grad-CAM style: a full backward hook on a convolution (`register_full_backward_hook`, to grab its output
gradient) followed by `nn.ReLU(inplace=True)`. The hook wraps the convolution's output in a custom autograd
Function's view, which autograd forbids writing in place: the forward raises "Output 0 of
BackwardHookFunctionBackward is a view and is being modified inplace". pytorch-grad-cam moved to forward
hooks because of it. A rewrite must keep the hook running.

Source: https://github.com/pytorch/pytorch/issues/61519
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "crash"
FIXABLE = True
SOURCE = "https://github.com/pytorch/pytorch/issues/61519"
CATEGORY = "hooks"

#: what the hook saw (a rewrite that drops the hook leaves it empty)
FIRED: list[torch.Tensor] = []


class CamNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(True), nn.Conv2d(4, 4, 3))  # CULPRIT
        self.features[0].register_full_backward_hook(lambda m, grad_in, grad_out: FIRED.append(grad_out[0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x).mean((2, 3))


def make() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return CamNet(), (torch.randn(1, 3, 8, 8, generator=g),)

