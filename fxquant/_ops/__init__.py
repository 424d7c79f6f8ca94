"""fxquant's registered ops (``torch.ops.fxquant.truncate``, ``quantize``, ``dropout``) and kernels.

Importing this package registers the ops with ``torch.library`` (their CPU/CUDA kernels,
fake kernels for meta tensors and compile, autograd and inductor decompositions). It
knows nothing of torch.fx: graphs and models live in :mod:`fxquant.fx` and above.
"""

from fxquant._ops import dropout, quantize, truncate
from fxquant._ops.calls import OpCall, op_call
from fxquant._ops.version import NUMERICS

__all__ = ["NUMERICS", "OpCall", "dropout", "op_call", "quantize", "truncate"]
