"""MoCo's forward mixes several legal in-place idioms: the key encoder is updated by momentum under
`torch.no_grad()` (`param_k.mul_(self.m).add_(param_q.mul(1. - self.m))`, its parameters have
`requires_grad = False`), the queue buffer is overwritten under `no_grad` after a detached clone of it was
used, and the logits are divided in place, `logits /= self.T`, after `torch.cat`, which saves nothing.
Encoders are single linear layers; the DDP shuffle and all_gather are left out.

Source: https://github.com/facebookresearch/moco/blob/4397a04ed63a95c4a157f017a71883944003b615/moco/builder.py
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "legal"
FIXABLE = True
SOURCE = "https://github.com/facebookresearch/moco/blob/4397a04ed63a95c4a157f017a71883944003b615/moco/builder.py"


class MoCo(nn.Module):
    def __init__(self, dim: int = 3, K: int = 4, m: float = 0.999, T: float = 0.07) -> None:
        super().__init__()

        self.K = K
        self.m = m
        self.T = T

        # create the encoders
        self.encoder_q = nn.Linear(5, dim)
        self.encoder_k = nn.Linear(5, dim)

        for param_q, param_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters(), strict=True):
            param_k.data.copy_(param_q.data)  # initialize
            param_k.requires_grad = False  # not update by gradient

        # create the queue
        self.register_buffer("queue", torch.randn(dim, K))
        self.queue = nn.functional.normalize(self.queue, dim=0)

        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def _momentum_update_key_encoder(self) -> None:
        """Momentum update of the key encoder."""
        for param_q, param_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters(), strict=True):
            param_k.mul_(self.m).add_(param_q.mul(1.0 - self.m))

    @torch.no_grad()
    def _dequeue_and_enqueue(self, keys: torch.Tensor) -> None:
        batch_size = keys.shape[0]

        ptr = int(self.queue_ptr)
        assert self.K % batch_size == 0  # for simplicity

        # replace the keys at ptr (dequeue and enqueue)
        self.queue[:, ptr : ptr + batch_size] = keys.T
        ptr = (ptr + batch_size) % self.K  # move pointer

        self.queue_ptr[0] = ptr

    def forward(self, im_q: torch.Tensor, im_k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # compute query features
        q = self.encoder_q(im_q)  # queries: NxC
        q = nn.functional.normalize(q, dim=1)

        # compute key features
        with torch.no_grad():  # no gradient to keys
            self._momentum_update_key_encoder()  # update the key encoder

            k = self.encoder_k(im_k)  # keys: NxC
            k = nn.functional.normalize(k, dim=1)

        # positive logits: Nx1
        l_pos = torch.einsum("nc,nc->n", [q, k]).unsqueeze(-1)
        # negative logits: NxK
        l_neg = torch.einsum("nc,ck->nk", [q, self.queue.clone().detach()])

        # logits: Nx(1+K)
        logits = torch.cat([l_pos, l_neg], dim=1)

        # apply temperature
        logits /= self.T

        # labels: positive key indicators
        labels = torch.zeros(logits.shape[0], dtype=torch.long)

        # dequeue and enqueue
        self._dequeue_and_enqueue(k)

        return logits, labels


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return MoCo(), (torch.randn(2, 5, generator=g), torch.randn(2, 5, generator=g))
