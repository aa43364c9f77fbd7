"""Triton kernels of decoding's skinny products (samu.ops.gemv): y = x W^T + b (+ residual) and the
GeLU(x W_g^T + b_g) * (x W_u^T + b_u) of the gated MLP, for x of a few rows, optionally RMSNorm(x) first.

A decoding step reads every weight once for a handful of rows, so these are bandwidth-bound and, at the
sizes of a decoding step, latency-bound: each program owns BN output columns of all rows (one M tile of at
most samu.ops.gemv.MAX_ROWS) and one of SPLIT slices of K, streams its weight rows once in tiles of BK,
and accumulates in fp32 on the tensor cores (fp32 inputs at IEEE precision). With SPLIT > 1 each program
writes its fp32 partial sums; the last of a tile's programs to finish (an atomic ticket) adds the SPLIT
partials in slice order and applies the epilogue, so the result does not depend on which finished last:
deterministic to the bit. The ticket counters are reset by that program, ready for the next launch.

Roundings follow the PyTorch ops they stand for: RMSNorm's output, the product with its bias, the residual
sum, the GeLU and the gate product each round once to the storage dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from samu.ops.glue_triton import _gelu_tanh
from samu.ops.triton_utils import _INTERPRETED, cast_to, cdiv, next_power_of_2

# output columns per program, K per tile, pipeline stages, warps; programs a launch aims at (K is split
# into slices until there are about this many)
BN, BK, STAGES, WARPS = 32, 256, 4, 4
TARGET_PROGRAMS = 264
# inputs of at most CORE_ROWS rows multiply on the CUDA cores (tl.dot needs 16 rows)
CORE_ROWS = 1


@triton.jit
def _tile_dot(xt, w, cols, n_ok, k, k_ok, K, acc, IEEE: tl.constexpr, CORE: tl.constexpr):
    wt = tl.load(w + cols[:, None] * K + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
    if CORE:
        # a row or two on the CUDA cores: no tensor-core layouts, loads straight into registers
        return acc + tl.sum(xt.to(tl.float32)[:, None, :] * wt.to(tl.float32)[None, :, :], axis=2)
    elif _INTERPRETED:
        # the interpreter multiplies 16-bit matrices as raw integers: upcast (exact)
        return tl.dot(xt.to(tl.float32), tl.trans(wt.to(tl.float32)), acc)
    elif IEEE:
        return tl.dot(xt, tl.trans(wt), acc, input_precision="ieee")
    else:
        return tl.dot(xt, tl.trans(wt), acc)


@triton.jit
def _gemv(x, nw, w, b, r, y, part, ticket, M, N, K, KS, eps, NORM: tl.constexpr, HAS_BIAS: tl.constexpr,
          HAS_RES: tl.constexpr, GEGLU: tl.constexpr, IEEE: tl.constexpr, SPLIT: tl.constexpr, CORE: tl.constexpr,
          BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    tile, s = tl.program_id(0), tl.program_id(1)
    n = tile.to(tl.int64) * BN + tl.arange(0, BN)   # [BN] output columns
    m = tl.arange(0, BM)                              # [BM] rows
    n_ok, m_ok = n < N, m < M
    dt = y.dtype.element_ty
    if NORM:
        # RMSNorm of each row over the whole K first (every program: the rows are short)
        sq = tl.zeros((BM,), tl.float32)
        for k0 in tl.range(0, K, BK):
            k = k0 + tl.arange(0, BK)
            v = tl.load(x + m[:, None] * K + k[None, :], mask=m_ok[:, None] & (k < K)[None, :], other=0.0)
            sq += tl.sum(v.to(tl.float32) * v.to(tl.float32), axis=1)
        rstd = 1.0 / tl.sqrt(sq / K + eps)
    acc = tl.zeros((BM, BN), tl.float32)
    acc_u = tl.zeros((BM, BN), tl.float32)
    for k0 in tl.range(s * KS, tl.minimum(s * KS + KS, K), BK):
        k = k0 + tl.arange(0, BK)
        k_ok = k < K
        xt = tl.load(x + m[:, None] * K + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        if NORM:
            g = tl.load(nw + k, mask=k_ok, other=0.0).to(tl.float32)
            xt = cast_to(xt.to(tl.float32) * rstd[:, None] * g[None, :], dt)
        acc = _tile_dot(xt, w, n, n_ok, k, k_ok, K, acc, IEEE, CORE)
        if GEGLU:
            # the up projection's rows follow the gate's: W = [W_g; W_u], N = hidden
            acc_u = _tile_dot(xt, w, N + n, n_ok, k, k_ok, K, acc_u, IEEE, CORE)
    where = m[:, None] * N + n[None, :]
    ok = m_ok[:, None] & n_ok[None, :]
    last = True
    if SPLIT > 1:
        MN = M * N
        tl.store(part + (2 * s) * MN + where, acc, mask=ok)
        if GEGLU:
            tl.store(part + (2 * s + 1) * MN + where, acc_u, mask=ok)
        # every thread's partials are written before the ticket is drawn (release), and read after (acquire)
        tl.debug_barrier()
        last = tl.atomic_add(ticket + tile, 1) == SPLIT - 1
        if last:
            acc = tl.zeros((BM, BN), tl.float32)
            acc_u = tl.zeros((BM, BN), tl.float32)
            for i in tl.range(0, SPLIT):
                acc += tl.load(part + (2 * i) * MN + where, mask=ok, other=0.0, cache_modifier=".cg")
                if GEGLU:
                    acc_u += tl.load(part + (2 * i + 1) * MN + where, mask=ok, other=0.0, cache_modifier=".cg")
            tl.store(ticket + tile, 0)
    if last:
        if HAS_BIAS:
            acc += tl.load(b + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
            if GEGLU:
                acc_u += tl.load(b + N + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        out = cast_to(acc, dt)
        if GEGLU:
            gate = cast_to(_gelu_tanh(out.to(tl.float32)), dt)
            out = cast_to(gate.to(tl.float32) * cast_to(acc_u, dt).to(tl.float32), dt)
        if HAS_RES:
            out = cast_to(tl.load(r + where, mask=ok, other=0.0).to(tl.float32) + out.to(tl.float32), dt)
        tl.store(y + where, out, mask=ok)


# Ticket counters (zeros, reset by the kernel) and partial sums (16 MiB), one set per (device, stream), made
# once and never freed (CUDA graphs hold their addresses): launches on one stream run one after another. A
# launch whose tiles or partial sums would not fit runs unsplit.
_TICKETS, _PART = 4096, 1 << 22
_scratch: dict = {}


def _buffers(device):
    key = (device, torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0)
    if key not in _scratch:
        _scratch[key] = (torch.zeros(_TICKETS, dtype=torch.int32, device=device),
                         torch.empty(_PART, dtype=torch.float32, device=device))
    return _scratch[key]


def gemv(x: torch.Tensor, weight: torch.Tensor, bias, residual, geglu: bool, norm=None) -> torch.Tensor:
    """y [M, N] in x's dtype from contiguous x [M, K] (M <= samu.ops.gemv.MAX_ROWS), weight [N, K] (geglu:
    [2N, K]), bias [N] / [2N] or None, residual [M, N] or None, norm (RMSNorm weight [K], eps) or None."""
    M, K = x.shape
    N = weight.shape[0] // 2 if geglu else weight.shape[0]
    core = M <= CORE_ROWS
    BM = next_power_of_2(M) if core else max(16, next_power_of_2(M))
    # the pipeline's shared memory: half the K tile for 64 rows and for fp32
    bk = BK // (2 if BM > 16 else 1) // (2 if x.dtype == torch.float32 else 1)
    bk = min(bk, max(16, next_power_of_2(K)))
    tiles = cdiv(N, BN)
    split = max(1, min(cdiv(TARGET_PROGRAMS, tiles), cdiv(K, bk)))
    if tiles > _TICKETS or 2 * split * M * N > _PART:
        split = 1
    ks = cdiv(cdiv(K, split), bk) * bk
    split = cdiv(K, ks)
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    tickets, part = _buffers(x.device)
    nw, eps = norm if norm is not None else (x, 0.0)
    _gemv[(tiles, split)](x, nw, weight, x if bias is None else bias, x if residual is None else residual, y, part,
                          tickets, M, N, K, ks, float(eps), NORM=norm is not None, HAS_BIAS=bias is not None,
                          HAS_RES=residual is not None, GEGLU=geglu, IEEE=x.dtype == torch.float32, SPLIT=split,
                          CORE=core, BM=BM, BN=BN, BK=bk, num_warps=WARPS, num_stages=STAGES)
    return y
