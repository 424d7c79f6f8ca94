"""A learned step size (LSQ, Esser et al., ICLR 2020): the part of a quantization point
with ``range="lsq"``.

The step ``s`` is set on the first training batch to the step that rounds it with the
least error (:meth:`LearnedStep.fit`; again on the next training batch after
:func:`fxquant.refit_steps`), then learned with the LSQ gradient. The parameter is
``log_step`` (``s = exp(log_step)``, always positive): an adaptive optimizer moves a
parameter by about its learning rate per step whatever its size, so on ``s`` itself Adam's
``lr=0.01`` moved steps of ~0.01 by their own size each iteration and flipped their sign
(a GCN on Cora with 2-bit messages: 66% test accuracy, against 78% with a 10x smaller
step learning rate); in the log domain the same ``lr`` is a ~1% change.

The step is fitted from the batch's finite values; a batch with none leaves it to the
next training batch. Compiled code cannot branch on that: it records what it found
(``step_found``) and eager code settles the flags afterwards (:meth:`LearnedStep.settle`).

State: ``log_step`` (a parameter) and ``step_is_fitted`` (whether the step saved is a
fitted one, not the placeholder 0: a step saved before its first training batch is fitted
by the first training batch after loading).
"""

from __future__ import annotations

import math
from typing import Any, cast

import torch
from torch import Tensor, nn

from fxquant.quant.config import QuantConfig
from fxquant.quant.distributed import all_reduce_, distributed
from fxquant.quant.grads import clamp_inward, finite_grad

__all__ = ["INIT_CANDIDATES", "INIT_SAMPLE", "LearnedStep", "log_step_range"]

#: values (a strided sample) and candidate steps the learned step starts from
INIT_SAMPLE = 1 << 16
INIT_CANDIDATES = 64


def log_step_range(dtype: torch.dtype, top: float) -> tuple[float, float]:
    """The ``log`` of the smallest and largest step a grid whose largest level is ``top``
    may have on values of ``dtype``: steps stay positive (a step of 0 makes ``0 / s``
    NaN) and ``s * top`` finite (an infinite step makes ``inf * 0`` NaN), whatever an
    optimizer does to ``log_step``."""
    info = torch.finfo(dtype if dtype.is_floating_point else torch.float32)
    return math.log(info.tiny), math.log(info.max) - math.log(top + 1.0)


class LearnedStep(nn.Module):
    """The learned step of one integer grid, and whether it is fitted yet.

    Example:
        >>> part = LearnedStep.from_config(QuantConfig("int4", scale="tensor", range="lsq"))
        >>> part.fit(torch.linspace(-1, 1, 101), -8, 7)
        >>> round(float(part.step(torch.float32, 7.0)), 4), part.step_fitted
        (0.1389, True)
        >>> LearnedStep.from_config(QuantConfig("int4", scale="tensor")) is None
        True
    """

    step_found: Tensor
    step_is_fitted: Tensor

    def __init__(self) -> None:
        super().__init__()
        self.log_step = nn.Parameter(torch.zeros(()))
        #: whether the last fit found a finite value (written by compiled fits, which
        #: cannot branch on it; :meth:`settle` reads it in eager code)
        self.register_buffer("step_found", torch.ones(()), persistent=False)
        #: whether the step is fitted, as saved in the state dict (written when it is
        #: saved: :attr:`step_fitted` is the flag)
        self.register_buffer("step_is_fitted", torch.zeros(()))
        #: the next training batch needs no fit (fitted, or shared from another point)
        self.step_ready = False
        #: the next fit keeps at least the current step (``refit_steps(widen=True)``)
        self.refit_widens = False
        #: a step has been fitted (or loaded): before that ``log_step`` holds a placeholder
        self.step_fitted = False
        #: a compiled fit ran whose outcome eager code has not read yet
        self.unsettled = False

    @classmethod
    def from_config(cls, config: QuantConfig) -> LearnedStep | None:
        """The part a point with ``config`` needs: one with ``range="lsq"``, else None."""
        return cls() if config.range == "lsq" else None

    # -- the step ----------------------------------------------------------------------

    def step(self, dtype: torch.dtype, top: float) -> Tensor:
        """``exp(log_step)``, clamped to the steps a grid whose largest level is ``top``
        may have on ``dtype`` values (positive, ``s * top`` finite). The gradient reaches
        ``log_step`` outside that range where a descent step moves it back in (a huge
        learning rate must not leave it stuck)."""
        lo, hi = log_step_range(dtype, top)
        return clamp_inward(self.log_step, lo, hi).exp()

    def scaled_step(self, gain: float, dtype: torch.dtype, top: float) -> Tensor:
        """The step, whose gradient is LSQ's scaled by ``gain`` (its value is unchanged)
        and counts no non-finite value (a NaN among the values would make it NaN)."""
        s = finite_grad(self.step(dtype, top))
        return (s - s * gain).detach() + s * gain

    # -- fitting -----------------------------------------------------------------------

    def fit(self, x: Tensor, qmin: float | Tensor, qmax: float | Tensor, offset: float = 0.0,
            widest: float | None = None) -> None:
        """Set the step to the one of :data:`INIT_CANDIDATES` geometric candidates (from
        ``max|x| / 1000`` to ``max|x|``) whose grid ``[qmin, qmax]`` (``offset``: a
        mid-rise grid's) rounds ``x`` with the least squared error, on a strided sample
        of at most :data:`INIT_SAMPLE` values. LSQ's own start, ``2 mean|x| / sqrt(qmax)``,
        is ``2 mean|x|`` on a 2-bit grid: it rounds most values to zero, and a layer's
        output rounded to zero before a ReLU passes no gradient (a GCN on Cora with 2-bit
        aggregation and output stayed at chance). Under DDP the errors are summed over
        ranks first, so every rank starts from the same step. ``widest``: the largest
        level of the widest grid, for a grid given by tensors (per-node bits)."""
        with torch.no_grad():
            v = x.detach().flatten().to(torch.float32)
            # a strided sample (stride 1: all of them); no branch on the size, which
            # compiled code may only know from the data (messages after PyG's self-loops)
            v = v[:: torch.sym_max(1, -(-v.numel() // INIT_SAMPLE))]
            finite = torch.isfinite(v)  # fitted from the finite values only
            v = torch.where(finite, v, 0.0)
            amax = torch.cat([v.new_zeros(1), v.abs()]).amax()  # 0 for an empty batch
            # (an all-zero batch says nothing of the scale either: the next batch fits it)
            found = (finite & (v != 0)).any().to(torch.float32)
            if distributed():
                both = all_reduce_(torch.stack([amax, found]), "max")
                amax, found = both[0], both[1]
            amax = torch.where(amax > 0, amax, torch.ones_like(amax))
            steps = amax * torch.logspace(-3, 0, INIT_CANDIDATES, device=v.device)
            codes = torch.clamp(torch.round(v[None, :] / steps[:, None] - offset),
                                cast(Any, qmin), cast(Any, qmax))
            error = (((codes + offset) * steps[:, None] - v[None, :]).square()
                     * finite[None, :]).sum(1)
            all_reduce_(error, "sum")
            # index_select, not steps[argmin]: traceable without a data-dependent index
            best = steps.index_select(0, torch.argmin(error).reshape(1)).reshape(())
            # (a grid given by tensors, from a mean of per-node bits while compiling: the
            # widest grid's range, which the step is clamped to anyway (:meth:`step`))
            if isinstance(qmin, Tensor) or isinstance(qmax, Tensor):
                assert widest is not None
                top = widest
            else:
                top = float(max(abs(qmin), abs(qmax))) + abs(offset)
            lo, hi = log_step_range(x.dtype, top)
            fitted = best.clamp(min=1e-8).log().clamp(lo, hi).to(self.log_step.dtype)
            if self.refit_widens and self.step_fitted:  # never a narrower grid than the
                fitted = torch.maximum(fitted, self.log_step)  # last fitted or learned one
            # a batch without a finite nonzero value leaves the step as it was
            fitted = torch.where(found > 0, fitted, self.log_step)
            if torch.compiler.is_compiling():
                self.log_step.copy_(fitted)
            else:  # an earlier call of this forward rounded values the step does not
                # change (an empty or all-zero part of a bipartite input, through one
                # point): written without a version bump, its backward stays valid
                self.log_step.data.copy_(fitted)
        # ... and is fitted on the next batch. Compiled code cannot branch on that: it
        # records what it found, and eager code settles the flags (:meth:`settle`; they
        # are neither read nor set here, which would add guards and recompiles)
        if torch.compiler.is_compiling():
            self.step_found.copy_(found)
            self.unsettled = True
            self.step_ready = True
        elif bool(found > 0):
            self.mark_fitted()
        else:
            self.step_ready = False

    def mark_fitted(self) -> None:
        """The step is fitted (or loaded): the next training batches learn it."""
        self.step_ready = True
        self.refit_widens = False
        self.step_fitted = True

    def refit(self, widen: bool = False) -> None:
        """Fit the step again on the next training batch (see :func:`fxquant.refit_steps`)."""
        self.settle()
        self.step_ready = False
        self.refit_widens = widen

    def settle(self) -> bool:
        """After a compiled fit, in eager code: a fit that found values is done; one whose
        batch held no finite nonzero value left the step as it was, which the next
        training batch fits (as in eager code). Returns True for the latter (the point
        may say so), False otherwise."""
        if torch.compiler.is_compiling() or not self.unsettled:
            return False
        self.unsettled = False
        if bool(self.step_found > 0):
            self.mark_fitted()
            return False
        self.step_ready = False
        return True

    def has_step(self) -> bool:
        """Whether ``log_step`` holds a step rather than its placeholder: fitted here, or
        given otherwise (a shared step trained by its source, an averaged copy's
        ``AveragedModel.update_parameters``, a value set by hand: anything but the
        placeholder 0)."""
        if self.step_fitted:
            return True
        step = self.log_step.detach()
        return not step.is_meta and bool(step != 0)

    # -- state -------------------------------------------------------------------------

    def _save_to_state_dict(self, destination: dict[str, Any], prefix: str,
                            keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        self.settle()  # (the flag says it; the buffer only carries it)
        destination[prefix + "step_is_fitted"] = torch.full(
            (), float(self.has_step()), device=self.step_is_fitted.device)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str,
                              local_metadata: dict[str, Any], strict: bool,
                              missing_keys: list[str], *args: Any) -> None:
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict,
                                      missing_keys, *args)
        key = prefix + "step_is_fitted"
        if key not in state_dict and key in missing_keys:
            missing_keys.remove(key)  # saved by an older version, whose steps were fitted
        if prefix + "log_step" in state_dict:
            self.unsettled = False
            flag = state_dict.get(key)
            if not isinstance(flag, Tensor) or flag.is_meta or bool(flag > 0):
                self.mark_fitted()  # a loaded step is not initialized again
            else:  # saved before its first training batch: the next one fits it
                self.step_ready = self.step_fitted = self.refit_widens = False

    def extra_repr(self) -> str:
        return "fitted" if self.step_fitted else "not fitted yet"

