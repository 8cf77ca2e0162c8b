"""Device checks of the Python layer: every tensor an op reads must sit on one device.

The core works on the device of its arrays (CPU or one CUDA device) and never moves data between
devices; a call that mixes devices is refused here, before anything reaches the core, with
``[op] <arg>: expected a tensor on <device>, got <other>`` (ValueError). The expected device is the
one of the op's primary input (the features of a SparseTensor, the points of a point op, ...).
"""
from __future__ import annotations

from typing import Any, Optional, Union

import torch

DeviceLike = Union[str, int, torch.device]


def device_name(d: torch.device) -> str:
    """``cpu`` or ``cuda:<index>`` (a bare ``cuda`` resolves to the current device)."""
    if d.type == "cuda" and d.index is None:
        return f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cuda:0"
    return str(d)


def same_device(a: torch.device, b: torch.device) -> bool:
    if a == b and (a.type == "cpu" or a.index is not None):  # the common case: no name to build
        return True
    return device_name(a) == device_name(b)


def check_device(op: str, what: str, value: Any, expected: torch.device) -> None:
    """Raises ``[op] what: expected a tensor on <expected>, got <device>`` when ``value`` (a tensor,
    a SparseTensor, or None/anything else: ignored) lives on another device."""
    d: Optional[torch.device] = None
    if value is None:
        return
    if isinstance(value, torch.Tensor):
        d = value.device
    elif hasattr(value, "_feats") and hasattr(value, "_cs"):  # SparseTensor (no import cycle)
        d = value.device
    if d is None or same_device(d, expected):
        return
    raise ValueError(f"[{op}] {what}: expected a tensor on {device_name(expected)}, got {device_name(d)}")


def check_devices(op: str, expected: torch.device, **values: Any) -> None:
    """:func:`check_device` for every keyword (argument name -> tensor / SparseTensor / None)."""
    for what, v in values.items():
        check_device(op, what, v, expected)


def as_device(value: DeviceLike, op: str = "SparseTensor.to") -> torch.device:
    """A torch.device from ``"cuda"``, ``"cuda:1"``, ``"cpu"``, an int (CUDA index) or a device."""
    if isinstance(value, bool):
        raise TypeError(f"[{op}] device: expected a device (str, int or torch.device), got bool")
    if isinstance(value, int):
        return torch.device("cuda", value)
    if isinstance(value, (str, torch.device)):
        try:
            d = torch.device(value)
        except RuntimeError as exc:
            raise ValueError(f"[{op}] device: expected 'cpu', 'cuda' or 'cuda:<index>', got {value!r}") from exc
        if d.type not in ("cpu", "cuda"):
            raise ValueError(f"[{op}] device: expected 'cpu', 'cuda' or 'cuda:<index>', got {value!r}")
        if d.type == "cuda" and d.index is None:
            d = torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)
        return d
    raise TypeError(f"[{op}] device: expected a device (str, int or torch.device), got {type(value).__name__}")
