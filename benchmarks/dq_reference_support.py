"""Running Degree-Quant's reference code (camlsys/degree-quant) next to fxquant.

The reference is not part of this repository: :func:`load_reference` imports its ``dq``
package from a checkout named by ``$FXQUANT_DQ_REFERENCE`` (commit 257d6bc; get it with
``git clone https://github.com/camlsys/degree-quant && git -C degree-quant checkout
257d6bc``). What is here is ours:

- :func:`install_scatter_shim`: the reference imports ``torch_scatter``; where that
  compiled package is missing, a small module of the four functions it calls
  (``scatter_add/mean/max/min``) over :func:`torch_geometric.utils.scatter` stands in.
- :class:`ReferenceGCN`: PyG's ``gcn.py`` model (dropout 0.5, two layers, ReLU) built from
  the reference's ``GCNConvMultiQuant``, with one protection mask per layer drawn from the
  reference's in-degree probabilities (``ProbabilisticHighDegreeMask``), and
  :func:`copy_gcn_weights` to start it from the weights of ``experiments/train_cora.py``'s
  GCN (PyG's ``GCNConv`` keeps ``lin.weight`` as ``[out, in]``, the reference ``[in, out]``).
- :func:`reference_quantizers`: the reference's quantizer dictionaries, as its
  ``reddit_binary/gin.py`` builds them (``IntegerQuantizer`` for the "low" keys, FP32 for
  the "high" keys that protected nodes take).
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch_geometric.utils import scatter

__all__ = [
    "ENV",
    "REFERENCE_COMMIT",
    "RefQuant",
    "Reference",
    "ReferenceGCN",
    "copy_gcn_weights",
    "degree_probabilities",
    "install_scatter_shim",
    "load_reference",
    "reference_path",
    "reference_quantizers",
    "scatter_shim",
]

#: The environment variable naming the checkout.
ENV = "FXQUANT_DQ_REFERENCE"
#: The commit the benchmark was written against.
REFERENCE_COMMIT = "257d6bc"


def _scatter_fn(reduce: str, with_arg: bool) -> Callable[..., Any]:
    def fn(src: Tensor, index: Tensor, dim: int = -1, out: Tensor | None = None,
           dim_size: int | None = None, fill_value: float | None = None) -> Any:
        if out is not None:
            raise NotImplementedError("the torch_scatter stand-in does not take out=")
        result = scatter(src, index, dim=dim, dim_size=dim_size, reduce=reduce)
        return (result, None) if with_arg else result  # (values, argument): only values used

    fn.__name__ = f"scatter_{'add' if reduce == 'sum' else reduce}"
    return fn


def scatter_shim() -> types.ModuleType:
    """A module standing in for ``torch_scatter``: ``scatter_add``, ``scatter_mean``,
    ``scatter_max`` and ``scatter_min`` over :func:`torch_geometric.utils.scatter` (the last
    two return ``(values, None)``: the reference reads only the values). Not installed.

    Example:
        >>> shim = scatter_shim()
        >>> shim.scatter_add(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0, 0, 2]), 0,
        ...                  dim_size=4)
        tensor([3., 0., 3., 0.])
    """
    shim = types.ModuleType("torch_scatter")
    shim.__dict__.update(
        __fxquant_shim__=True,
        scatter_add=_scatter_fn("sum", False),
        scatter_mean=_scatter_fn("mean", False),
        scatter_max=_scatter_fn("max", True),
        scatter_min=_scatter_fn("min", True),
    )
    return shim


def install_scatter_shim() -> str:
    """Make ``import torch_scatter`` work: the compiled package if it imports, else
    :func:`scatter_shim` put into ``sys.modules``. Returns ``"torch_scatter"`` or
    ``"shim"``."""
    current = sys.modules.get("torch_scatter")
    if current is not None:
        return "shim" if getattr(current, "__fxquant_shim__", False) else "torch_scatter"
    try:
        importlib.import_module("torch_scatter")
        return "torch_scatter"
    except ImportError:
        pass
    sys.modules["torch_scatter"] = scatter_shim()
    return "shim"


@dataclass
class Reference:
    """The reference's modules, imported from a checkout."""

    path: Path
    commit: str | None
    scatter: str  # "torch_scatter" or "shim"
    multi_quant: types.ModuleType
    quantization: types.ModuleType
    transforms: types.ModuleType


def reference_path(path: str | os.PathLike[str] | None = None) -> Path | None:
    """The checkout named by ``path`` or ``$FXQUANT_DQ_REFERENCE`` if it holds
    ``dq/multi_quant.py``, else None."""
    where = path if path is not None else os.environ.get(ENV)
    if not where:
        return None
    root = Path(where).expanduser()
    return root if (root / "dq" / "multi_quant.py").is_file() else None


def _commit(root: Path) -> str | None:
    head = root / ".git"
    try:
        if head.is_file():  # a worktree: "gitdir: <path>"
            head = Path(head.read_text().split(":", 1)[1].strip())
        ref = (head / "HEAD").read_text().strip()
        if ref.startswith("ref:"):
            ref = (head / ref.split(" ", 1)[1]).read_text().strip()
        return ref
    except (OSError, IndexError):
        return None


def load_reference(path: str | os.PathLike[str] | None = None) -> Reference:
    """Import the reference's ``dq`` package from a checkout (``path`` or
    ``$FXQUANT_DQ_REFERENCE``).

    Raises:
        FileNotFoundError: neither names a folder holding ``dq/multi_quant.py``.
    """
    root = reference_path(path)
    if root is None:
        raise FileNotFoundError(
            f"no Degree-Quant reference checkout: set {ENV} to a clone of "
            f"https://github.com/camlsys/degree-quant at commit {REFERENCE_COMMIT} (the folder "
            f"holding dq/multi_quant.py); got {path or os.environ.get(ENV)!r}")
    scatter_kind = install_scatter_shim()
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    modules = {name: importlib.import_module(f"dq.{name}")
               for name in ("multi_quant", "quantization", "transforms")}
    loaded = Path(modules["multi_quant"].__file__ or "").resolve().parent.parent
    if loaded != root.resolve():
        raise ImportError(f"a different 'dq' package is already imported (from {loaded}); "
                          f"please run the benchmark in a fresh process")
    return Reference(root, _commit(root), scatter_kind, **modules)


@dataclass(frozen=True)
class RefQuant:
    """One row's quantizer settings on the reference side.

    Args:
        bits (int or None): 8 or 4; None: FP32 (``nn.Identity`` everywhere).
        percentile (float or None): the reference's ``percentile`` (a fraction: 0.001 is
            the 0.1th to 99.9th percentile, by ``kthvalue``); None: min/max.
        momentum (bool): ``use_momentum``: an EMA with momentum 0.01 (1% new) instead of
            the running min/max (PyTorch's ``MinMaxObserver``).
        ste (bool): straight-through gradient; False: zero gradient where the value
            is clipped ("GC").
    """

    bits: int | None
    percentile: float | None = 0.001
    momentum: bool = False
    ste: bool = False

    def mode(self) -> str:
        """The reference's own name: ``GC-PER``, ``STE-MOM``, ..."""
        if self.bits is None:
            return "FP32"
        kind = "PER" if self.percentile is not None else "MOM" if self.momentum else "ABS"
        return f"{'STE' if self.ste else 'GC'}-{kind}"


def reference_quantizers(ref: Reference, q: RefQuant, signed_input: bool = False
                         ) -> tuple[dict[str, Callable[[], nn.Module]],
                                    dict[str, Callable[[], nn.Module]]]:
    """``(layer_quantizers, mp_quantizers)`` for ``GCNConvMultiQuant``: the "low" keys
    quantize, the "high" keys (protected nodes) stay FP32, as the reference's
    ``make_quantizers(dq=True)`` sets them."""

    def low(signed: bool = True) -> Callable[[], nn.Module]:
        if q.bits is None:
            return nn.Identity
        bits = q.bits
        return lambda: ref.quantization.IntegerQuantizer(
            bits, signed=signed, use_momentum=q.momentum, use_ste=q.ste,
            percentile=q.percentile)

    layer = {"weights_low": low(), "inputs_low": low(signed_input), "inputs_high": nn.Identity,
             "features_low": low(), "features_high": nn.Identity, "norm_low": low()}
    mp = {"message_low": low(), "message_high": nn.Identity, "update_low": low(),
          "update_high": nn.Identity, "aggregate_low": low(), "aggregate_high": nn.Identity}
    return layer, mp


class ReferenceGCN(nn.Module):
    """PyG's ``gcn.py`` GCN built from the reference's ``GCNConvMultiQuant``.

    Each layer draws its own protection mask in training (the reference's per-layer
    choice: "for other experiments we used a per-layer mask", ``reddit_binary/gin.py``)
    from ``prob_mask``, with ``generator`` so that the dropout masks, which come from the
    global generator, are the same draws as in a model without protection.

    Args:
        ref (Reference): the imported reference.
        q (RefQuant): the quantizers.
        in_channels, hidden_channels, out_channels (int): sizes.
        prob_mask (Tensor, optional): each node's protection probability; None: no node
            is protected. (default: :obj:`None`)
        generator (torch.Generator, optional): draws the masks. (default: :obj:`None`)
    """

    def __init__(self, ref: Reference, q: RefQuant, in_channels: int, hidden_channels: int,
                 out_channels: int, prob_mask: Tensor | None = None,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        conv = ref.multi_quant.GCNConvMultiQuant
        lq_in, mq = reference_quantizers(ref, q, signed_input=False)
        lq_hidden, _ = reference_quantizers(ref, q, signed_input=False)  # after a ReLU
        self.conv1 = conv(in_channels, hidden_channels, cached=True, layer_quantizers=lq_in,
                          mp_quantizers=mq)
        self.conv2 = conv(hidden_channels, out_channels, cached=True,
                          layer_quantizers=lq_hidden, mp_quantizers=mq)
        self.prob_mask = prob_mask
        self.generator = generator
        self.dropout = nn.Dropout(0.5)  # F.dropout(x, 0.5, self.training), as a module

    def _mask(self, n: int, device: torch.device) -> Tensor:
        if not self.training or self.prob_mask is None:
            return torch.zeros(n, dtype=torch.bool, device=device)
        return torch.bernoulli(self.prob_mask, generator=self.generator).to(torch.bool)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        x = self.dropout(x)
        x = self.conv1(x, edge_index, self._mask(x.shape[0], x.device)).relu()
        x = self.dropout(x)
        return self.conv2(x, edge_index, self._mask(x.shape[0], x.device))


def copy_gcn_weights(source: nn.Module, target: ReferenceGCN) -> None:
    """Copy ``experiments/train_cora.py``'s GCN weights (PyG ``GCNConv``: ``lin.weight`` is
    ``[out, in]``) into :class:`ReferenceGCN` (``weight`` is ``[in, out]``)."""
    with torch.no_grad():
        for name in ("conv1", "conv2"):
            src, dst = getattr(source, name), getattr(target, name)
            dst.weight.copy_(src.lin.weight.t())
            dst.bias.copy_(src.bias)


def degree_probabilities(ref: Reference, data: Any, p_min: float, p_max: float) -> Tensor:
    """Each node's protection probability, by the reference's ``ProbabilisticHighDegreeMask``
    (on a shallow copy of ``data``)."""
    graph = data.clone()
    ref.transforms.ProbabilisticHighDegreeMask(p_min, p_max)(graph)
    return graph.prob_mask.to(torch.float32)
