"""A pre-activation block (`ReLU(inplace=True)` then `Linear`) run under a reentrant checkpoint
(`checkpoint(block, h, use_reentrant=True)`). The forward runs; backward re-runs the segment on detached
copies of its inputs, which are leaves that require grad, and the in-place ReLU raises "a leaf Variable
that requires grad is being used in an in-place operation". OpenAI's diffusion code carries its own
checkpoint function with a comment on exactly this ("the first op in run_function modifies the Tensor
storage in place, which is not allowed for detach()'d Tensors").

Source: https://github.com/openai/guided-diffusion/blob/main/guided_diffusion/nn.py
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

KIND = "crash"
FIXABLE = True
SOURCE = "https://github.com/openai/guided-diffusion/blob/main/guided_diffusion/nn.py"
CATEGORY = "container"


class PreActNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(4, 4)
        self.block = nn.Sequential(nn.ReLU(inplace=True), nn.Linear(4, 4))  # CULPRIT

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        return checkpoint(self.block, h, use_reentrant=True)


def make() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return PreActNet(), (torch.randn(3, 4, generator=g),)


def fixed_by_hand() -> nn.Module:
    """The fix: the ReLU out of place (forward-mode AD cannot run through the checkpoint)."""
    model, _ = make()
    model.block[0].inplace = False
    return model
