"""PyG's `SparseTensor` is not a `torch.Tensor`, so `register_buffer` refuses it and `model.cuda()` does not
move it; the maintainer's answer is to put it into the buffer dictionary directly, `self._buffers['spa'] =
spa`. A layer propagating over such an `adj_t` with `torch_sparse.matmul` and an in-place `relu_` on the
result (legal: the sparse product saves the adjacency and the features, not its output).

Source: https://github.com/rusty1s/pytorch_sparse/issues/168
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "legal"
FIXABLE = True
SOURCE = "https://github.com/rusty1s/pytorch_sparse/issues/168"
CATEGORY = "sparse"
REQUIRES = ("torch_sparse",)


class Model(nn.Module):
    def __init__(self, spa: object) -> None:
        super().__init__()
        self._buffers["adj_t"] = spa
        self.w = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torch_sparse

        h = torch_sparse.matmul(self.adj_t, self.w(x))
        h.relu_()
        return h


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    from torch_sparse import SparseTensor

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    a = torch.rand(4, 4, generator=g)
    a[a < 0.5] = 0
    return Model(SparseTensor.from_dense(a)), (torch.randn(4, 3, generator=g),)
