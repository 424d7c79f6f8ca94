"""An RL fine-tuning loss with a KL penalty against a reference policy that shares the
policy's module: inside one `torch.autocast` region the policy runs, the reference weights are
swapped into the same parameter (`param.data.copy_(ref)`), the reference runs, and the policy
weights are swapped back. Autocast caches the low-precision cast of each weight for the whole
region, keyed by the tensor, and cannot see a `.data` write: the "reference" forward reuses the
policy's cached cast, the reference log-probabilities equal the policy's, and the KL term (and
its gradient) collapses to 0. Nothing raises. The project's fix opens one autocast region per
forward; `cache_enabled=False` works too.

Source: https://github.com/X-GenGroup/Flow-Factory/pull/186
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

KIND = "silent"
FIXABLE = False
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
            self.policy.weight.data.copy_(self.ref_weight)  # CULPRIT
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
