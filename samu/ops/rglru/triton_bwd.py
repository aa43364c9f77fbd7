"""RG-LRU backward in Triton: adjoint scan, input and parameter gradients (spec §4, §6).

Read bottom-up: ``rglru_bwd`` (host) runs the reverse maps of the adjoint per group of chunks, the
weight-gradient kernel (one tile of output channels per program; it also fixes the adjoint
entering every chunk and d initial_state), the input-gradient kernel (one whole head per program)
and a fixed-order reduction of the parameter-gradient partials. Every chunk is independent given
the state entering it (saved by the forward) and the adjoint entering it, so both main kernels take
WC chunks per step, one per warp, and rebuild per chunk and channel tile the gates (from x), the
state before every token and the adjoint, all in registers. Derivations are in README.md beside
this file. Packed calls (VARLEN) run on the forward's restarted transitions (triton_fwd's module
docstring): the adjoint is cut before every token that opens a sequence, each sequence's final-state
cotangent joins dy where it closes, and where it opens, a_t h_{t-1} is a_t times its initial state and
d initial_state = a_t delta_t.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from samu.ops.rglru.triton_fwd import (
    _boundaries,
    _head_pieces,
    _head_rows,
    _trans3,
    _channel_consts,
    _channel_tile,
    _compose_chunks,
    _decay,
    _flip_tokens,
    _fold_groups,
    _gate_dot,
    _parts_dot,
    _restart,
    _rows,
    _rows_of,
    _rsqrt,
    _sigmoid,
    _sigmoid_channel,
    _sigmoid_pair,
    _scan_affine,
    _split3,
    _tile_ptrs,
    _sqrt,
    _steps,
    _to_scan_layout,
    _to_store,
    _token,
    _walk3,
    chunk_launch,
    group_width,
    launch_staged,
    leaner,
    math_mode,
    new_buffer,
    new_flat,
    out_order,
)
from samu.ops.packing_triton import step_opens
from samu.ops.triton_utils import carve, cdiv


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


@triton.jit
def _scan_before(b_a, b_b, K: tl.constexpr, MATH: tl.constexpr):
    """(prod a, a_t h_{t-1} entered with 0) along the tokens of [BJ, WC, K] tiles (_affine_before)."""
    b_zero = tl.zeros_like(b_a)
    if MATH == 0:
        b_p, b_w, _ = _walk3(b_a, b_zero, b_b, _affine_before, K)
    else:
        b_p, b_w, _ = tl.associative_scan((b_a, b_zero, b_b), 2, _affine_before)
    return b_p, b_w


@triton.jit
def _scan_adjoint(b_af, b_dyf, K: tl.constexpr, MATH: tl.constexpr):
    """(q, v) of _adjoint along the tokens of flipped [BJ, WC, K] tiles (a and dy last token first)."""
    b_one = tl.full(b_af.shape, 1.0, tl.float32)
    if MATH == 0:
        b_q, _, b_v = _walk3(b_one, b_af, b_dyf, _adjoint, K)
    else:
        b_q, _, b_v = tl.associative_scan((b_one, b_af, b_dyf), 2, _adjoint)
    return b_q, b_v


@triton.jit
def _pointwise_cotangents(b_za, b_zx, b_xj, b_dy, b_csp, b_hin, b_e, m_t, K: tl.constexpr, MATH: tl.constexpr, b_h0,
                          words, i_s, L, NC, WC: tl.constexpr, RESTART: tl.constexpr, HAS_H0: tl.constexpr):
    """_chunk_cotangents from the gates' pre-activations b_za, b_zx on: RESTART, the recurrence restarted where
    step i_s's sequences open (found here, after the products: fewer values live through them)."""
    b_ga, b_gac = _sigmoid_pair(b_za, MATH)
    if RESTART:
        # in the scans' layout, as the products' results are: packed, the compiler otherwise runs gate a's
        # chain a second time in the layout the restarted transitions take (README.md, "Packed sequences")
        b_ga = _to_scan_layout(b_ga, MATH)
    # sigma' = sigma (1 - sigma), both factors free of cancellation
    b_pa = b_ga * b_gac
    b_gx, b_gxc = _sigmoid_pair(b_zx, MATH)
    b_px = b_gx * b_gxc
    b_at, b_u = _decay(b_csp[:, None, None] * b_ga, MATH)
    b_mult = _sqrt(b_u, MATH)
    b_at = tl.where(m_t[None, :, :], b_at, 1.0)
    b_bt = tl.where(m_t[None, :, :], b_mult * b_gx * b_xj, 0.0)

    # the scans run on the restarted transitions (packed); the pointwise terms keep the gates' own a
    b_as, b_bs = b_at, b_bt
    if RESTART:
        opens = _boundaries(words, i_s, m_t, L, NC, WC, K)[1]
        b_as, b_bs = _restart(b_at, b_bt, opens, b_h0, HAS_H0)
    # delta_t = dy_t + a_{t+1} delta_{t+1} over each chunk flipped (free: its tokens lie inside a thread), before
    # g_t's scan: after it, packed, the cut transitions stayed beside a through both (dx spilled 60 words, not 16)
    b_q, b_v = _scan_adjoint(_flip_tokens(b_as, K, MATH), _flip_tokens(b_dy, K, MATH), K, MATH)
    # tokens past L carry the adjoint through but contribute nothing: every cotangent below is a
    # multiple of delta (padded channels have delta = 0 already)
    b_delta = tl.where(m_t[None, :, :], _flip_tokens(b_v + b_q * b_e[:, :, None], K, MATH), 0.0)
    # g_t = a_t h_{t-1}, from the state entering the chunk
    b_P, b_W = _scan_before(b_as, b_bs, K, MATH)
    b_gt = b_W + b_P * b_hin[:, :, None]
    if RESTART:
        # where a sequence opens, h_{t-1} is its initial state (or zero)
        if HAS_H0:
            b_gt = tl.where(opens[None, :, :], b_at * b_h0, b_gt)
        else:
            b_gt = tl.where(opens[None, :, :], 0.0, b_gt)

    # pointwise cotangents; b = multiplier * gate_x * x
    b_dm = b_delta * b_mult
    # Griffin's bounded derivative of sqrt(u): 1 / sqrt(max(4u, 1e-6))
    b_du = b_delta * b_gx * b_xj * _rsqrt(tl.maximum(4.0 * b_u, 1e-6), MATH)
    # u = 1 - exp(2 log a): du/dlog a = -2 a^2
    b_dloga = b_delta * b_gt - 2.0 * b_at * b_at * b_du
    return b_dloga * b_csp[:, None, None] * b_pa, b_dm * b_xj * b_px, b_dm * b_gx, b_dloga * b_ga, b_at * b_delta


@triton.jit
def _chunk_cotangents(xa, xb, b_xj, b_dy, wa, wb, b_ba, b_bx, b_csp, b_hin, b_e, m_t, X_PARTS: tl.constexpr,
                      ORDER: tl.constexpr, NPB: tl.constexpr, WC: tl.constexpr, K: tl.constexpr, BJ: tl.constexpr,
                      MATH: tl.constexpr, b_h0, words, i_s, L, NC, VARLEN: tl.constexpr, HAS_H0: tl.constexpr):
    """What WC chunks of one channel tile contribute, as [BJ, WC, K] tiles.

    xa, xb: parts of the head's input rows (two column pieces); wa, wb: the (gate a, gate x) weight
    slabs of the pieces; b_xj, b_dy [BJ, WC, K] fp32: this tile's inputs and
    output cotangents; b_hin [BJ, WC]: the state entering each chunk; b_e [BJ, WC]: eps = a delta
    entering each chunk from the right; ORDER: of the gate products (2 for fp32 results, 1 for dx
    in bf16 or fp16). Returns dza, dzx (gate pre-activation cotangents), the direct input
    cotangent delta * multiplier * gate_x, dlog a * gate_a (for d softplus) and a * delta (d of the
    state before each token: d initial_state where a packed sequence opens). Packed (VARLEN): b_dy
    holds the final-state cotangents already and b_h0 the initial states where sequences open; a step in
    which a sequence opens (step_opens) takes the restarting form, any other step the unpacked one.
    """
    b_za = _to_scan_layout(_gate_dot(xa, xb, wa[0], wb[0], X_PARTS, ORDER, NPB, WC, K, BJ, MATH), MATH)
    b_zx = _to_scan_layout(_gate_dot(xa, xb, wa[1], wb[1], X_PARTS, ORDER, NPB, WC, K, BJ, MATH), MATH)
    b_za += b_ba[:, None, None]
    b_zx += b_bx[:, None, None]
    if VARLEN:
        if step_opens(words, i_s * WC, NC, WC):
            dza, dzx, ddi, dlga, dh = _pointwise_cotangents(b_za, b_zx, b_xj, b_dy, b_csp, b_hin, b_e, m_t, K, MATH,
                                                            b_h0, words, i_s, L, NC, WC, True, HAS_H0)
        else:
            dza, dzx, ddi, dlga, dh = _pointwise_cotangents(b_za, b_zx, b_xj, b_dy, b_csp, b_hin, b_e, m_t, K, MATH,
                                                            b_h0, words, i_s, L, NC, WC, False, HAS_H0)
    else:
        dza, dzx, ddi, dlga, dh = _pointwise_cotangents(b_za, b_zx, b_xj, b_dy, b_csp, b_hin, b_e, m_t, K, MATH,
                                                        b_h0, words, i_s, L, NC, WC, False, HAS_H0)
    return dza, dzx, ddi, dlga, dh


@triton.jit
def _with_final(b_dy, dh_last, words, i_s, m_t, m_j, o_d, L, NC, D: tl.constexpr, WC: tl.constexpr,
                K: tl.constexpr, HAS_DH: tl.constexpr):
    """Packed: dy with each sequence's final-state cotangent added where it closes, and the step's (sequence, opens)
    per token (_chunk_cotangents decodes opens again after the gate products: fewer values live through them)."""
    i_n, opens, closes = _boundaries(words, i_s, m_t, L, NC, WC, K)
    if HAS_DH:
        b_dy = b_dy + _rows_of(dh_last, i_n, o_d, m_j, closes, D)
    return b_dy, i_n, opens


@triton.jit(do_not_specialize=["L", "NC", "G", "NG", "one"])
def _rglru_bwd_summary_kernel(
    x, dy,               # [B, L, D]
    w3,                  # [2, 3, H, NPW, NPW] bf16 weight parts (gate a is used)
    b_a, a_param,        # [D] fp32
    cums,                # [2, B, NC, D] fp32: per chunk, the map (P, E) of eps from its group's end to it
    gsums,               # [2, B, NG, D] fp32: per group, the map through the whole group
    words, dh_last,      # packed (VARLEN): [3, NC] int32 chunk words (packing_triton), [N, D] final-state cotangents
    L, NC, G, NG, c, one,
    D: tl.constexpr, n: tl.constexpr, H: tl.constexpr,
    K: tl.constexpr, WC: tl.constexpr, NPA: tl.constexpr, NPB: tl.constexpr, NPW: tl.constexpr,
    BJ: tl.constexpr, X_PARTS: tl.constexpr,
    MATH: tl.constexpr, VARLEN: tl.constexpr, HAS_DH: tl.constexpr,
):
    """Reverse affine maps of eps_t = a_t (dy_t + eps_{t+1}), eps -> P eps + E, per group.

    Walks the group's steps last to first, carrying the composition from the group's end: for every
    chunk the map from eps entering the group from the right to eps entering the chunk from the
    right (``cums``), and the group's whole map (``gsums``). Each chunk is flipped (last token
    first), so the reverse recurrence is a forward scan of (a, a dy).
    """
    i_g, i_hj, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_h, o_j, m_j, o_d = _channel_tile(i_hj, n, BJ)
    i_b64 = i_b.to(tl.int64)
    o_ia, m_ia, o_ib, m_ib = _head_pieces(n, NPA, NPB)
    o_c = tl.arange(0, WC)
    o_k = tl.arange(0, K)
    o_t = tl.arange(0, WC * K)
    b_ba, b_csp, wa, wb = _channel_consts(b_a, a_param, w3, c, i_h, o_ia, o_ib, o_j, o_d, m_j, NPB, NPW, H, MATH)

    SC = tl.num_programs(2).to(tl.int64) * NC * D
    SG = tl.num_programs(2).to(tl.int64) * NG * D
    s_lo, s_hi = _steps(i_g, G, NC, WC)
    c_end = tl.minimum(s_hi * WC, NC)
    # the group's last chunk is entered (from the right) by the identity map
    b_rP = tl.full([BJ], 1.0, dtype=tl.float32)
    b_rE = tl.zeros([BJ], dtype=tl.float32)
    p_c = cums + (i_b64 * NC + c_end - 1) * D + o_d
    tl.store(p_c, b_rP, mask=m_j)
    tl.store(p_c + SC, b_rE, mask=m_j)

    o_base = (i_b64 * L + (s_hi - 1).to(tl.int64) * (WC * K)) * D + i_h * n
    p_x = x + o_base
    p_dy = dy + o_base
    for i in range(0, s_hi - s_lo):
        i_s = s_hi - 1 - i
        t0 = i_s * (WC * K)
        m_t = t0 + o_c[:, None] * K + o_k[None, :] < L                                 # [WC, K]
        xa, xb = _head_rows(p_x, o_t, t0 + o_t < L, o_ia, m_ia, o_ib, m_ib, D, NPB, X_PARTS)
        b_dy = tl.load(_tile_ptrs(p_dy, o_c, o_j, one, K, D), mask=m_j[:, None, None] & m_t[None, :, :],
                       other=0.0).to(tl.float32)
        b_za = _gate_dot(xa, xb, wa[0], wb[0], X_PARTS, 2, NPB, WC, K, BJ, MATH) + b_ba[:, None, None]
        b_at, _ = _decay(b_csp[:, None, None] * _sigmoid(b_za, MATH), MATH)
        if VARLEN:
            b_dy, _, opens = _with_final(b_dy, dh_last, words, i_s, m_t, m_j, o_d, L, NC, D, WC, K, HAS_DH)
            b_at = tl.where(opens[None, :, :], 0.0, b_at)
        # tokens past L are identities; they come first once flipped
        b_at = _flip_tokens(tl.where(m_t[None, :, :], b_at, 1.0), K, MATH)
        b_A, b_E = _scan_affine(b_at, b_at * _flip_tokens(b_dy, K, MATH), K, MATH)
        b_P, b_E = _compose_chunks(_token(b_A, K - 1, K), _token(b_E, K - 1, K), b_rP, b_rE, BJ, WC, True, MATH)
        # the map through chunk c is the one entering chunk c - 1 from the right: stored one chunk over
        i_c = i_s * WC + o_c
        o_s = (i_b64 * NC + i_c)[None, :] * D + o_d[:, None]                           # [BJ, WC]
        m_p = m_j[:, None] & ((i_c - 1 >= s_lo * WC) & (i_c - 1 < NC))[None, :]
        tl.store(cums + o_s - D, b_P, mask=m_p)
        tl.store(cums + SC + o_s - D, b_E, mask=m_p)
        b_rP = tl.sum(tl.where(o_c[None, :] == 0, b_P, 0.0), axis=1)
        b_rE = tl.sum(tl.where(o_c[None, :] == 0, b_E, 0.0), axis=1)
        p_x -= WC * K * D
        p_dy -= WC * K * D
    p_g = gsums + (i_b64 * NG + i_g) * D + o_d
    tl.store(p_g, b_rP, mask=m_j)
    tl.store(p_g + SG, b_rE, mask=m_j)


@triton.jit(do_not_specialize=["L", "NC", "G", "NG", "one"])
def _rglru_bwd_dw_kernel(
    x, dy,               # [B, L, D]
    w3,                  # [2, 3, H, NPW, NPW] bf16 weight parts
    b_a, b_x, a_param,   # [D] fp32
    states,              # [B, NC, D] fp32: the state entering every chunk (from the forward)
    dh_last,             # [B, D] fp32 cotangent of the final state (when HAS_DH; packed, [N, D])
    cums, gsums,         # reverse maps per chunk and per group (from _rglru_bwd_summary_kernel)
    estates,             # [B, NC, D] fp32: eps entering every chunk from the right (written)
    dh0,                 # [B, D] fp32 (written when HAS_H0; packed, [N, D])
    part,                # [B * NG, M] fp32 parameter-gradient partials of each program
    words, h0,           # packed (VARLEN): [3, NC] int32 chunk words (packing_triton), [N, D] initial states
    L, NC, G, NG, c, one,
    D: tl.constexpr, n: tl.constexpr, H: tl.constexpr, M: tl.constexpr,
    K: tl.constexpr, WC: tl.constexpr, NPA: tl.constexpr, NPB: tl.constexpr, NPW: tl.constexpr,
    BJ: tl.constexpr, NGP: tl.constexpr,
    X_PARTS: tl.constexpr, HAS_DH: tl.constexpr, HAS_H0: tl.constexpr, MATH: tl.constexpr, VARLEN: tl.constexpr,
):
    """Weight, bias and decay gradients of one (group of G steps of WC chunks, head x channel tile,
    batch row): dW[:, J] accumulates x^T dz over the WC K tokens of every step on tensor cores.

    eps entering each chunk from the right is its reverse map applied to eps entering the group
    (the maps of the groups after it applied to dh_last); it is saved for the dx kernel. The
    first group also applies every group's map: eps leaving the sequence, d(initial_state).
    """
    i_g, i_hj, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_h, o_j, m_j, o_d = _channel_tile(i_hj, n, BJ)
    i_b64 = i_b.to(tl.int64)
    o_ia, m_ia, o_ib, m_ib = _head_pieces(n, NPA, NPB)
    o_c = tl.arange(0, WC)
    o_k = tl.arange(0, K)
    o_t = tl.arange(0, WC * K)
    b_ba, b_csp, wa, wb = _channel_consts(b_a, a_param, w3, c, i_h, o_ia, o_ib, o_j, o_d, m_j, NPB, NPW, H, MATH)
    b_bx = tl.load(b_x + o_d, mask=m_j, other=0.0)

    # dW[:, J] per gate and head piece
    b_dwa = tl.zeros([NPA, BJ], dtype=tl.float32)
    b_dwx = tl.zeros([NPA, BJ], dtype=tl.float32)
    if NPB > 0:
        b_dwa_b = tl.zeros([NPB, BJ], dtype=tl.float32)
        b_dwx_b = tl.zeros([NPB, BJ], dtype=tl.float32)
    # per (channel, chunk of the step): the sum over chunks crosses warps, so it waits for the end
    b_dba = tl.zeros([BJ, WC], dtype=tl.float32)
    b_dbx = tl.zeros([BJ, WC], dtype=tl.float32)
    b_dsp = tl.zeros([BJ, WC], dtype=tl.float32)

    # eps entering the group from the right
    SC = tl.num_programs(2).to(tl.int64) * NC * D
    SG = tl.num_programs(2).to(tl.int64) * NG * D
    b_eg = tl.zeros([BJ], dtype=tl.float32)
    # packed, the final-state cotangents join dy where their sequences close, and d initial_state is
    # taken where they open
    DH_RIGHT: tl.constexpr = HAS_DH and not VARLEN
    H0_LEFT: tl.constexpr = HAS_H0 and not VARLEN
    if DH_RIGHT:
        b_eg = tl.load(dh_last + i_b64 * D + o_d, mask=m_j, other=0.0)
    if NGP > 1:
        o_r = tl.arange(0, NGP)
        p_g = gsums + i_b64 * NG * D
        if H0_LEFT:
            if i_g == 0:
                b_all = _fold_groups(b_eg, p_g, SG, NG - 1 - o_r, o_r < NG, o_d, m_j, D, BJ, NGP, MATH)
                tl.store(dh0 + i_b64 * D + o_d, b_all, mask=m_j)
        b_eg = _fold_groups(b_eg, p_g, SG, NG - 1 - o_r, o_r < NG - 1 - i_g, o_d, m_j, D, BJ, NGP, MATH)
    elif H0_LEFT:
        p_g = gsums + i_b64 * NG * D + o_d
        tl.store(dh0 + i_b64 * D + o_d, tl.load(p_g, mask=m_j, other=1.0) * b_eg
                 + tl.load(p_g + SG, mask=m_j, other=0.0), mask=m_j)

    s_lo, s_hi = _steps(i_g, G, NC, WC)
    o_base = (i_b64 * L + s_lo.to(tl.int64) * (WC * K)) * D + i_h * n
    p_x = x + o_base
    p_dy = dy + o_base
    for i_s in range(s_lo, s_hi):
        t0 = i_s * (WC * K)
        m_t = t0 + o_c[:, None] * K + o_k[None, :] < L                                 # [WC, K]
        m_x = m_j[:, None, None] & m_t[None, :, :]
        xa, xb = _head_rows(p_x, o_t, t0 + o_t < L, o_ia, m_ia, o_ib, m_ib, D, NPB, X_PARTS)
        b_xj = tl.load(_tile_ptrs(p_x, o_c, o_j, one, K, D), mask=m_x, other=0.0).to(tl.float32)
        b_dy = tl.load(_tile_ptrs(p_dy, o_c, o_j, one, K, D), mask=m_x, other=0.0).to(tl.float32)
        b_h0 = b_dy
        if VARLEN and (HAS_DH or HAS_H0):
            b_dy, i_n, opens = _with_final(b_dy, dh_last, words, i_s, m_t, m_j, o_d, L, NC, D, WC, K, HAS_DH)
            if HAS_H0:
                b_h0 = _rows_of(h0, i_n, o_d, m_j, opens, D)
        o_s = (i_b64 * NC + i_s * WC + o_c)[None, :] * D + o_d[:, None]                # [BJ, WC]
        m_s = m_j[:, None] & (i_s * WC + o_c < NC)[None, :]
        b_hin = tl.load(states + o_s, mask=m_s, other=0.0)
        b_e = tl.load(cums + o_s, mask=m_s, other=1.0) * b_eg[:, None] + tl.load(cums + SC + o_s, mask=m_s,
                                                                                 other=0.0)
        tl.store(estates + o_s, b_e, mask=m_s)
        b_dza, b_dzx, _, b_dlga, b_dh = _chunk_cotangents(xa, xb, b_xj, b_dy, wa, wb, b_ba, b_bx, b_csp, b_hin, b_e,
                                                          m_t, X_PARTS, 2, NPB, WC, K, BJ, MATH, b_h0, words, i_s,
                                                          L, NC, VARLEN, HAS_H0)
        if VARLEN:
            if HAS_H0:
                tl.store(dh0 + i_n[None, :, :].to(tl.int64) * D + o_d[:, None, None], b_dh,
                         mask=m_j[:, None, None] & opens[None, :, :])
        b_dba += tl.sum(b_dza, axis=2)
        b_dbx += tl.sum(b_dzx, axis=2)
        b_dsp += tl.sum(b_dlga, axis=2)
        # dW[:, J] += x^T dz over the step's tokens: x in its exact parts, dz in three bf16 parts.
        # Each step's product starts from zero and joins the running sum by an fp32 add: the tensor
        # cores truncate when they accumulate, so a running sum kept in their accumulator drifts
        # with the number of steps (measured: d w_a outside the fp32 rule at L = 131,072)
        dza = _split3(_rows(b_dza, WC, K, BJ))
        dzx = _split3(_rows(b_dzx, WC, K, BJ))
        xat = _trans3(xa)
        b_dwa += _parts_dot(xat, dza, tl.zeros_like(b_dwa), X_PARTS, 3, 2, MATH)
        b_dwx += _parts_dot(xat, dzx, tl.zeros_like(b_dwx), X_PARTS, 3, 2, MATH)
        if NPB > 0:
            xbt = _trans3(xb)
            b_dwa_b += _parts_dot(xbt, dza, tl.zeros_like(b_dwa_b), X_PARTS, 3, 2, MATH)
            b_dwx_b += _parts_dot(xbt, dzx, tl.zeros_like(b_dwx_b), X_PARTS, 3, 2, MATH)
        p_x += WC * K * D
        p_dy += WC * K * D

    p_p = part + (i_b64 * NG + i_g) * M
    o_nn = i_h * n * n + o_ia[:, None] * n + o_j[None, :]
    tl.store(p_p + o_nn, b_dwa, mask=m_ia[:, None] & m_j[None, :])
    tl.store(p_p + H * n * n + o_nn, b_dwx, mask=m_ia[:, None] & m_j[None, :])
    if NPB > 0:
        o_nn = i_h * n * n + o_ib[:, None] * n + o_j[None, :]
        tl.store(p_p + o_nn, b_dwa_b, mask=m_ib[:, None] & m_j[None, :])
        tl.store(p_p + H * n * n + o_nn, b_dwx_b, mask=m_ib[:, None] & m_j[None, :])
    tl.store(p_p + 2 * H * n * n + o_d, tl.sum(b_dba, axis=1), mask=m_j)
    tl.store(p_p + 2 * H * n * n + D + o_d, tl.sum(b_dbx, axis=1), mask=m_j)
    tl.store(p_p + 2 * H * n * n + 2 * D + o_d, -c * tl.sum(b_dsp, axis=1), mask=m_j)


@triton.jit
def _start(acc, FRESH: tl.constexpr):
    """The accumulator a chain of products starts from: zeros when the chain is summed apart (FRESH)."""
    if FRESH:
        return tl.zeros_like(acc)
    else:
        return acc


@triton.jit
def _joined(acc, chain, FRESH: tl.constexpr):
    """acc after a chain of products that started from ``_start(acc, FRESH)``."""
    if FRESH:
        return acc + chain
    else:
        return chain


@triton.jit
def _input_grad(dza, dzx, ddi, w, o_i, o_j, acc, ORDER: tl.constexpr, MATH: tl.constexpr):
    """acc [WC K, len(o_i)] + dza @ w_a^T + dzx @ w_x^T + direct @ E over one channel tile, for the
    head columns o_i (w: the piece's (gate a, gate x) slabs; the cotangents in three parts each)."""
    acc = _parts_dot(dza, _trans3(w[0]), acc, 3, 3, ORDER, MATH)
    acc = _parts_dot(dzx, _trans3(w[1]), acc, 3, 3, ORDER, MATH)
    b_eye = tl.where(o_i[None, :] == o_j[:, None], 1.0, 0.0).to(tl.bfloat16)
    return _parts_dot(ddi, (b_eye, b_eye, b_eye), acc, 3, 1, ORDER, MATH)


@triton.jit(do_not_specialize=["L", "NC", "G", "one"])
def _rglru_bwd_dx_kernel(
    x, dy,               # [B, L, D]
    w3,                  # [2, 3, H, NPW, NPW] bf16 weight parts (their transposes serve dx)
    b_a, b_x, a_param,   # [D] fp32
    states,              # [B, NC, D] fp32: the state entering every chunk (from the forward)
    estates,             # [B, NC, D] fp32: eps entering every chunk from the right
    dx,                  # [B, L, D] x.dtype
    words, dh_last, h0,  # packed (VARLEN): [3, NC] int32 chunk words, final-state cotangents [N, D], initial states
    L, NC, G, c, one,
    D: tl.constexpr, n: tl.constexpr, H: tl.constexpr,
    K: tl.constexpr, WC: tl.constexpr, NPA: tl.constexpr, NPB: tl.constexpr, NPW: tl.constexpr,
    BJ: tl.constexpr, X_PARTS: tl.constexpr,
    DX_ORDER: tl.constexpr, MATH: tl.constexpr, VARLEN: tl.constexpr, HAS_DH: tl.constexpr, HAS_H0: tl.constexpr,
):
    """dx of one (range of G steps of WC chunks, head, batch row): per step, the cotangents of each
    channel tile in turn, folded into the head's input-gradient tile ([WC K, NPA] and [WC K, NPB]
    for the two column pieces) on tensor cores.

    dx = direct + dza w_a^T + dzx w_x^T; the direct term (a channel to itself) enters through a
    product with an identity slab, so every term accumulates in the same tile.
    """
    i_g, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    NJ: tl.constexpr = (n + BJ - 1) // BJ
    i_b64 = i_b.to(tl.int64)
    o_ia, m_ia, o_ib, m_ib = _head_pieces(n, NPA, NPB)
    o_jt = tl.arange(0, BJ)
    o_c = tl.arange(0, WC)
    o_k = tl.arange(0, K)
    o_t = tl.arange(0, WC * K)
    s_lo, s_hi = _steps(i_g, G, NC, WC)
    o_base = (i_b64 * L + s_lo.to(tl.int64) * (WC * K)) * D + i_h * n
    p_x = x + o_base
    p_dy = dy + o_base
    p_dx = dx + o_base
    for i_s in range(s_lo, s_hi):
        t0 = i_s * (WC * K)
        m_t = t0 + o_c[:, None] * K + o_k[None, :] < L                                 # [WC, K]
        m_r = t0 + o_t < L
        xa, xb = _head_rows(p_x, o_t, m_r, o_ia, m_ia, o_ib, m_ib, D, NPB, X_PARTS)
        b_dx = tl.zeros([WC * K, NPA], dtype=tl.float32)
        if NPB > 0:
            b_dx_b = tl.zeros([WC * K, NPB], dtype=tl.float32)
        for i_j in range(0, NJ):
            o_j = i_j * BJ + o_jt
            m_j = o_j < n
            m_x = m_j[:, None, None] & m_t[None, :, :]
            o_d = i_h * n + o_j
            b_ba, b_csp, wa, wb = _channel_consts(b_a, a_param, w3, c, i_h, o_ia, o_ib, o_j, o_d, m_j, NPB, NPW, H,
                                                  MATH)
            b_bx = tl.load(b_x + o_d, mask=m_j, other=0.0)
            b_xj = tl.load(_tile_ptrs(p_x + i_j * BJ, o_c, o_jt, one, K, D), mask=m_x, other=0.0).to(tl.float32)
            b_dy = tl.load(_tile_ptrs(p_dy + i_j * BJ, o_c, o_jt, one, K, D), mask=m_x, other=0.0).to(tl.float32)
            b_h0 = b_dy
            if VARLEN and (HAS_DH or HAS_H0):
                b_dy, i_n, opens = _with_final(b_dy, dh_last, words, i_s, m_t, m_j, o_d, L, NC, D, WC, K, HAS_DH)
                if HAS_H0:
                    b_h0 = _rows_of(h0, i_n, o_d, m_j, opens, D)
            o_s = (i_b64 * NC + i_s * WC + o_c)[None, :] * D + o_d[:, None]            # [BJ, WC]
            m_s = m_j[:, None] & (i_s * WC + o_c < NC)[None, :]
            b_hin = tl.load(states + o_s, mask=m_s, other=0.0)
            b_e = tl.load(estates + o_s, mask=m_s, other=0.0)
            b_dza, b_dzx, b_direct, _, _ = _chunk_cotangents(xa, xb, b_xj, b_dy, wa, wb, b_ba, b_bx, b_csp, b_hin,
                                                             b_e, m_t, X_PARTS, DX_ORDER, NPB, WC, K, BJ, MATH,
                                                             b_h0, words, i_s, L, NC, VARLEN, HAS_H0)
            # dx += dz w^T over this tile's channels (ORDER 1 keeps ~2^-16, enough for bf16 / fp16 dx);
            # the direct term enters through the identity slab E[j, i] = [i == channel j] (exact: one part)
            dza = _split3(_rows(b_dza, WC, K, BJ))
            dzx = _split3(_rows(b_dzx, WC, K, BJ))
            ddi = _split3(_rows(b_direct, WC, K, BJ))
            # fp32 dx: each tile's products start from zero and join by an fp32 add, since the tensor
            # cores truncate as they accumulate and the error grew with the tile count (H200: 1.1e-6,
            # 1.5e-6, 1.9e-6 at head dims 96, 128, 160); bf16 / fp16 dx, far coarser, chain them
            FRESH: tl.constexpr = DX_ORDER == 2
            b_dx = _joined(b_dx, _input_grad(dza, dzx, ddi, wa, o_ia, o_j, _start(b_dx, FRESH), DX_ORDER, MATH), FRESH)
            if NPB > 0:
                b_dx_b = _joined(b_dx_b, _input_grad(dza, dzx, ddi, wb, o_ib, o_j, _start(b_dx_b, FRESH), DX_ORDER,
                                                     MATH), FRESH)
        p_r = p_dx + o_t[:, None] * D
        tl.store(p_r + o_ia[None, :], _to_store(b_dx, dx.dtype.element_ty, MATH), mask=m_r[:, None] & m_ia[None, :])
        if NPB > 0:
            tl.store(p_r + o_ib[None, :], _to_store(b_dx_b, dx.dtype.element_ty, MATH),
                     mask=m_r[:, None] & m_ib[None, :])
        p_x += WC * K * D
        p_dy += WC * K * D
        p_dx += WC * K * D


@triton.jit(do_not_specialize=["n_rows", "M"])
def _rglru_reduce_kernel(
    part,                # [n_rows, M] fp32: per program [dW_a (H n n) | dW_x | db_a (D) | db_x | dsoftplus]
    dwa, dwx,            # [H, n, n] fp32
    dba, dbx, da,        # [D] fp32
    a_param,             # [D] fp32
    n_rows, M, HNN, D,
    BLOCK: tl.constexpr, MATH: tl.constexpr,
):
    """Sum the partials over programs in a fixed order (deterministic); d a_param = dsoftplus * sigma."""
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < M
    b_acc = tl.zeros([BLOCK], dtype=tl.float32)
    p_part = part + o
    for _ in range(0, n_rows):
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


def rglru_bwd(dy, dh_last, x, w_a, b_a, w_x, b_x, a_param, has_h0: bool, states, c: float, *, K: int, WC: int,
              G: int, G_dx: int, w3, WC_dx: int = 0, fast: bool = False, words=None, h0=None):
    """Chunked RG-LRU backward.

    dy: [B, L, D] (any float dtype); dh_last: [B, D] fp32 or None; x and the parameters as in the
    forward; has_h0: whether the forward had an initial state (its gradient is then returned);
    states: [B, ceil(L/K), D] fp32 from the forward with the same K. WC: chunks per step (one per
    warp); G: steps per group of the reverse maps and the weight-gradient kernel; G_dx: steps per
    program of the dx kernel, whose steps take WC_dx chunks (0: WC; it needs no groups).
    Returns dx [B, L, D] x.dtype, dw_a [H, n, n], db_a [D], dw_x [H, n, n], db_x [D], da [D]
    (all fp32) and dh0 [B, D] fp32 (None without an initial state). Packed (``words`` as the forward's, B = 1):
    dh_last, h0 (the forward's initial state, needed when has_h0) and dh0 are [N, D]. ``w3``: the forward's
    split_weights of w_a and w_x.
    """
    B, L, D = x.shape
    varlen = words is not None
    H, n = w_a.shape[0], w_a.shape[1]
    NC = cdiv(L, K)
    assert states.shape == (B, NC, D), "states must come from a forward with the same chunk length"
    dev = x.device
    MATH = math_mode(fast)
    dy = dy.contiguous()
    grid, meta = chunk_launch(x, H, K, WC, G, MATH=MATH)
    NG = grid[0]
    M = 2 * H * n * n + 3 * D
    cums, gsums, estates, part = carve(new_flat, dev, (2, B, NC, D), (2, B, NG, D), (B, NC, D), (B * NG, M))
    dh = dh_last if dh_last is not None else cums
    words_arg = words if varlen else cums
    h0_arg = h0 if varlen and has_h0 else cums
    launch_staged(_rglru_bwd_summary_kernel, grid, x, dy, w3, b_a, a_param, cums, gsums, words_arg, dh, L, NC, G, NG,
                  float(c), 1, VARLEN=varlen, HAS_DH=dh_last is not None, **leaner("bwd_summary", meta, x.dtype))
    dh0 = new_buffer((h0.shape[0] if varlen else B, D), torch.float32, dev) if has_h0 else None
    launch_staged(_rglru_bwd_dw_kernel, grid, x, dy, w3, b_a, b_x, a_param, states, dh, cums, gsums, estates,
                  dh0 if has_h0 else part, part, words_arg, h0_arg, L, NC, G, NG, float(c), 1,
                  M=M, NGP=group_width(NG), HAS_DH=dh_last is not None, HAS_H0=has_h0, VARLEN=varlen,
                  **leaner("dw", meta, x.dtype))
    dx = new_buffer((B, L, D), x.dtype, dev)
    grid_dx, meta_dx = chunk_launch(x, H, K, WC_dx or WC, G_dx, grouped=False, MATH=MATH,
                                    DX_ORDER=out_order(x.dtype))
    launch_staged(_rglru_bwd_dx_kernel, (grid_dx[0], H, B), x, dy, w3, b_a, b_x, a_param, states, estates, dx,
                  words_arg, dh, h0_arg, L, NC, G_dx, float(c), 1, VARLEN=varlen, HAS_DH=dh_last is not None,
                  HAS_H0=has_h0, **meta_dx)
    dw_a = new_buffer((H, n, n), torch.float32, dev)
    dw_x = new_buffer((H, n, n), torch.float32, dev)
    db_a = new_buffer((D,), torch.float32, dev)
    db_x = new_buffer((D,), torch.float32, dev)
    da = new_buffer((D,), torch.float32, dev)
    BLOCK = 1024
    launch_staged(_rglru_reduce_kernel, (cdiv(M, BLOCK),), part, dw_a, dw_x, db_a, db_x, da, a_param, B * NG, M,
                  H * n * n, D, BLOCK=BLOCK, MATH=MATH, num_warps=4)
    return dx, dw_a, db_a, dw_x, db_x, da, dh0
