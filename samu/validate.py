"""Checks of plain arguments (counts, rates, sizes, devices): a ValueError that names the argument,
or the value.

One wording everywhere: "<name> must be a positive integer, got 0". The CLI passes name=None and
argparse puts the flag in front ("argument --steps: must be a positive integer, got 0").
"""

from __future__ import annotations

import math


def _fail(name: str | None, what: str, value):
    raise ValueError(f"{name + ' ' if name else ''}must be {what}, got {value!r}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def positive_int(name: str | None, value) -> int:
    """``value`` if it is an int >= 1."""
    if not _is_int(value) or value < 1:
        _fail(name, "a positive integer", value)
    return value


def nonneg_int(name: str | None, value) -> int:
    """``value`` if it is an int >= 0."""
    if not _is_int(value) or value < 0:
        _fail(name, "a non-negative integer", value)
    return value


def finite_number(name: str | None, value, *, positive: bool = False) -> float:
    """``value`` if it is a finite int or float, >= 0 (> 0 when ``positive``)."""
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value < 0 or (positive and value == 0)):
        _fail(name, f"a finite number {'>' if positive else '>='} 0", value)
    return value


def cpu_or_cuda(text):
    """``torch.device(text)`` when it names the CPU or a CUDA device, else None (samu runs on those
    two; other torch devices such as mps, xpu or meta are refused by the callers, in their words)."""
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, TypeError):
        return None
    return device if device.type in ("cpu", "cuda") else None
