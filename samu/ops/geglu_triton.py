"""Triton kernels of the GeGLU gate (samu.ops.geglu): a = GeLU_tanh(gate) * up from z = [gate | up], one
pass forward (reads z, writes a) and one backward (reads da and z, writes dz whole: no slice-backward
zero fill and no concatenation). ``geglu_bwd_sums`` also sums dz over its rows as it writes it (the
gradient of the bias of the product that made z, without a pass over dz of its own): each program walks
ROWS rows of its columns and writes their sums, which one sum over programs adds (fixed orders: the same
bits in every run).

Both round where the PyTorch ops round: GeLU(gate) to the storage dtype, then the product; backward
da * up, then times GeLU'(gate), and da * GeLU(gate), each rounded once from fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from samu.ops.triton_utils import cast_to, cdiv, gelu_gate, gelu_tanh, gelu_tanh_grad, launch

# columns of one program; rows of at most FEW_ROWS (decoding) take narrower programs, for latency
BLOCK, FEW_BLOCK, FEW_ROWS = 1024, 256, 1024


@triton.jit
def _geglu_fwd(z, a, H, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)   # rows * 2H passes 2^31 at long shapes
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = c < H
    src = z + row * 2 * H + c
    gate = tl.load(src, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(src + H, mask=ok, other=0.0).to(tl.float32)
    tl.store(a + row * H + c, cast_to(gelu_gate(gate, up, a.dtype.element_ty), a.dtype.element_ty), mask=ok)


@triton.jit
def _geglu_row_bwd(da, z, dz, row, c, ok, H):
    """dz of one row's columns c, stored, and returned as the stored values (fp32 of the storage dtype)."""
    src = row * 2 * H + c
    gate = tl.load(z + src, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(z + src + H, mask=ok, other=0.0).to(tl.float32)
    d = tl.load(da + row * H + c, mask=ok, other=0.0).to(tl.float32)
    dt = dz.dtype.element_ty
    g = cast_to(gelu_tanh(gate), dt).to(tl.float32)
    dg = cast_to(d * up, dt).to(tl.float32)
    d_gate = cast_to(dg * gelu_tanh_grad(gate), dt)
    d_up = cast_to(d * g, dt)
    tl.store(dz + src, d_gate, mask=ok)
    tl.store(dz + src + H, d_up, mask=ok)
    return d_gate.to(tl.float32), d_up.to(tl.float32)


@triton.jit
def _geglu_bwd(da, z, dz, H, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    _geglu_row_bwd(da, z, dz, row, c, c < H, H)


@triton.jit
def _geglu_bwd_sums(da, z, dz, part, R, H, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    first = tl.program_id(0).to(tl.int64) * ROWS
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = c < H
    sum_gate = tl.zeros([BLOCK], tl.float32)
    sum_up = tl.zeros([BLOCK], tl.float32)
    for i in range(0, ROWS):
        row = first + i
        d_gate, d_up = _geglu_row_bwd(da, z, dz, row, c, ok & (row < R), H)
        sum_gate += d_gate
        sum_up += d_up
    out = part + tl.program_id(0).to(tl.int64) * 2 * H + c
    tl.store(out, sum_gate, mask=ok)
    tl.store(out + H, sum_up, mask=ok)


def _grid(R: int, H: int):
    block = BLOCK if R > FEW_ROWS else FEW_BLOCK
    return (R, cdiv(H, block)), block


def geglu_fwd(z: torch.Tensor) -> torch.Tensor:
    """a [..., H] in z's dtype from a contiguous z [..., 2H]."""
    H = z.shape[-1] // 2
    a = z.new_empty(*z.shape[:-1], H)
    if a.numel() == 0:
        return a
    grid, block = _grid(z.numel() // (2 * H), H)
    launch(_geglu_fwd, grid, z, a, H, BLOCK=block, num_warps=4)
    return a


# rows a program of the summing backward walks
ROWS = 32


def geglu_bwd_sums(da: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """dz as geglu_bwd writes it, and its sum over rows (fp32 [2H]: the sums of the stored values) from
    contiguous da [..., H] and z [..., 2H]."""
    H = z.shape[-1] // 2
    R = z.numel() // (2 * H) if H else 0
    dz = torch.empty_like(z)
    if dz.numel() == 0:
        return dz, z.new_zeros(2 * H, dtype=torch.float32)
    part = z.new_empty(cdiv(R, ROWS), 2 * H, dtype=torch.float32)
    launch(_geglu_bwd_sums, (cdiv(R, ROWS), cdiv(H, BLOCK)), da, z, dz, part, R, H, ROWS=ROWS, BLOCK=BLOCK,
           num_warps=4)
    return dz, part.sum(0)


def geglu_bwd(da: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """dz [..., 2H] in z's dtype from contiguous da [..., H] and z."""
    H = z.shape[-1] // 2
    dz = torch.empty_like(z)
    if dz.numel() == 0:
        return dz
    grid, block = _grid(z.numel() // (2 * H), H)
    launch(_geglu_bwd, grid, da, z, dz, H, BLOCK=block, num_warps=4)
    return dz
