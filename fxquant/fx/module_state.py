"""What a symbolic trace must leave as it found it, and how a traced forward keeps the
buffer updates its Python makes.

Tracing runs a forward's Python. With buffers read as graph values (``get_attr`` nodes,
see :class:`~fxquant.fx.tracer.GNNTracer`), an in-place update (``self.ema.mul_(m)``,
``self.buf.copy_(x)``) is recorded as a node and runs on the real buffer only when the
traced model runs. A rebinding (``self.count += 1``, ``self.ema = m * self.ema + ...``)
puts a traced value into the module's buffer table; the trace turns it into a
:func:`write_buffer` node at the end of the graph, which writes the new value into the
buffer in place, so that eager runs, ``deepcopy``, pickling, ``state_dict`` and
``torch.compile`` all keep the update. :class:`ModuleState` puts every module's
attributes, parameters, buffers and submodules (by identity) and every tensor's values
back after each trace, also when it fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.fx import Proxy
from torch.fx.node import has_side_effect

from fxquant.errors import FxquantRuntimeError

__all__ = ["ModuleState", "Rebound", "StateChanges", "write_buffer"]

_TABLES = ("_parameters", "_buffers", "_modules")


@has_side_effect
def write_buffer(buffer: Tensor, value: Tensor) -> Tensor:
    """Write ``value`` into ``buffer`` in place: what a traced model does where its
    forward rebinds a buffer (``self.count += 1``). The new value must have the buffer's
    shape, dtype and device: an in-place write cannot change them, where the rebinding did
    (the traced model would silently keep a different buffer).

    Example:
        >>> count = torch.zeros((), dtype=torch.long)
        >>> _ = write_buffer(count, count + 1)
        >>> count
        tensor(1)
    """
    if isinstance(buffer, Proxy) or isinstance(value, Proxy):  # a GraphModule re-traced
        tracer = (buffer if isinstance(buffer, Proxy) else value).tracer
        return tracer.create_proxy("call_function", write_buffer, (buffer, value), {})
    if not isinstance(value, Tensor) or value.shape != buffer.shape \
            or value.dtype != buffer.dtype or value.device != buffer.device:
        got = (f"{value.dtype} of shape {tuple(value.shape)} on {value.device}"
               if isinstance(value, Tensor) else type(value).__name__)
        raise FxquantRuntimeError(
            f"fxquant: forward assigns a buffer of {buffer.dtype} and shape "
            f"{tuple(buffer.shape)} on {buffer.device} a new value ({got}); the traced model "
            "writes buffer updates in place, which cannot change a buffer's shape, dtype or "
            "device. Please give the new value the buffer's (e.g. `.to(self.buf.dtype)`).")
    return buffer.copy_(value)


@dataclass
class Rebound:
    """A buffer the forward rebound: where, the buffer it replaced, and the new value."""

    qualname: str
    original: Tensor
    value: Any


@dataclass
class StateChanges:
    """What a traced forward changed (all of it already put back)."""

    #: buffers rebound (``self.count += 1``), with their new (traced) value
    rebound: list[Rebound] = field(default_factory=list)
    #: module attributes (not buffers) rebound to traced values: cannot be recorded
    assigned: list[str] = field(default_factory=list)
    #: tensors (buffers, parameters, plain attributes) whose values changed in place
    written: list[str] = field(default_factory=list)
    #: of ``written``, those that are plain tensor attributes (read as constants)
    plain: list[str] = field(default_factory=list)


def _same_bits(a: Tensor, b: Tensor) -> bool:
    """Equal bit for bit (NaN equal to NaN)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.device.type == "meta":
        return True
    if a.layout != torch.strided:
        return torch.equal(a.to_dense(), b.to_dense())
    if a.is_floating_point() or a.is_complex():
        return torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                           b.contiguous().reshape(-1).view(torch.uint8))
    return torch.equal(a, b)


def _layout(t: Tensor) -> tuple[Any, ...]:
    if t.layout != torch.strided:  # sparse layouts have no strides (CSR/CSC) nor storage
        return (tuple(t.shape), t.layout, t.dtype)
    if t.device.type == "meta":
        return (tuple(t.shape), t.stride(), t.dtype)
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(),
            t.dtype)


class ModuleState:
    """A snapshot of ``model``: each submodule's attributes and its parameter, buffer and
    submodule tables (by identity), and each tensor's values. :meth:`restore` puts them
    back and says what had changed.

    Args:
        model (torch.nn.Module): the model.
        keep (tuple of str, optional): attributes :meth:`restore` leaves as they are
            (e.g. ``"training"``, when the caller sets modes between restores).
            (default: :obj:`()`)

    Example:
        >>> lin = nn.Linear(2, 2)
        >>> state = ModuleState(lin)
        >>> with torch.no_grad():
        ...     _ = lin.weight.add_(1)
        >>> state.restore().written
        ['weight']
    """

    def __init__(self, model: nn.Module, keep: tuple[str, ...] = ()) -> None:
        self.model = model
        self.keep = frozenset(keep)
        self.modules: list[tuple[str, nn.Module, dict[str, Any], dict[str, dict[str, Any]],
                                 set[str]]] = []
        self.tensors: dict[int, tuple[str, Tensor, Tensor, tuple[Any, ...], Tensor, bool,
                                      bool]] = {}
        seen: set[int] = set()
        for name, m in model.named_modules(remove_duplicate=False):
            if id(m) in seen:
                continue
            seen.add(id(m))
            tables = {t: dict(getattr(m, t)) for t in _TABLES if isinstance(
                vars(m).get(t), dict)}
            persistent = set(getattr(m, "_non_persistent_buffers_set", ()))
            self.modules.append((name, m, dict(vars(m)), tables, persistent))
            prefix = f"{name}." if name else ""
            plain = {k: v for k, v in vars(m).items() if isinstance(v, Tensor)}
            for table, is_plain in ((tables.get("_parameters", {}), False),
                                    (tables.get("_buffers", {}), False), (plain, True)):
                for key, t in table.items():
                    if isinstance(t, Tensor) and id(t) not in self.tensors:
                        with torch.no_grad():
                            values = t.detach().clone()
                        self.tensors[id(t)] = (prefix + key, t, t.data, _layout(t), values,
                                               t.requires_grad, is_plain)

    def restore(self) -> StateChanges:
        """Put everything back; what had changed (see :class:`StateChanges`)."""
        changes = StateChanges()
        for name, m, saved, tables, non_persistent in self.modules:
            prefix = f"{name}." if name else ""
            current = vars(m)
            for key in [k for k in current if k not in saved]:
                if isinstance(current[key], Proxy):
                    changes.assigned.append(f"{name}.{key}" if name else f"self.{key}")
                del current[key]
            for key, value in saved.items():
                if key in self.keep:
                    continue
                if key not in current or current[key] is not value:
                    if isinstance(current.get(key), Proxy):
                        changes.assigned.append(f"{name}.{key}" if name else f"self.{key}")
                    current[key] = value
            for table_name, contents in tables.items():
                table = current[table_name]
                if table_name == "_buffers":
                    for key, value in table.items():
                        original = contents.get(key)
                        if value is not original and isinstance(original, Tensor):
                            changes.rebound.append(Rebound(prefix + key, original, value))
                        elif value is not original:  # a buffer registered in forward
                            changes.assigned.append(prefix + key)
                if table.keys() != contents.keys() or any(
                        table[k] is not v for k, v in contents.items()):
                    table.clear()
                    table.update(contents)
            nps = getattr(m, "_non_persistent_buffers_set", None)
            if isinstance(nps, set) and nps != non_persistent:
                nps.clear()
                nps.update(non_persistent)
        with torch.no_grad():
            for qualname, t, data, layout, values, requires_grad, is_plain in \
                    self.tensors.values():
                moved = _layout(t) != layout
                if moved:  # t.data = ..., t.set_(...): back onto its own storage
                    t.data = data
                if not _same_bits(data, values):
                    data.copy_(values)
                elif not moved:
                    continue
                changes.written.append(qualname)
                if is_plain:
                    changes.plain.append(qualname)
                if t.is_leaf and t.requires_grad != requires_grad:
                    t.requires_grad_(requires_grad)
        return changes
