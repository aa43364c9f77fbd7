"""RG-LRU backward in Triton: adjoint scan, input and parameter gradients (SPEC §4, §6).

Read bottom-up: ``rglru_bwd`` (host) runs the reverse group summaries, the main kernel and a
fixed-order reduction of the per-program parameter-gradient partials. The main kernel rebuilds,
per chunk and head, the gates (from x), the state before every token (from the chunk-entering
state the forward saved) and the adjoint delta (from the cotangent entering from the right), all
in registers. Derivations are in README.md beside this file.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from samu.ops.rglru.triton_fwd import (
    MAX_GROUPS,
    _affine,
    _decay,
    _fold_prefix,
    _gate_dot,
    _last_row,
    _rsqrt,
    _sigmoid,
    _sigmoid_channel,
    _sigmoid_pair,
    _softplus,
    _split_cols,
    _split_rows,
    _sqrt,
    _to_store,
    head_block,
    math_mode,
    new_buffer,
    split_weights,
)


@triton.jit
def _affine_before(p1, w1, l1, p2, w2, l2):
    """h-scan that holds out each segment's last input: (prod a, a_last * h_before_last, b_last).

    For tokens [s, e] entered with h: a_e h_{e-1} = w + p h; a single token t is (a_t, 0, b_t).
    """
    return p1 * p2, p2 * (w1 + l1) + w2, l2


@triton.jit
def _adjoint(q1, l1, v1, q2, l2, v2):
    """delta_r = dy_r + a_{r-1} delta_{r-1} over a chunk laid out last token first.

    A segment is (q = product of a over all but its last row, l = a of its last row, v = delta of
    its last row when entered with 0); a single row r is (1, a_r, dy_r). Entered with
    eps = a delta of the row before the segment: delta = v + q eps.
    """
    return q1 * l1 * q2, l2, v2 + q2 * l1 * v1


@triton.jit(do_not_specialize=["L", "NC", "G", "NG"])
def _rglru_bwd_summary_kernel(
    x,                   # [B, L, D]
    w16, w_inv,          # split gate weights (gate a is used)
    b_a, a_param,        # [D] fp32
    dy,                  # [B, L, D]
    sums,                # [2, B, NG, D] fp32: (P = prod a, E = eps leaving the group entered with 0)
    L, D, n, H, NC, G, NG, c,
    K: tl.constexpr, BN: tl.constexpr, X_PARTS: tl.constexpr, MATH: tl.constexpr,
):
    """Reverse affine summary of eps_t = a_t (dy_t + eps_{t+1}) over one group of chunks.

    Chunks are read last token first, so the reverse recurrence is a forward scan of (a, a dy).
    """
    i_g, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b64 = i_b.to(tl.int64)
    o_j = tl.arange(0, BN)
    o_k = tl.arange(0, K)
    m_j = o_j < n
    o_d = i_h * n + o_j
    b_ba = tl.load(b_a + o_d, mask=m_j, other=0.0)
    b_csp = -c * _softplus(tl.load(a_param + o_d, mask=m_j, other=0.0), MATH)
    o_w = i_h.to(tl.int64) * BN * BN + o_j[:, None] * BN + o_j[None, :]
    b_wah = tl.load(w16 + o_w)
    b_wal = tl.load(w16 + H * BN * BN + o_w)
    b_wainv = tl.load(w_inv + i_h)

    b_e = tl.zeros([BN], dtype=tl.float32)
    b_p = tl.full([BN], 1.0, dtype=tl.float32)
    c_lo = i_g * G
    c_hi = tl.minimum(c_lo + G, NC)
    o_tile = ((K - 1) - o_k)[:, None] * D + o_j[None, :]
    o_base = (i_b64 * L + (c_hi - 1).to(tl.int64) * K) * D + i_h * n
    p_x = x + o_base
    p_dy = dy + o_base
    for i in range(0, c_hi - c_lo):
        m_t = (c_hi - 1 - i) * K + (K - 1) - o_k < L
        m_x = m_t[:, None] & m_j[None, :]
        b_xt = tl.load(p_x + o_tile, mask=m_x, other=0.0).to(tl.float32)       # [K, BN] reversed
        b_dy = tl.load(p_dy + o_tile, mask=m_x, other=0.0).to(tl.float32)
        b_xh, b_xl, b_xinv = _split_rows(b_xt, X_PARTS)
        b_za = _gate_dot(b_xh, b_xl, b_xinv, b_wah, b_wal, b_wainv, X_PARTS) + b_ba[None, :]
        b_at, _ = _decay(b_csp[None, :] * _sigmoid(b_za, MATH), MATH)
        b_at = tl.where(m_t[:, None], b_at, 1.0)
        b_bt = b_at * b_dy
        b_bt = tl.where(o_k[:, None] == 0, b_bt + b_at * b_e[None, :], b_bt)
        b_A, b_E = tl.associative_scan((b_at, b_bt), 0, _affine)
        b_p = b_p * _last_row(b_A, K)
        b_e = _last_row(b_E, K)
        p_x -= K * D
        p_dy -= K * D
    p_s = sums + (i_b64 * NG + i_g) * D + o_d
    tl.store(p_s, b_p, mask=m_j)
    tl.store(p_s + tl.num_programs(2).to(tl.int64) * NG * D, b_e, mask=m_j)


@triton.jit(do_not_specialize=["L", "NC", "G", "NG", "M"])
def _rglru_bwd_kernel(
    x, dy,               # [B, L, D]
    dh_last,             # [B, D] fp32 cotangent of the final state (read when HAS_DH)
    w16, w_inv,          # split gate weights (their transposes serve dx)
    b_a, b_x, a_param,   # [D] fp32
    states,              # [B, NC, D] fp32: state entering each chunk (from the forward)
    sums,                # [2, B, NG, D] fp32 reverse group summaries
    dx,                  # [B, L, D] x.dtype
    dh0,                 # [B, D] fp32 (written when HAS_H0)
    part,                # [B * NG, M] fp32 parameter-gradient partials of each program
    L, D, n, H, NC, G, NG, M, c,
    K: tl.constexpr, BN: tl.constexpr, NGP: tl.constexpr, X_PARTS: tl.constexpr,
    HAS_DH: tl.constexpr, HAS_H0: tl.constexpr, MATH: tl.constexpr,
):
    """One (group of G chunks, head, batch row), walking its chunks last to first."""
    i_g, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b64 = i_b.to(tl.int64)
    o_j = tl.arange(0, BN)
    o_k = tl.arange(0, K)
    m_j = o_j < n
    o_d = i_h * n + o_j
    b_ba = tl.load(b_a + o_d, mask=m_j, other=0.0)
    b_bx = tl.load(b_x + o_d, mask=m_j, other=0.0)
    b_csp = -c * _softplus(tl.load(a_param + o_d, mask=m_j, other=0.0), MATH)

    HBB = H * BN * BN
    o_w = i_h.to(tl.int64) * BN * BN + o_j[:, None] * BN + o_j[None, :]
    b_wah = tl.load(w16 + o_w)
    b_wal = tl.load(w16 + HBB + o_w)
    b_wxh = tl.load(w16 + 2 * HBB + o_w)
    b_wxl = tl.load(w16 + 3 * HBB + o_w)
    b_wainv = tl.load(w_inv + i_h)
    b_wxinv = tl.load(w_inv + H + i_h)

    b_dwa = tl.zeros([BN, BN], dtype=tl.float32)
    b_dwx = tl.zeros([BN, BN], dtype=tl.float32)
    b_dba = tl.zeros([BN], dtype=tl.float32)
    b_dbx = tl.zeros([BN], dtype=tl.float32)
    b_dsp = tl.zeros([BN], dtype=tl.float32)
    b_one = tl.full([K, BN], 1.0, dtype=tl.float32)
    b_zero = tl.zeros([K, BN], dtype=tl.float32)

    # eps entering the group's last chunk from the right: a delta of the next token
    b_e = tl.zeros([BN], dtype=tl.float32)
    if HAS_DH:
        b_e = tl.load(dh_last + i_b64 * D + o_d, mask=m_j, other=0.0)
    if NGP > 1:
        o_r = tl.arange(0, NGP)
        SB = tl.num_programs(2).to(tl.int64) * NG * D
        b_e = _fold_prefix(b_e, sums + i_b64 * NG * D, NG - 1 - o_r, o_r < NG - 1 - i_g, o_d, m_j, D, SB, NGP)

    c_lo = i_g * G
    c_hi = tl.minimum(c_lo + G, NC)
    o_tile = o_k[:, None] * D + o_j[None, :]
    o_tile_r = ((K - 1) - o_k)[:, None] * D + o_j[None, :]
    o_base = (i_b64 * L + (c_hi - 1).to(tl.int64) * K) * D + i_h * n
    p_x = x + o_base
    p_dy = dy + o_base
    p_dx = dx + o_base
    p_st = states + (i_b64 * NC + c_hi - 1) * D + o_d
    for i in range(0, c_hi - c_lo):
        t0 = (c_hi - 1 - i) * K
        m_t = t0 + o_k < L
        m_x = m_t[:, None] & m_j[None, :]
        b_xt = tl.load(p_x + o_tile, mask=m_x, other=0.0).to(tl.float32)       # [K, BN]
        # the cotangent read last token first, for the adjoint scan
        m_xr = (t0 + (K - 1) - o_k < L)[:, None] & m_j[None, :]
        b_dyr = tl.load(p_dy + o_tile_r, mask=m_xr, other=0.0).to(tl.float32)

        # gates, recomputed
        b_xh, b_xl, b_xinv = _split_rows(b_xt, X_PARTS)
        b_za = _gate_dot(b_xh, b_xl, b_xinv, b_wah, b_wal, b_wainv, X_PARTS) + b_ba[None, :]
        b_zx = _gate_dot(b_xh, b_xl, b_xinv, b_wxh, b_wxl, b_wxinv, X_PARTS) + b_bx[None, :]
        b_ga, b_gac = _sigmoid_pair(b_za, MATH)
        b_gx, b_gxc = _sigmoid_pair(b_zx, MATH)
        b_at, b_u = _decay(b_csp[None, :] * b_ga, MATH)
        b_mult = _sqrt(b_u, MATH)
        b_at = tl.where(m_t[:, None], b_at, 1.0)
        b_bt = tl.where(m_t[:, None], b_mult * b_gx * b_xt, 0.0)

        # g_t = a_t h_{t-1}, from the state entering the chunk
        b_hin = tl.load(p_st, mask=m_j, other=0.0)
        b_P, b_W, _ = tl.associative_scan((b_at, b_zero, b_bt), 0, _affine_before)
        b_gt = b_W + b_P * b_hin[None, :]

        # delta_t = dy_t + a_{t+1} delta_{t+1}, entered with eps = a delta of the next chunk's first token
        b_q, _, b_v = tl.associative_scan((b_one, tl.flip(b_at, 0), b_dyr), 0, _adjoint)
        b_delta = tl.flip(b_v + b_q * b_e[None, :], 0)
        b_e = tl.sum(tl.where(o_k[:, None] == 0, b_at * b_delta, 0.0), axis=0)

        # pointwise cotangents; b = multiplier * gate_x * x
        b_dgx = b_delta * b_mult * b_xt
        # Griffin's bounded derivative of sqrt(u): 1 / sqrt(max(4u, 1e-6))
        b_du = b_delta * b_gx * b_xt * _rsqrt(tl.maximum(4.0 * b_u, 1e-6), MATH)
        # u = 1 - exp(2 log a): du/dlog a = -2 a^2
        b_dloga = b_delta * b_gt - 2.0 * b_at * b_at * b_du
        b_dza = tl.where(m_x, b_dloga * b_csp[None, :] * b_ga * b_gac, 0.0)
        b_dzx = tl.where(m_x, b_dgx * b_gx * b_gxc, 0.0)
        b_dba += tl.sum(b_dza, axis=0)
        b_dbx += tl.sum(b_dzx, axis=0)
        b_dsp += tl.sum(tl.where(m_x, b_dloga * b_ga, 0.0), axis=0)

        # dx = delta * multiplier * gate_x + dza w_a^T + dzx w_x^T
        b_dx = b_delta * b_mult * b_gx
        b_dh, b_dl, b_dinv = _split_rows(b_dza, 2)
        b_dx += _gate_dot(b_dh, b_dl, b_dinv, tl.trans(b_wah), tl.trans(b_wal), b_wainv, 2)
        b_dh, b_dl, b_dinv = _split_rows(b_dzx, 2)
        b_dx += _gate_dot(b_dh, b_dl, b_dinv, tl.trans(b_wxh), tl.trans(b_wxl), b_wxinv, 2)
        tl.store(p_dx + o_tile, _to_store(b_dx, dx.dtype.element_ty, MATH), mask=m_x)

        # dW = x^T dz, both split along the token axis
        b_xch, b_xcl, b_xcinv = _split_cols(b_xt, X_PARTS)
        b_xth = tl.trans(b_xch)
        b_xtl = tl.trans(b_xcl)
        b_dh, b_dl, b_dinv = _split_cols(b_dza, 2)
        b_dwa += _gate_dot(b_xth, b_xtl, b_xcinv, b_dh, b_dl, b_dinv[None, :], X_PARTS)
        b_dh, b_dl, b_dinv = _split_cols(b_dzx, 2)
        b_dwx += _gate_dot(b_xth, b_xtl, b_xcinv, b_dh, b_dl, b_dinv[None, :], X_PARTS)
        p_x -= K * D
        p_dy -= K * D
        p_dx -= K * D
        p_st -= D

    p_p = part + (i_b64 * NG + i_g) * M
    m_w = m_j[:, None] & m_j[None, :]
    o_nn = i_h * n * n + o_j[:, None] * n + o_j[None, :]
    tl.store(p_p + o_nn, b_dwa, mask=m_w)
    tl.store(p_p + H * n * n + o_nn, b_dwx, mask=m_w)
    tl.store(p_p + 2 * H * n * n + o_d, b_dba, mask=m_j)
    tl.store(p_p + 2 * H * n * n + D + o_d, b_dbx, mask=m_j)
    tl.store(p_p + 2 * H * n * n + 2 * D + o_d, -c * b_dsp, mask=m_j)
    if HAS_H0:
        if i_g == 0:
            tl.store(dh0 + i_b64 * D + o_d, b_e, mask=m_j)


@triton.jit(do_not_specialize=["NP", "M"])
def _rglru_reduce_kernel(
    part,                # [NP, M] fp32: per program [dW_a (H n n) | dW_x | db_a (D) | db_x | dsoftplus]
    dwa, dwx,            # [H, n, n] fp32
    dba, dbx, da,        # [D] fp32
    a_param,             # [D] fp32
    NP, M, HNN, D,
    BLOCK: tl.constexpr, MATH: tl.constexpr,
):
    """Sum the partials over programs in a fixed order (deterministic); d a_param = dsoftplus * sigma."""
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < M
    b_acc = tl.zeros([BLOCK], dtype=tl.float32)
    p_part = part + o
    for _ in range(0, NP):
        b_acc += tl.load(p_part, mask=m, other=0.0)
        p_part += M
    tl.store(dwa + o, b_acc, mask=o < HNN)
    tl.store(dwx + (o - HNN), b_acc, mask=(o >= HNN) & (o < 2 * HNN))
    o_v = o - 2 * HNN
    tl.store(dba + o_v, b_acc, mask=(o_v >= 0) & (o_v < D))
    tl.store(dbx + (o_v - D), b_acc, mask=(o_v >= D) & (o_v < 2 * D))
    m_a = (o_v >= 2 * D) & m
    b_sig = _sigmoid_channel(tl.load(a_param + (o_v - 2 * D), mask=m_a, other=0.0), MATH)
    tl.store(da + (o_v - 2 * D), b_acc * b_sig, mask=m_a)


def rglru_bwd(dy, dh_last, x, w_a, b_a, w_x, b_x, a_param, has_h0: bool, states, c: float, *, K: int, G: int,
              fast: bool = False, num_warps: int = 4, num_stages: int = 1):
    """Chunked RG-LRU backward.

    dy: [B, L, D] (any float dtype); dh_last: [B, D] fp32 or None; x and the parameters as in the
    forward; has_h0: whether the forward had an initial state (its gradient is then returned);
    states: [B, ceil(L/K), D] fp32 from the forward with the same K. G (chunks per program) is the
    backward's own choice.
    Returns dx [B, L, D] x.dtype, dw_a [H, n, n], db_a [D], dw_x [H, n, n], db_x [D], da [D]
    (all fp32) and dh0 [B, D] fp32 (None without an initial state).
    """
    B, L, D = x.shape
    H, n = w_a.shape[0], w_a.shape[1]
    BN = head_block(n)
    NC = triton.cdiv(L, K)
    assert states.shape == (B, NC, D), "states must come from a forward with the same chunk length"
    NG = triton.cdiv(NC, G)
    assert NG <= MAX_GROUPS, f"{NG} groups of {G} chunks; at most {MAX_GROUPS}"
    NGP = MAX_GROUPS if NG > 1 else 1
    dev = x.device
    X_PARTS = 2 if x.dtype == torch.float32 else 1
    w16, w_inv = split_weights(w_a, w_x)
    dy = dy.contiguous()
    dx = new_buffer((B, L, D), x.dtype, dev)
    dh0 = new_buffer((B, D), torch.float32, dev) if has_h0 else None
    M = 2 * H * n * n + 3 * D
    part = new_buffer((B * NG, M), torch.float32, dev)
    sums = new_buffer((2, B, NG, D), torch.float32, dev) if NG > 1 else part
    grid = (NG, H, B)
    if NG > 1:
        _rglru_bwd_summary_kernel[grid](x, w16, w_inv, b_a, a_param, dy, sums, L, D, n, H, NC, G, NG, float(c),
                                        K=K, BN=BN, X_PARTS=X_PARTS, MATH=math_mode(fast),
                                        num_warps=num_warps, num_stages=num_stages)
    _rglru_bwd_kernel[grid](
        x, dy, dh_last if dh_last is not None else part, w16, w_inv, b_a, b_x, a_param, states,
        sums, dx, dh0 if dh0 is not None else part, part, L, D, n, H, NC, G, NG, M, float(c),
        K=K, BN=BN, NGP=NGP, X_PARTS=X_PARTS, HAS_DH=dh_last is not None, HAS_H0=has_h0,
        MATH=math_mode(fast), num_warps=num_warps, num_stages=num_stages)
    dw_a = new_buffer((H, n, n), torch.float32, dev)
    dw_x = new_buffer((H, n, n), torch.float32, dev)
    db_a = new_buffer((D,), torch.float32, dev)
    db_x = new_buffer((D,), torch.float32, dev)
    da = new_buffer((D,), torch.float32, dev)
    BLOCK = 1024
    _rglru_reduce_kernel[(triton.cdiv(M, BLOCK),)](part, dw_a, dw_x, db_a, db_x, da, a_param, B * NG, M, H * n * n, D,
                                                  BLOCK=BLOCK, MATH=math_mode(fast), num_warps=4)
    return dx, dw_a, db_a, dw_x, db_x, da, dh0
