"""Triton kernels of RMSNorm (samu.ops.rmsnorm): one pass forward, one pass backward, fp32 inside.

Each program normalises ROWS rows of the full width; the weight gradient is a per-program partial
sum, reduced in a fixed order on the host: deterministic to the bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from samu.ops.triton_utils import cast_to, cdiv, launch, next_power_of_2

ROWS, FEW_ROWS = 32, 1024


@triton.jit
def _rmsnorm_fwd(x, weight, shift, y, rstd, shifted, R, W, eps, BW: tl.constexpr, ROWS: tl.constexpr,
                 HAS_SHIFT: tl.constexpr):
    pid = tl.program_id(0)
    c = tl.arange(0, BW)
    c_ok = c < W
    w = tl.load(weight + c, mask=c_ok, other=0.0).to(tl.float32)
    if HAS_SHIFT:
        b = tl.load(shift + c, mask=c_ok, other=0.0).to(tl.float32)
    first = pid.to(tl.int64) * ROWS
    for i in tl.range(0, tl.minimum(ROWS, R - pid * ROWS)):
        r = first + i
        row = r * W   # int64: R * W passes 2^31 at long shapes
        v = tl.load(x + row + c, mask=c_ok, other=0.0).to(tl.float32)
        s = 1.0 / tl.sqrt(tl.sum(v * v, axis=0) / W + eps)
        tl.store(rstd + r, s)
        tl.store(y + row + c, cast_to(v * s * w, y.dtype.element_ty), mask=c_ok)
        if HAS_SHIFT:
            tl.store(shifted + row + c, cast_to(v + b, shifted.dtype.element_ty), mask=c_ok)


@triton.jit
def _rmsnorm_bwd(dy, x, weight, rstd, dx, dw_part, R, W, BW: tl.constexpr, ROWS: tl.constexpr):
    pid = tl.program_id(0)
    c = tl.arange(0, BW)
    c_ok = c < W
    w = tl.load(weight + c, mask=c_ok, other=0.0).to(tl.float32)
    acc = tl.zeros((BW,), tl.float32)
    first = pid.to(tl.int64) * ROWS
    for i in tl.range(0, tl.minimum(ROWS, R - pid * ROWS)):
        r = first + i
        row = r * W
        v = tl.load(x + row + c, mask=c_ok, other=0.0).to(tl.float32)
        d = tl.load(dy + row + c, mask=c_ok, other=0.0).to(tl.float32)
        s = tl.load(rstd + r)
        xhat = v * s
        g = d * w
        # dx = s (g - xhat mean(xhat g)); dw = sum over rows of dy xhat
        dxv = s * (g - xhat * (tl.sum(xhat * g, axis=0) / W))
        tl.store(dx + row + c, cast_to(dxv, dx.dtype.element_ty), mask=c_ok)
        acc += d * xhat
    tl.store(dw_part + pid * W + c, acc, mask=c_ok)


def rmsnorm_fwd(x: torch.Tensor, weight: torch.Tensor, eps: float, shift=None):
    """(y in x's dtype, rstd [R] fp32, x + shift in x's dtype or None) of a contiguous x [..., W] and an
    optional shift [W] (the decoding step's residual plus the next product's bias, samu.ops.rmsnorm)."""
    W = x.shape[-1]
    R = x.numel() // W
    y = torch.empty_like(x)
    rstd = x.new_empty(R, dtype=torch.float32)
    shifted = None if shift is None else torch.empty_like(x)
    # up to FEW_ROWS rows (decoding) one program each, for latency; more ROWS per program
    rows = ROWS if R > FEW_ROWS else 1
    launch(_rmsnorm_fwd, (cdiv(R, rows),), x, weight, shift, y, rstd, shifted, R, W, eps, BW=next_power_of_2(W),
           ROWS=rows, HAS_SHIFT=shift is not None, num_warps=4 if W <= 2048 else 8)
    return y, rstd, shifted


def rmsnorm_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor):
    """(dx in x's dtype, dweight fp32) from contiguous dy and x."""
    W = x.shape[-1]
    R = x.numel() // W
    n = cdiv(R, ROWS)
    dx = torch.empty_like(x)
    dw_part = x.new_empty(n, W, dtype=torch.float32)
    launch(_rmsnorm_bwd, (n,), dy, x, weight, rstd, dx, dw_part, R, W, BW=next_power_of_2(W), ROWS=ROWS,
           num_warps=4 if W <= 2048 else 8)
    return dx, dw_part.sum(0)
