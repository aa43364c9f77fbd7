"""Packed sequences (``cu_seqlens``): N documents laid end to end along L of a batch-1 input, as
flash-linear-attention packs them. ``cu_seqlens`` holds the N + 1 offsets, 0 first and L last, each
document at least one token long: an int32 or int64 tensor, or a list of ints (what a model passes its
layers, so that a device tensor is read once, not once per layer).

A packed call is the concatenation of one call per document, each from its own initial state (row n
of an [N, ...] state, zeros when it is None), and its final states are stacked [N, ...]; no state and
no Conv1D window crosses a boundary. The Triton variants that pack (dispatch's ``packs``; their
per-chunk boundary words come from ``packing_triton.chunk_boundaries``) and the block's glue run it in
one call, restarting where a sequence opens; the mixers' other backends run one call per document, each
through the op's own dispatch.

Eagerly, the offsets are read and checked on the host (a synchronisation for a CUDA tensor); a model
reads them once per forward and hands its layers ints (``device_offsets`` makes the kernels' copy once).
Inside torch.compile an int32 device tensor passes unread by the host (its values asserted on the device),
and the call must run in one kernel call; CUDA-graph capture refuses packed calls.
"""

from __future__ import annotations

import torch


def _tracing() -> bool:
    return torch.compiler.is_compiling() or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def sequence_offsets(cu_seqlens, x: torch.Tensor, name: str = "cu_seqlens"):
    """The offsets of ``cu_seqlens`` as ints, checked against x [1, L, ...]: a ValueError/TypeError naming it.

    Inside torch.compile, where the host cannot read values, an int32 tensor on x's device is checked by
    its dtype, shape and device, its values asserted on the device (a bad one fails the next
    synchronisation), and returned as it is; a packed call there must run in one call of a packing kernel
    (or the PyTorch glue), never one call per sequence. A CUDA-graph capture refuses packed calls."""
    if torch.compiler.is_compiling() and isinstance(cu_seqlens, torch.Tensor):
        if (cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2
                or cu_seqlens.device != x.device):
            raise ValueError(f"{name} must be an int32 tensor [N + 1] (N >= 1) on {x.device} inside torch.compile, "
                             f"got {cu_seqlens.dtype} {list(cu_seqlens.shape)} on {cu_seqlens.device}")
        if x.shape[0] != 1:
            raise ValueError(f"{name} packs sequences along L of a batch-1 input; got a batch of {x.shape[0]}")
        # the values on the device, without a synchronisation: offsets beyond the row would index past the
        # kernels' state buffers
        ok = (cu_seqlens[0] == 0) & (cu_seqlens[-1] == x.shape[1]) & (cu_seqlens.diff() > 0).all()
        torch._assert_async(ok, f"{name} must rise strictly from 0 to L = {x.shape[1]}")
        return cu_seqlens
    if _tracing():
        raise ValueError(f"{name}: a packed call reads its offsets on the host (to check them, and to run one call "
                         f"per sequence where no kernel packs), which CUDA-graph capture (and torch.compile, for "
                         f"offsets given as ints) cannot trace; pass an int32 tensor to a compiled model, or run "
                         f"the packed call eagerly")
    if isinstance(cu_seqlens, torch.Tensor):
        if cu_seqlens.dtype not in (torch.int32, torch.int64) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
            raise ValueError(f"{name} must be an int32 or int64 tensor [N + 1] of offsets (N >= 1), got "
                             f"{cu_seqlens.dtype} with shape {list(cu_seqlens.shape)}")
        offsets = [int(v) for v in cu_seqlens.tolist()]
    elif isinstance(cu_seqlens, (list, tuple)) and len(cu_seqlens) >= 2 and all(type(v) is int for v in cu_seqlens):
        offsets = list(cu_seqlens)
    else:
        raise TypeError(f"{name} must be a tensor or a list of N + 1 >= 2 int offsets, got {type(cu_seqlens).__name__}")
    if x.shape[0] != 1:
        raise ValueError(f"{name} packs sequences along L of a batch-1 input; got a batch of {x.shape[0]}")
    L = x.shape[1]
    if offsets[0] != 0 or offsets[-1] != L or any(b <= a for a, b in zip(offsets, offsets[1:])):
        raise ValueError(f"{name} must rise strictly from 0 to L = {L} (every sequence at least one token), "
                         f"got {offsets if len(offsets) <= 12 else offsets[:6] + ['...'] + offsets[-6:]}")
    return offsets


def per_sequence(run, x: torch.Tensor, offsets: list[int], state=None, final: bool = True):
    """(y, final states [N, ...] or None without ``final``) of the packed call made of run(x[:, a:b], row n of
    ``state`` or None) -> (y_n, h_n) for each sequence n, in order."""
    if isinstance(offsets, torch.Tensor):
        raise ValueError("cu_seqlens: inside torch.compile a packed call needs a kernel that packs (a gated "
                         "packing Triton variant on CUDA); this one would run one call per sequence, which a "
                         "trace cannot: run it eagerly")
    outs = [run(x[:, a:b], None if state is None else state[n:n + 1])
            for n, (a, b) in enumerate(zip(offsets, offsets[1:]))]
    return torch.cat([y for y, _ in outs], dim=1), (torch.cat([h for _, h in outs]) if final else None)


def sequence_index(cu_seqlens: torch.Tensor, L: int) -> torch.Tensor:
    """The sequence of each of the L packed tokens, int32 [L], computed on cu_seqlens' device (no
    synchronisation): token t belongs to sequence n where cu_seqlens[n] <= t < cu_seqlens[n + 1]."""
    t = torch.arange(L, device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    return torch.searchsorted(cu_seqlens[1:], t, right=True).to(torch.int32)


_on_device: dict = {}   # (offsets, device) -> int32 tensor: a model's layers share one copy


def device_offsets(offsets, device: torch.device) -> torch.Tensor:
    """Checked ``offsets`` (sequence_offsets': ints, or inside a trace the device tensor, returned as it is)
    as an int32 tensor on ``device``, copied once for all the calls that share them (to CUDA through pinned
    memory, without waiting for the device)."""
    if isinstance(offsets, torch.Tensor):
        return offsets
    key = (tuple(offsets), torch.device(device))
    found = _on_device.get(key)
    if found is None:
        if len(_on_device) >= 8:
            _on_device.clear()
        host = torch.tensor(offsets, dtype=torch.int32)
        found = _on_device[key] = (host.pin_memory().to(device, non_blocking=True) if key[1].type == "cuda"
                                   else host.to(device))
    return found


def state_rows(x: torch.Tensor, cu_seqlens) -> int:
    """Rows of a mixer's states: x's batch, or with ``cu_seqlens`` (a tensor) its packed sequences."""
    return x.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
