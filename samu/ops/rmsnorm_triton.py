"""Triton kernels of RMSNorm (samu.ops.rmsnorm): one pass forward, one pass backward, fp32 inside.

Each program normalises ROWS rows of the full width; the weight gradient is a per-program partial
sum, reduced in a fixed order on the host: deterministic to the bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from samu.ops.triton_utils import cast_to, cdiv, inv_rms, launch, next_power_of_2

ROWS, FEW_ROWS = 32, 1024


@triton.jit
def _rmsnorm_fwd(x, add, weight, shift, y, total, rstd, shifted, R, W, eps, BW: tl.constexpr, ROWS: tl.constexpr,
                 HAS_ADD: tl.constexpr, HAS_SHIFT: tl.constexpr):
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
        if HAS_ADD:
            # the sum as stored is what gets normalised, as when the sum and the norm are two ops
            v = cast_to(v + tl.load(add + row + c, mask=c_ok, other=0.0).to(tl.float32), total.dtype.element_ty)
            tl.store(total + row + c, v, mask=c_ok)
            v = v.to(tl.float32)
        s = inv_rms(v, W, eps)
        tl.store(rstd + r, s)
        tl.store(y + row + c, cast_to(v * s * w, y.dtype.element_ty), mask=c_ok)
        if HAS_SHIFT:
            tl.store(shifted + row + c, cast_to(v + b, shifted.dtype.element_ty), mask=c_ok)


@triton.jit
def _rmsnorm_bwd(dy, x, weight, rstd, dtotal, dx, dadd, dw_part, R, W, BW: tl.constexpr, ROWS: tl.constexpr,
                 HAS_DTOTAL: tl.constexpr, HAS_DADD: tl.constexpr):
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
        if HAS_DTOTAL:
            # x was a sum that is also used on its own (the residual stream): its cotangent joins here
            dxv += tl.load(dtotal + row + c, mask=c_ok, other=0.0).to(tl.float32)
        tl.store(dx + row + c, cast_to(dxv, dx.dtype.element_ty), mask=c_ok)
        if HAS_DADD:
            tl.store(dadd + row + c, cast_to(dxv, dadd.dtype.element_ty), mask=c_ok)
        acc += d * xhat
    tl.store(dw_part + pid * W + c, acc, mask=c_ok)


def rmsnorm_fwd(x: torch.Tensor, weight: torch.Tensor, eps: float, *, dtype=None, add=None, shift=None):
    """(y, rstd [R] fp32, total, shifted) of a contiguous x [..., W]: with ``add`` (contiguous, x's shape),
    total = x + add in their promoted dtype and y its norm, else total is None and y the norm of x; y in
    ``dtype`` (default: the normalised tensor's); with ``shift`` [W] (the decoding step's residual plus the
    next product's bias, samu.ops.rmsnorm), shifted = x + shift in x's dtype, else None."""
    W = x.shape[-1]
    R = x.numel() // W
    total = None if add is None else torch.empty_like(x, dtype=torch.promote_types(x.dtype, add.dtype))
    y = torch.empty_like(x, dtype=dtype or (x.dtype if total is None else total.dtype))
    rstd = x.new_empty(R, dtype=torch.float32)
    shifted = None if shift is None else torch.empty_like(x)
    # up to FEW_ROWS rows (decoding) one program each, for latency; more ROWS per program
    rows = ROWS if R > FEW_ROWS else 1
    launch(_rmsnorm_fwd, (cdiv(R, rows),), x, add, weight, shift, y, total, rstd, shifted, R, W, eps,
           BW=next_power_of_2(W), ROWS=rows, HAS_ADD=add is not None, HAS_SHIFT=shift is not None,
           num_warps=4 if W <= 2048 else 8)
    return y, rstd, total, shifted


def rmsnorm_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor, *, dtotal=None,
                add_dtype=None):
    """(dx in x's dtype, dweight fp32, dadd or None) from contiguous dy and x (the normalised tensor). With
    ``dtotal`` (contiguous, x's shape), x's cotangent from its other uses is added into dx; with
    ``add_dtype``, dadd is the same cotangent in that dtype (that of a summand of x)."""
    W = x.shape[-1]
    R = x.numel() // W
    n = cdiv(R, ROWS)
    dx = torch.empty_like(x)
    dadd = None if add_dtype is None else torch.empty_like(x, dtype=add_dtype)
    dw_part = x.new_empty(n, W, dtype=torch.float32)
    launch(_rmsnorm_bwd, (n,), dy, x, weight, rstd, dtotal, dx, dadd, dw_part, R, W, BW=next_power_of_2(W),
           ROWS=ROWS, HAS_DTOTAL=dtotal is not None, HAS_DADD=dadd is not None, num_warps=4 if W <= 2048 else 8)
    return dx, dw_part.sum(0), dadd
