"""The fix of X-GenGroup/Flow-Factory#186 for a reference policy swapped into the policy's
module with `param.data.copy_`: one `torch.autocast` region per forward. Leaving a region
drops autocast's weight-cast cache, so the reference forward casts the swapped-in weights
afresh, and the KL penalty against the reference is right. The `.data` swaps change no value
that autograd saved (the policy's forward saved its own low-precision cast), so the gradients
are right too. Must stay clean.

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
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = self.policy(x)
        current = self.policy.weight.detach().clone()
        self.policy.weight.data.copy_(self.ref_weight)
        with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
            ref_logits = self.policy(x)
        self.policy.weight.data.copy_(current)
        logp = F.log_softmax(logits.float(), dim=-1)
        ref_logp = F.log_softmax(ref_logits.float(), dim=-1)
        return (logp.exp() * (logp - ref_logp)).sum(-1).mean()


def make() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return PolicyWithReference(), (torch.randn(5, 4, generator=g),)
