"""The other fix named in X-GenGroup/Flow-Factory#186 for a reference policy swapped into the
policy's module inside one `torch.autocast` region: `torch.autocast(..., cache_enabled=False)`.
Without the weight-cast cache every forward casts the weights it finds, so the reference
forward sees the swapped-in reference weights and the KL penalty is right. Must stay clean.

Source: https://github.com/X-GenGroup/Flow-Factory/pull/186
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

KIND = "legal"
FIXABLE = True
SOURCE = "https://github.com/X-GenGroup/Flow-Factory/pull/186"
CATEGORY = "autocast"


class PolicyWithReference(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.policy = nn.Linear(4, 3)
        self.register_buffer("ref_weight", torch.randn(3, 4) * 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
            logits = self.policy(x)
            current = self.policy.weight.detach().clone()
            self.policy.weight.data.copy_(self.ref_weight)
            with torch.no_grad():
                ref_logits = self.policy(x)
            self.policy.weight.data.copy_(current)
        logp = F.log_softmax(logits.float(), dim=-1)
        ref_logp = F.log_softmax(ref_logits.float(), dim=-1)
        return (logp.exp() * (logp - ref_logp)).sum(-1).mean()


def make() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return PolicyWithReference(), (torch.randn(5, 4, generator=g),)
