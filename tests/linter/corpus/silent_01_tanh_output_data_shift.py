"""GAP's `normalize_and_scale` rescales the generator output through `.data`: `delta_im.data += 1  # now
0..2`, then `*= 0.5`, per-channel normalization and an L-inf clip, all on `.data`. The generator ends in
`nn.Tanh()`, which saved its output for backward, so TanhBackward uses the shifted values and the gradients
reaching the generator are silently wrong (the issue calls them "unexact"). Only the first `.data` write is
kept so that the file has a single culprit; the classifier is a single linear layer.

Source: https://github.com/OmidPoursaeed/Generative_Adversarial_Perturbations/issues/4
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "silent"
FIXABLE = True
SOURCE = "https://github.com/OmidPoursaeed/Generative_Adversarial_Perturbations/issues/4"


def normalize_and_scale(delta_im: torch.Tensor) -> torch.Tensor:
    delta_im.data += 1  # CULPRIT
    return delta_im


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.netG = nn.Sequential(nn.Conv2d(3, 3, 3, padding=1), nn.Tanh())
        self.pretrained_clf = nn.Linear(3 * 4 * 4, 5)

    def forward(self, noise: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        delta_im = self.netG(noise)
        delta_im = normalize_and_scale(delta_im)
        recons = torch.add(image, delta_im)
        return self.pretrained_clf(recons.flatten(1))


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.randn(2, 3, 4, 4, generator=g), torch.randn(2, 3, 4, 4, generator=g))
