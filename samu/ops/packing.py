"""Packed sequences (``cu_seqlens``): N documents laid end to end along L of a batch-1 input, as
flash-linear-attention packs them. ``cu_seqlens`` is an int32 (or int64) tensor [N + 1] of offsets, 0 first
and L last, each document at least one token long.

A packed call is exactly the concatenation of one call per document, each from its own initial state
(row n of an [N, D] state, zeros when it is None), and its final states are stacked [N, D]: that is how
every backend runs it today (each document through the op's own dispatch); no state and no Conv1D window
crosses a boundary.
"""

from __future__ import annotations

import torch


def sequence_offsets(cu_seqlens, x: torch.Tensor, name: str = "cu_seqlens") -> list[int]:
    """The offsets of ``cu_seqlens`` as ints, checked against x [1, L, ...]: a ValueError/TypeError naming it."""
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype not in (torch.int32, torch.int64) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"{name} must be an int32 tensor [N + 1] of offsets (N >= 1), got {cu_seqlens.dtype} "
                         f"with shape {list(cu_seqlens.shape)}")
    if x.shape[0] != 1:
        raise ValueError(f"{name} packs sequences along L of a batch-1 input; got a batch of {x.shape[0]}")
    offsets = [int(v) for v in cu_seqlens.tolist()]
    L = x.shape[1]
    if offsets[0] != 0 or offsets[-1] != L or any(b <= a for a, b in zip(offsets, offsets[1:])):
        raise ValueError(f"{name} must rise strictly from 0 to L = {L} (every sequence at least one token), "
                         f"got {offsets if len(offsets) <= 12 else offsets[:6] + ['...'] + offsets[-6:]}")
    return offsets


def state_row(state, n: int):
    """Row n of a per-sequence state [N, ...] as a batch of one, or None."""
    return None if state is None else state[n:n + 1]
