"""Triton kernels of decoding's skinny products (samu.ops.gemv): y = x W^T + b (+ residual) and the
GeGLU's GeLU(x W_g^T + b_g) * (x W_u^T + b_u), for x of a few rows.

A decoding step reads every weight once for a handful of rows, so these are bandwidth-bound: each program
owns BN output columns for all rows (one M tile of at most samu.ops.gemv.MAX_ROWS), streams its weight rows once along K in
tiles of BK, and accumulates in fp32 on the tensor cores (fp32 inputs at full IEEE precision). Roundings
follow the PyTorch ops they stand for: the product with its bias rounds once to the storage dtype, the
residual sum, the GeLU and the gate product each once more.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from samu.ops.glue_triton import _gelu_tanh
from samu.ops.triton_utils import _INTERPRETED, cast_to, cdiv, next_power_of_2

# output columns and K per tile (one program holds every row: at most samu.ops.gemv.MAX_ROWS)
BN, BK = 16, 256
WARPS, STAGES = 4, 3


@triton.jit
def _tile_dot(xt, w, rows, n_ok, k, k_ok, K, acc, IEEE: tl.constexpr):
    wt = tl.load(w + rows[:, None] * K + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
    if _INTERPRETED:
        # the interpreter multiplies 16-bit matrices as raw integers: upcast (exact)
        return tl.dot(xt.to(tl.float32), tl.trans(wt.to(tl.float32)), acc)
    elif IEEE:
        return tl.dot(xt, tl.trans(wt), acc, input_precision="ieee")
    else:
        return tl.dot(xt, tl.trans(wt), acc)


@triton.jit
def _gemv(x, w, b, r, y, M, N, K, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, GEGLU: tl.constexpr,
          IEEE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    n = tl.program_id(0).to(tl.int64) * BN + tl.arange(0, BN)   # [BN] output columns
    m = tl.arange(0, BM)                                          # [BM] rows
    n_ok, m_ok = n < N, m < M
    acc = tl.zeros((BM, BN), tl.float32)
    acc_u = tl.zeros((BM, BN), tl.float32)
    for k0 in tl.range(0, K, BK):
        k = k0 + tl.arange(0, BK)
        k_ok = k < K
        xt = tl.load(x + m[:, None] * K + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        acc = _tile_dot(xt, w, n, n_ok, k, k_ok, K, acc, IEEE)
        if GEGLU:
            # the up projection's rows follow the gate's: W = [W_g; W_u], N = hidden
            acc_u = _tile_dot(xt, w, N + n, n_ok, k, k_ok, K, acc_u, IEEE)
    dt = y.dtype.element_ty
    if HAS_BIAS:
        acc += tl.load(b + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        if GEGLU:
            acc_u += tl.load(b + N + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    out = cast_to(acc, dt)
    if GEGLU:
        gate = cast_to(_gelu_tanh(out.to(tl.float32)), dt)
        out = cast_to(gate.to(tl.float32) * cast_to(acc_u, dt).to(tl.float32), dt)
    where = m[:, None] * N + n[None, :]
    ok = m_ok[:, None] & n_ok[None, :]
    if HAS_RES:
        out = cast_to(tl.load(r + where, mask=ok, other=0.0).to(tl.float32) + out.to(tl.float32), dt)
    tl.store(y + where, out, mask=ok)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias, residual, geglu: bool) -> torch.Tensor:
    """y [M, N] in x's dtype from contiguous x [M, K] (M <= samu.ops.gemv.MAX_ROWS), weight [N, K] (geglu: [2N, K]),
    bias [N] / [2N] or None, residual [M, N] or None."""
    M, K = x.shape
    N = weight.shape[0] // 2 if geglu else weight.shape[0]
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    _gemv[(cdiv(N, BN),)](x, weight, x if bias is None else bias, x if residual is None else residual, y, M, N, K,
                          HAS_BIAS=bias is not None, HAS_RES=residual is not None, GEGLU=geglu,
                          IEEE=x.dtype == torch.float32, BM=max(16, next_power_of_2(M)), BN=BN,
                          BK=min(BK, max(16, next_power_of_2(K))), num_warps=WARPS, num_stages=STAGES)
    return y
