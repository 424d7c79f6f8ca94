"""Quantization points saved by fxquant 0.9.8 and earlier, whose learned step, per-node
widths and node override were the point's own parameters and buffers (``<point>.log_step``,
``<point>.row_bits``, ...): their state dicts and pickles load into today's parts."""

from __future__ import annotations

from typing import Any

from torch import nn

from fxquant.quant.config import QuantConfig
from fxquant.quant.learned_step import LearnedStep
from fxquant.quant.node_widths import NodeWidths
from fxquant.quant.override import NodeOverride
from fxquant.quant.override_mask import OverrideMask
from fxquant.quant.protective_mask import ProtectiveMask

__all__ = ["LEGACY_KEYS", "upgrade_pickled_point", "upgrade_point_keys"]

#: state_dict keys of a point before its parts (0.9.8 and earlier) -> today's
LEGACY_KEYS = {
    "log_step": "learned_step.log_step",
    "step_is_fitted": "learned_step.step_is_fitted",
    "row_bits": "node_widths.bits",
    "row_bits_table": "node_widths.bits",
    "seen_range": "node_widths.seen_range",
    "override_nodes": "override.nodes",
}


def upgrade_point_keys(state_dict: dict[str, Any], prefix: str) -> None:
    """Move a point's state saved under the keys of 0.9.8 and earlier (``prefix +
    "log_step"``, ``"row_bits"``, ...: :data:`LEGACY_KEYS`) to today's, in place."""
    for old, new in LEGACY_KEYS.items():
        if prefix + old in state_dict and prefix + new not in state_dict:
            state_dict[prefix + new] = state_dict.pop(prefix + old)


def upgrade_pickled_point(point: nn.Module) -> None:
    """A point unpickled from 0.9.8 or earlier, whose learned step, node widths and override
    were its own parameters and buffers: the same tensors (shared ones stay shared) moved
    into today's parts, and the flags with them."""
    state, params, buffers = point.__dict__, point._parameters, point._buffers
    config: QuantConfig = state["config"]
    log_step = params.pop("log_step", None)
    fitted = buffers.pop("step_is_fitted", None)
    found = buffers.pop("step_found", None)
    step = LearnedStep.from_config(config)
    if step is not None and log_step is not None:
        step.log_step = log_step
        if fitted is not None:
            step.step_is_fitted = fitted
        if found is not None:
            step.step_found = found
        step.step_ready = state.pop("step_ready", False)
        step.refit_widens = state.pop("refit_widens", False)
        step.step_fitted = state.pop("step_fitted", True)  # (before the flag: fitted)
        step.unsettled = bool(state.pop("_unsettled", False))
        step.to(log_step.device)
    for key in ("step_ready", "refit_widens", "step_fitted", "_unsettled"):
        state.pop(key, None)
    widths = NodeWidths.from_config(config)
    learned, table = params.pop("row_bits", None), buffers.pop("row_bits_table", None)
    seen = buffers.pop("seen_range", None)
    if widths is not None:
        if learned is not None:
            widths.bits = learned
        elif table is not None:
            widths.bits = table
        widths.seen_range = seen
        widths.to(widths.bits.device)
    nodes, table_mask = buffers.pop("override_nodes", None), buffers.pop("override_table", None)
    fmt, max_index = state.pop("override_number", None), state.pop("override_max_index", None)
    override = None
    if nodes is not None and fmt is not None:
        override = OverrideMask(NodeOverride(nodes.cpu(), fmt))
        override.nodes = nodes
        override.table = table_mask if table_mask is not None else override.table.to(nodes.device)
        override.max_index = max_index
    state.pop("last_row_bits", None)  # (what the last forward did: not state)
    state["last_widths"] = None
    masks = state.pop("_masks", None)
    protection = ProtectiveMask.from_config(config, state["layer"])
    if protection is not None and masks is not None:
        protection.attach(masks)
    for name, part in (("learned_step", step), ("node_widths", widths), ("override", override),
                       ("protection", protection)):
        setattr(point, name, part)
