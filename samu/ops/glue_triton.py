"""Triton kernels of the RecurrentBlock's glue (samu.ops.glue): the causal depthwise Conv1D of the x
branch and the GeLU of the y branch, in one pass over the in-projection z = [z_x | z_y], and the
backward in one pass over (dx_c, da) and z.

Both kernels accumulate in fp32 and round once to the storage dtype. The weight and bias gradients
are per-program partial sums, reduced in a fixed order on the host: deterministic to the bit.

Packed rows (VARLEN, B = 1; ``seq`` [L] the sequence of every token, ``cu`` its N + 1 offsets): the
window of token t reaches back to its own sequence's start and then into that sequence's row of the
state (zeros without one), and a token's input gradient gathers only the outputs of its own sequence.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from samu.ops.triton_utils import cast_to, cdiv, gelu_tanh, gelu_tanh_grad, launch

# rows and channels of the forward's tile; the backward's (narrower: five accumulators a tile), which walks
# ROWS rows per program (scripts/gpu_glue_sweep.py, results/dev/issue10/glue_sweep.json)
BL, BE = 32, 128
BWD_BL, BWD_BE, ROWS = 16, 64, 512   # ROWS a multiple of BWD_BL: a program's row tiles end at its rows


@triton.jit
def _window(z, state, b, s, e, valid, first, row, sz_b, sz_l, ss_b, ss_k, K: tl.constexpr, HAS_STATE: tl.constexpr):
    """z_x at positions s [BL] of sequences that begin at ``first`` [BL] (the state's entries, of state row
    ``row`` [BL], for s < first; zeros without a state), fp32 [BL, BE]."""
    ok = valid & (s >= first)[:, None]
    v = tl.load(z + b * sz_b + s[:, None] * sz_l + e[None, :], mask=ok, other=0.0).to(tl.float32)
    if HAS_STATE:
        old = valid & (s < first)[:, None]
        j = s - first + (K - 1)
        v_old = tl.load(state + row[:, None] * ss_b + j[:, None] * ss_k + e[None, :], mask=old,
                        other=0.0).to(tl.float32)
        v = tl.where(old, v_old, v)
    return v


@triton.jit
def _bounds(seq, cu, b, t, L, VARLEN: tl.constexpr):
    """(first token, end, state row) of the sequences of tokens t [BL]: the batch row's whole length
    unpacked; packed, each token's own sequence."""
    if VARLEN:
        tc = tl.minimum(tl.maximum(t, 0), L - 1)
        n = tl.load(seq + tc).to(tl.int64)
        return tl.load(cu + n).to(tl.int64), tl.load(cu + n + 1).to(tl.int64), n
    else:
        zero = tl.zeros_like(t)
        return zero, zero + L, zero + b


@triton.jit
def _conv_gelu_fwd(z, weight, bias, state, xc, a, seq, cu, L, E, sz_b, sz_l, ss_b, ss_k, so_b, so_l,
                   K: tl.constexpr, HAS_STATE: tl.constexpr, BL: tl.constexpr, BE: tl.constexpr,
                   VARLEN: tl.constexpr):
    # 64-bit row indices: B * L * 2E passes 2^31 at long shapes
    pid_l, pid_e, b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    t = pid_l.to(tl.int64) * BL + tl.arange(0, BL)
    e = pid_e * BE + tl.arange(0, BE)
    e_ok = e < E
    valid = (t < L)[:, None] & e_ok[None, :]
    first, _, row = _bounds(seq, cu, b, t, L, VARLEN)
    acc = tl.zeros((BL, BE), tl.float32) + tl.load(bias + e, mask=e_ok, other=0.0).to(tl.float32)[None, :]
    for i in tl.static_range(K):
        w = tl.load(weight + i * E + e, mask=e_ok, other=0.0).to(tl.float32)
        acc += _window(z, state, b, t - (K - 1) + i, e, valid, first, row, sz_b, sz_l, ss_b, ss_k, K,
                       HAS_STATE) * w[None, :]
    out = b * so_b + t[:, None] * so_l + e[None, :]
    tl.store(xc + out, cast_to(acc, xc.dtype.element_ty), mask=valid)
    zy = tl.load(z + b * sz_b + t[:, None] * sz_l + E + e[None, :], mask=valid, other=0.0).to(tl.float32)
    tl.store(a + out, cast_to(gelu_tanh(zy), a.dtype.element_ty), mask=valid)


@triton.jit
def _conv_gelu_bwd(dxc, da, z, weight, state, dz, dw_part, db_part, seq, cu, L, E, n_l, sz_b, sz_l, ss_b, ss_k, so_b,
                   so_l, K: tl.constexpr, HAS_STATE: tl.constexpr, BL: tl.constexpr, BE: tl.constexpr,
                   ROWS: tl.constexpr, VARLEN: tl.constexpr):
    pid_l, pid_e, b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    e = pid_e * BE + tl.arange(0, BE)
    e_ok = e < E
    # [BL, BE] accumulators of dw[0..K-1] and db, summed over rows once at the end
    acc_0 = tl.zeros((BL, BE), tl.float32)
    acc_1 = tl.zeros((BL, BE), tl.float32)
    acc_2 = tl.zeros((BL, BE), tl.float32)
    acc_3 = tl.zeros((BL, BE), tl.float32)
    acc_b = tl.zeros((BL, BE), tl.float32)
    first = pid_l.to(tl.int64) * ROWS
    for r0 in tl.range(0, tl.minimum(ROWS, L - pid_l * ROWS), BL):
        t = first + r0 + tl.arange(0, BL)
        valid = (t < L)[:, None] & e_ok[None, :]
        begins, ends, row = _bounds(seq, cu, b, t, L, VARLEN)
        # dz_x[t] = sum_i w[i] dx_c[t + K - 1 - i] over the outputs that read z_x[t] (of its own sequence)
        acc = tl.zeros((BL, BE), tl.float32)
        for i in tl.static_range(K):
            w = tl.load(weight + i * E + e, mask=e_ok, other=0.0).to(tl.float32)
            tt = t + (K - 1 - i)
            g = tl.load(dxc + b * so_b + tt[:, None] * so_l + e[None, :], mask=valid & (tt < ends)[:, None],
                        other=0.0).to(tl.float32)
            acc += g * w[None, :]
        tl.store(dz + b * sz_b + t[:, None] * sz_l + e[None, :], cast_to(acc, dz.dtype.element_ty), mask=valid)
        # dw[i] = sum_t dx_c[t] z_x[t - (K - 1) + i]; db = sum_t dx_c[t]
        g = tl.load(dxc + b * so_b + t[:, None] * so_l + e[None, :], mask=valid, other=0.0).to(tl.float32)
        acc_b += g
        acc_0 += g * _window(z, state, b, t - (K - 1), e, valid, begins, row, sz_b, sz_l, ss_b, ss_k, K, HAS_STATE)
        if K > 1:
            acc_1 += g * _window(z, state, b, t - (K - 2), e, valid, begins, row, sz_b, sz_l, ss_b, ss_k, K,
                                 HAS_STATE)
        if K > 2:
            acc_2 += g * _window(z, state, b, t - (K - 3), e, valid, begins, row, sz_b, sz_l, ss_b, ss_k, K,
                                 HAS_STATE)
        if K > 3:
            acc_3 += g * _window(z, state, b, t - (K - 4), e, valid, begins, row, sz_b, sz_l, ss_b, ss_k, K,
                                 HAS_STATE)
        # dz_y = da * GeLU'(z_y)
        zy = tl.load(z + b * sz_b + t[:, None] * sz_l + E + e[None, :], mask=valid, other=0.0).to(tl.float32)
        d = tl.load(da + b * so_b + t[:, None] * so_l + e[None, :], mask=valid, other=0.0).to(tl.float32)
        tl.store(dz + b * sz_b + t[:, None] * sz_l + E + e[None, :], cast_to(d * gelu_tanh_grad(zy),
                 dz.dtype.element_ty), mask=valid)
    part = b * n_l + pid_l   # int64, as b is
    out = dw_part + part * K * E + e
    tl.store(out, tl.sum(acc_0, axis=0), mask=e_ok)
    if K > 1:
        tl.store(out + E, tl.sum(acc_1, axis=0), mask=e_ok)
    if K > 2:
        tl.store(out + 2 * E, tl.sum(acc_2, axis=0), mask=e_ok)
    if K > 3:
        tl.store(out + 3 * E, tl.sum(acc_3, axis=0), mask=e_ok)
    tl.store(db_part + part * E + e, tl.sum(acc_b, axis=0), mask=e_ok)


def conv_gelu_fwd(z: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, state, seq=None, cu=None):
    """(x_c, a) [B, L, E] in z's dtype from z [B, L, 2E] (contiguous), weight [K, E], bias [E]. Packed
    (``seq`` [L] and ``cu`` [N + 1] int32, B = 1): the state has N rows."""
    B, L, E2 = z.shape
    E, K = E2 // 2, weight.shape[0]
    xc = z.new_empty(B, L, E)
    a = z.new_empty(B, L, E)
    s = state if state is not None else z
    grid = (cdiv(L, BL), cdiv(E, BE), B)
    launch(_conv_gelu_fwd, grid, z, weight, bias, s, xc, a, seq if seq is not None else z, cu if cu is not None else z,
           L, E, z.stride(0), z.stride(1), s.stride(0), s.stride(1), xc.stride(0), xc.stride(1),
           K=K, HAS_STATE=state is not None, BL=BL, BE=BE, VARLEN=seq is not None, num_warps=4)
    return xc, a


def conv_gelu_bwd(dxc: torch.Tensor, da: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, state, seq=None,
                  cu=None):
    """(dz [B, L, 2E] in z's dtype, dweight [K, E] fp32, dbias [E] fp32) from contiguous dx_c, da; packed
    as conv_gelu_fwd."""
    B, L, E2 = z.shape
    E, K = E2 // 2, weight.shape[0]
    if ROWS % BWD_BL:
        raise ValueError(f"glue_triton.ROWS={ROWS} must be a multiple of BWD_BL={BWD_BL}")
    n_l = cdiv(L, ROWS)
    dz = torch.empty_like(z)
    dw_part = z.new_empty(B * n_l, K, E, dtype=torch.float32)
    db_part = z.new_empty(B * n_l, E, dtype=torch.float32)
    s = state if state is not None else z
    grid = (n_l, cdiv(E, BWD_BE), B)
    launch(_conv_gelu_bwd, grid, dxc, da, z, weight, s, dz, dw_part, db_part, seq if seq is not None else z,
           cu if cu is not None else z, L, E, n_l, z.stride(0), z.stride(1), s.stride(0), s.stride(1), dxc.stride(0),
           dxc.stride(1), K=K, HAS_STATE=state is not None, BL=BWD_BL, BE=BWD_BE, ROWS=ROWS, VARLEN=seq is not None,
           num_warps=4)
    # a fixed-order reduction of the per-program partials: the same bits on every run
    return dz, dw_part.sum(0), db_part.sum(0)
