"""SAMU backward in Triton (spec §3.1): adjoint summaries, reverse prefix, replay, reductions.

Kernels, in launch order:
  _adjoint_summary_kernel  per chunk: the map of delta_t = conj(lambda_{t+1}) delta_{t+1} + g_t over it
                           (and the chunk's trig planes); then, by the last programs to finish
                           (triton_fwd._prefix_tail, reverse), the group-local and outer prefixes of those
                           maps: the adjoint entering every chunk from its right
  _main_kernel             persistent; per (chunk, mode tile): delta walked right to left into a
                           per-program slot, then h_{t-1} walked left to right beside it; writes the
                           per-token controller partials and per-mode partial sums
  _controller_kernel       fixed-order sum of the controller partials over mode tiles -> dp, dA partials
  _dx_kernel               delta again; dx = gamma delta + dp . u_hat and the direction-gradient partials
  _reduce_kernel           fixed-order sums over all partial rows -> parameter gradients
Packed calls (VARLEN, the chunk words of packing_triton.chunk_boundaries) cut the adjoint where the next
token opens a sequence, add each sequence's final-state cotangent where it closes, and take h_{t-1} = the
sequence's initial state where it opens.
Extra layouts (fp32): rsum, rck [B, nC, 2, D], rgroups [B, nG, 2, D], right [B, nG, D] mirror csum, ck,
groups, start (and the forward's prefix counters serve again);
slots [n_slots, K, 2 main_BN]; part [B, 2, ceil(N / main_BN), L] (the main kernel's mode tiles); dp [B, 2, L];
trig [B, 2, L] (cos phi, sin phi, rebuilt from the saved phi by the adjoint summaries);
rows [B * nC, 3 D] = (w dL/dw | dL/dpsi | du_0 | du_1) partials; dA_rows [*, 4].
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from samu.ops.packing_triton import chunk_word, first_sequence, last_sequence, opens_in, sequence_after, sequence_before
from samu.ops.samu.triton_fwd import (CTL, _both, _cfma, _clamp, _controls_of, _entering, _fetch_controls, _fetch_pair,
                                      _fetch_token, _gamma, _gamma_squared, _input_of, _load_modes, _load_pair,
                                      _mode_row, _prefix_tail, _restart, _store_modes, _store_pair, _store_quad,
                                      _transition, prefix_buffers, prefix_shapes)
from samu.ops.triton_utils import carve, cdiv, exp_flushed, launch, prefetch_l2, tanh


# tokens between a prefetch into L2 (_prefetch_token) and the walk's load of the same tile
PREFETCH_AHEAD = tl.constexpr(8)


@triton.jit
def _prefetch_token(x, i_b, t, i_j, L, N, D, BN: tl.constexpr):
    """Token t's complex tile (batch row i_b, mode tile i_j of x, fused coordinates; t clamped into [0, L)) into
    L2, PREFETCH_AHEAD tokens before the main backward's walks load it: one prefetch a 128-byte line, cut at the
    tile's last mode."""
    LINE: tl.constexpr = 1024 // x.dtype.element_ty.primitive_bitwidth   # elements a line
    p = x + (i_b.to(tl.int64) * L + _clamp(t, L)) * D + i_j * BN
    last = tl.minimum(BN, N - i_j * BN) - 1
    for j in tl.static_range(0, BN, LINE):
        q = p + tl.minimum(j, last)
        prefetch_l2(q)
        prefetch_l2(q + N)


@triton.jit
def _adjoint_of(m, c, s, b_gr, b_gi, t, L, mask_n, b_rate, b_ch, b_cl, b_sh, b_sl,
                bits, k, n, dfinal, i_n, N, D, K: tl.constexpr, VARLEN: tl.constexpr, HAS_DF: tl.constexpr):
    """conj(lambda_{t+1}) (identity from L on) and g_t, from token t + 1's fetched controls and token t's
    fetched dy tile (triton_fwd._fetch_controls, _fetch_pair). Packed (VARLEN; token t is token k of its
    chunk, whose opening bits are ``bits``, and belongs to sequence n): zero where token t + 1 opens a
    sequence, and g_t gains the final-state cotangent of the sequence token t closes."""
    nxt = t + 1 < L
    m, cphi, sphi = _controls_of(m, c, s, nxt)
    _, _, b_lr, b_li = _transition(m, cphi, sphi, b_rate, b_ch, b_cl, b_sh, b_sl)
    b_ar = tl.where(nxt, b_lr, 1.0)
    b_ai = tl.where(nxt, -b_li, 0.0)
    b_gr = b_gr.to(tl.float32)
    b_gi = b_gi.to(tl.float32)
    if VARLEN:
        cut = nxt & opens_in(bits, k + 1)
        b_ar = tl.where(cut, 0.0, b_ar)
        b_ai = tl.where(cut, 0.0, b_ai)
        if HAS_DF:
            closes = (t < L) & ((t == L - 1) | cut)
            b_fr, b_fi = _load_pair(dfinal, n.to(tl.int64) * D + i_n, N, _both(mask_n, closes))
            b_gr += b_fr
            b_gi += b_fi
    return b_ar, b_ai, b_gr, b_gi


@triton.jit
def _fetch_projections(p_p, p_dp, t, L):
    """Token t's dp_0, dp_1 and projections p_0, p_1 as loaded (clamped index), for the dx walk."""
    tc = _clamp(t, L)
    return tl.load(p_dp + tc), tl.load(p_dp + L + tc), tl.load(p_p + tc), tl.load(p_p + L + tc)


@triton.jit
def _walk_words(words, i_c, n_chunks, K: tl.constexpr, VARLEN: tl.constexpr):
    """For a right-to-left walk of chunk i_c, packed: its opening bits with the next chunk's first one
    (packing_triton.chunk_word) and the sequence of its last token; zeros unpacked."""
    bits, n = 0, 0
    if VARLEN:
        bits = chunk_word(words, i_c, n_chunks, K)
        n = last_sequence(words, i_c, n_chunks)
    return bits, n


@triton.jit
def _adjoint_summary_kernel(dy, ctl, trig, nu, theta_log, modes, rsum, rck, rgroups, right, init, count, words, dfinal,
                            L, D, N, n_chunks, G, K: tl.constexpr, BN: tl.constexpr, U: tl.constexpr,
                            VARLEN: tl.constexpr, HAS_DF: tl.constexpr, HAS_INIT: tl.constexpr):
    """Map (Q, F) from the adjoint entering chunk i_c from its right to the adjoint at its first token, then the
    prefix over the chunks from the right (triton_fwd._prefix_tail, REVERSE: rck, rgroups, right from the final
    state's cotangent ``init``).

    The forward's trig planes are not saved (spec §3.1): every program evaluates cos and sin of phi for the K
    tokens whose lambda its walk takes (the chunk's second token to the next chunk's first), one token a lane,
    and writes them to trig, for its own walk after a barrier and for the later kernels. Lanes past L take
    token 0: no walk of this kernel needs it, but the main backward and dx do (lambda_0), and only those lanes
    write it (the last chunk always has one, as n_chunks * K >= L). The programs of a chunk's mode tiles write
    the same values: the controller's functions on the same fp32 phi, so the values the forward used. The walk
    also fetches tokens another program writes (its chunk's first token and the one before), never using them.
    The mode table is not saved either: these programs evaluate their tile's modes (_mode_row), and the first
    chunk's write them to ``modes`` for the main backward and dx (the forward's table, the same functions)."""
    i_c, i_j, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_n = i_j * BN + tl.arange(0, BN)
    mask_n = i_n < N
    b_rate, b_ch, b_cl, b_sh, b_sl = _mode_row(nu, theta_log, i_n, mask_n)
    if (i_c == 0) & (i_b == 0):
        _store_modes(modes, i_n, mask_n, N, b_rate, b_ch, b_cl, b_sh, b_sl)
    p_m = ctl + i_b.to(tl.int64) * CTL * L + 2 * L
    p_c = trig + i_b.to(tl.int64) * 2 * L
    i_t = i_c * K + 1 + tl.arange(0, K)
    i_t = tl.where(i_t < L, i_t, 0)
    b_phi = tl.load(p_m + L + i_t)
    tl.store(p_c + i_t, tl.cos(b_phi))
    tl.store(p_c + L + i_t, tl.sin(b_phi))
    tl.debug_barrier()  # this program's trig stores seen by all its threads' loads below
    t = i_c * K + K - 1
    p_g = dy + (i_b.to(tl.int64) * L + t) * D + i_n
    b_qr = tl.full([BN], 1.0, dtype=tl.float32)
    b_qi = tl.zeros([BN], dtype=tl.float32)
    b_fr = tl.zeros([BN], dtype=tl.float32)
    b_fi = tl.zeros([BN], dtype=tl.float32)
    bits, n = _walk_words(words, i_c, n_chunks, K, VARLEN)
    # token t + 1's controls (mr, cr, sr: for lambda_{t+1}); token t's controls and dy fetched a token ahead
    mr, cr, sr = _fetch_controls(p_m, p_c, t + 1, L)
    m1, c1, s1, b_gr1, b_gi1 = _fetch_token(p_g, p_m, p_c, t, L, N, mask_n)
    for j in tl.range(K, loop_unroll_factor=U):
        k = K - 1 - j
        m0, c0, s0, b_gr0, b_gi0 = m1, c1, s1, b_gr1, b_gi1
        m1, c1, s1, b_gr1, b_gi1 = _fetch_token(p_g - D, p_m, p_c, t - 1, L, N, mask_n)
        b_ar, b_ai, b_gr, b_gi = _adjoint_of(mr, cr, sr, b_gr0, b_gi0, t, L, mask_n, b_rate, b_ch, b_cl, b_sh, b_sl,
                                             bits, k, n, dfinal, i_n, N, D, K, VARLEN, HAS_DF)
        mr, cr, sr = m0, c0, s0
        if VARLEN:
            if HAS_DF:
                n = sequence_before(n, opens_in(bits, k), k)
        b_fr, b_fi = _cfma(b_ar, b_ai, b_fr, b_fi, b_gr, b_gi)
        b_qr, b_qi = b_ar * b_qr - b_ai * b_qi, b_ar * b_qi + b_ai * b_qr
        t -= 1
        p_g -= D
    off = (i_b.to(tl.int64) * n_chunks + i_c) * 2 * D + i_n
    _store_quad(rsum, off, N, D, b_qr, b_qi, b_fr, b_fi, mask_n)
    _prefix_tail(rsum, rck, rgroups, right, init, count, i_c, i_j, i_b, n_chunks, G, D, N, i_n, mask_n, BN=BN,
                 HAS_INIT=HAS_INIT, REVERSE=True)


@triton.jit
def _main_kernel(x, dy, ctl, trig, modes, bound, rck, right, slots, part, rows, dh0, words, dfinal, h0,
                 L, D, N, n_chunks, n_groups, n_tiles, n_items,
                 K: tl.constexpr, BN: tl.constexpr, U: tl.constexpr, G, HAS_H0: tl.constexpr,
                 VARLEN: tl.constexpr, HAS_DF: tl.constexpr):
    """Per (chunk, mode tile): the transition and scale cotangents, reduced over modes and over tokens."""
    pid = tl.program_id(0)
    p_slot0 = slots + pid.to(tl.int64) * K * 2 * BN + tl.arange(0, BN)
    for item in range(pid, n_items, tl.num_programs(0)):
        i_j = item % n_tiles
        i_c = (item // n_tiles) % n_chunks
        i_b = item // (n_tiles * n_chunks)
        i_n = i_j * BN + tl.arange(0, BN)
        mask_n = i_n < N
        b_rate, b_ch, b_cl, b_sh, b_sl = _load_modes(modes, i_n, mask_n, N)
        p_m = ctl + i_b.to(tl.int64) * CTL * L + 2 * L
        p_c = trig + i_b.to(tl.int64) * 2 * L
        # delta, right to left, kept in this program's slot (it stays in cache)
        b_dr, b_di = _entering(rck, right, i_b, i_c, D, N, n_chunks, n_groups, i_n, mask_n, G)
        t = i_c * K + K - 1
        p_g = dy + (i_b.to(tl.int64) * L + t) * D + i_n
        p_slot = p_slot0 + (K - 1) * 2 * BN
        bits, n = _walk_words(words, i_c, n_chunks, K, VARLEN)
        # token t + 1's controls (mr, cr, sr: for lambda_{t+1}); token t's controls and dy fetched two tokens ahead
        mr, cr, sr = _fetch_controls(p_m, p_c, t + 1, L)
        m1, c1, s1, b_gr1, b_gi1 = _fetch_token(p_g, p_m, p_c, t, L, N, mask_n)
        m2, c2, s2, b_gr2, b_gi2 = _fetch_token(p_g - D, p_m, p_c, t - 1, L, N, mask_n)
        for j in tl.range(K, loop_unroll_factor=U):
            k = K - 1 - j
            m0, c0, s0, b_gr0, b_gi0 = m1, c1, s1, b_gr1, b_gi1
            m1, c1, s1, b_gr1, b_gi1 = m2, c2, s2, b_gr2, b_gi2
            m2, c2, s2, b_gr2, b_gi2 = _fetch_token(p_g - 2 * D, p_m, p_c, t - 2, L, N, mask_n)
            _prefetch_token(dy, i_b, t - PREFETCH_AHEAD, i_j, L, N, D, BN)
            b_ar, b_ai, b_gr, b_gi = _adjoint_of(mr, cr, sr, b_gr0, b_gi0, t, L, mask_n, b_rate, b_ch, b_cl, b_sh,
                                                 b_sl, bits, k, n, dfinal, i_n, N, D, K, VARLEN, HAS_DF)
            mr, cr, sr = m0, c0, s0
            if VARLEN:
                if HAS_DF:
                    n = sequence_before(n, opens_in(bits, k), k)
            b_dr, b_di = _cfma(b_ar, b_ai, b_dr, b_di, b_gr, b_gi)
            tl.store(p_slot, b_dr)
            tl.store(p_slot + BN, b_di)
            t -= 1
            p_g -= D
            p_slot -= 2 * BN
        tl.debug_barrier()
        # h_{t-1}, left to right, beside delta_t
        b_hr, b_hi = _load_pair(bound, (i_b.to(tl.int64) * n_chunks + i_c) * D + i_n, N, mask_n)
        b_snu = tl.zeros([BN], dtype=tl.float32)
        b_spsi = tl.zeros([BN], dtype=tl.float32)
        t = i_c * K
        p_x = x + (i_b.to(tl.int64) * L + t) * D + i_n
        p_part = part + (i_b.to(tl.int64) * 2 * n_tiles + i_j) * L + t
        p_slot = p_slot0
        if VARLEN:
            n = first_sequence(words, i_c, n_chunks)
        m1, c1, s1, b_zr1, b_zi1 = _fetch_token(p_x, p_m, p_c, t, L, N, mask_n)
        m2, c2, s2, b_zr2, b_zi2 = _fetch_token(p_x + D, p_m, p_c, t + 1, L, N, mask_n)
        b_dr1 = tl.load(p_slot)
        b_di1 = tl.load(p_slot + BN)
        for k in tl.range(K, loop_unroll_factor=U):
            valid = t < L
            ok = _both(mask_n, valid)
            m0, c0, s0, b_zr0, b_zi0, b_dr, b_di = m1, c1, s1, b_zr1, b_zi1, b_dr1, b_di1
            m1, c1, s1, b_zr1, b_zi1 = m2, c2, s2, b_zr2, b_zi2
            m2, c2, s2, b_zr2, b_zi2 = _fetch_token(p_x + 2 * D, p_m, p_c, t + 2, L, N, mask_n)
            _prefetch_token(x, i_b, t + PREFETCH_AHEAD, i_j, L, N, D, BN)
            # delta_{t+1}, from cache (past the slot's end at the chunk's last token: its own row again, unused)
            p_next = p_slot + tl.where(k + 1 < K, 2 * BN, 0)
            b_dr1 = tl.load(p_next)
            b_di1 = tl.load(p_next + BN)
            if VARLEN:
                opens = valid & opens_in(bits, k)
                if HAS_H0:
                    n = sequence_after(n, opens, k)
                b_hr, b_hi = _restart(opens, n, h0, b_hr, b_hi, i_n, N, D, mask_n, HAS_H0)
            b_w, b_rho, b_lr, b_li, b_g, b_zr, b_zi = _input_of(m0, c0, s0, b_zr0, b_zi0, valid,
                                                                b_rate, b_ch, b_cl, b_sh, b_sl)
            # v = conj(G_lambda) = conj(delta) h_{t-1}; dL/dpsi = -Im(v lambda), w rho dL/drho = w Re(v lambda)
            b_vr = b_dr * b_hr + b_di * b_hi
            b_vi = b_dr * b_hi - b_di * b_hr
            b_vlr = b_vr * b_lr - b_vi * b_li
            b_vli = b_vr * b_li + b_vi * b_lr
            b_dpsi = tl.where(ok, -b_vli, 0.0)
            # w dL/dw = -w rho dL/drho + (w / gamma) rho^2 dL/dgamma; w / gamma -> 0 as w -> 0 (at w = 0, past L,
            # the square root is taken of 1, not 0: no 0 * inf for the where to discard).
            # gamma^2 is _input_of's again: the compiler evaluates it once (scripts/sass_report.py's counts)
            b_wg = tl.where(b_w > 0.0, b_w * tl.math.rsqrt(tl.where(b_w > 0.0, _gamma_squared(b_w, b_rho), 1.0)), 0.0)
            b_wdw = tl.where(ok, -b_w * b_vlr + b_wg * b_rho * b_rho * (b_dr * b_zr + b_di * b_zi), 0.0)
            # the per-token sums over the tile's modes, across the warp's lanes: no chain of the walk waits for
            # them, and storing them into the slot instead (as v3.2-v3.5 did) doubled its traffic, which reached
            # DRAM (docs/performance.md, "SAMU v3.6")
            tl.store(p_part + k, tl.sum(b_wdw, axis=0), mask=valid)
            tl.store(p_part + n_tiles * L + k, tl.sum(b_dpsi, axis=0), mask=valid)
            b_snu += b_wdw
            b_spsi += b_dpsi
            if HAS_H0:
                if VARLEN:
                    # d initial_state of sequence n = conj(lambda) delta at the token that opens it
                    _store_pair(dh0, n.to(tl.int64) * D + i_n, N, b_lr * b_dr + b_li * b_di,
                                b_lr * b_di - b_li * b_dr, _both(mask_n, opens))
                elif t == 0:
                    # d initial_state = conj(lambda_0) delta_0
                    _store_pair(dh0, i_b.to(tl.int64) * D + i_n, N, b_lr * b_dr + b_li * b_di,
                                b_lr * b_di - b_li * b_dr, mask_n)
            b_hr, b_hi = _cfma(b_lr, b_li, b_hr, b_hi, b_g * b_zr, b_g * b_zi)
            t += 1
            p_x += D
            p_slot += 2 * BN
        off = (i_b.to(tl.int64) * n_chunks + i_c) * 3 * D + i_n
        tl.store(rows + off, b_snu, mask=mask_n)
        tl.store(rows + off + N, b_spsi, mask=mask_n)
        tl.debug_barrier()  # the slot is free again before the next item's adjoint walk


@triton.jit
def _controller_kernel(ctl, amplitudes, part, dp, dA_rows, L, n_tiles, kappa, BT: tl.constexpr):
    """Fixed-order sum of the per-tile partials: dc = (dm m (1 - tanh^2(c0 / k)), dphi), dp = A^T dc."""
    i_tb, i_b = tl.program_id(0), tl.program_id(1)
    i_t = i_tb * BT + tl.arange(0, BT)
    mask_t = i_t < L
    b_sw = tl.zeros([BT], dtype=tl.float32)
    b_spsi = tl.zeros([BT], dtype=tl.float32)
    p_part = part + i_b.to(tl.int64) * 2 * n_tiles * L + i_t
    for i_j in range(n_tiles):
        b_sw += tl.load(p_part + i_j * L, mask=mask_t, other=0.0)
        b_spsi += tl.load(p_part + (n_tiles + i_j) * L, mask=mask_t, other=0.0)
    p_ctl = ctl + i_b.to(tl.int64) * CTL * L + i_t
    b_p0 = tl.load(p_ctl, mask=mask_t, other=0.0)
    b_p1 = tl.load(p_ctl + L, mask=mask_t, other=0.0)
    a00, a01 = tl.load(amplitudes + 0), tl.load(amplitudes + 1)
    a10, a11 = tl.load(amplitudes + 2), tl.load(amplitudes + 3)
    b_th = tanh((a00 * b_p0 + a01 * b_p1) / kappa)
    # sum_k w dL/dw = dL/dm * m, so dL/dc0 needs no division by m
    b_dc0 = b_sw * (1.0 - b_th * b_th)
    b_dc1 = b_spsi
    p_dp = dp + i_b.to(tl.int64) * 2 * L + i_t
    tl.store(p_dp, a00 * b_dc0 + a10 * b_dc1, mask=mask_t)
    tl.store(p_dp + L, a01 * b_dc0 + a11 * b_dc1, mask=mask_t)
    p_da = dA_rows + (i_b.to(tl.int64) * tl.num_programs(0) + i_tb) * 4
    tl.store(p_da + 0, tl.sum(b_dc0 * b_p0, axis=0))
    tl.store(p_da + 1, tl.sum(b_dc0 * b_p1, axis=0))
    tl.store(p_da + 2, tl.sum(b_dc1 * b_p0, axis=0))
    tl.store(p_da + 3, tl.sum(b_dc1 * b_p1, axis=0))


@triton.jit
def _dx_kernel(x, dy, ctl, trig, modes, directions, rnorm, rck, right, dp, dx, rows, words, dfinal,
               L, D, N, n_chunks, n_groups, K: tl.constexpr, BN: tl.constexpr, U: tl.constexpr, G,
               VARLEN: tl.constexpr, HAS_DF: tl.constexpr):
    """dx = gamma delta + sum_j dp_j u_hat_j, and partials of sum_t dp_j (x_t - p_j u_hat_j)."""
    i_c, i_j, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_n = i_j * BN + tl.arange(0, BN)
    mask_n = i_n < N
    b_rate, b_ch, b_cl, b_sh, b_sl = _load_modes(modes, i_n, mask_n, N)
    r0, r1 = tl.load(rnorm), tl.load(rnorm + 1)
    b_u0r, b_u0i = _load_pair(directions, i_n, N, mask_n)
    b_u1r, b_u1i = _load_pair(directions, D + i_n, N, mask_n)
    b_u0r, b_u0i, b_u1r, b_u1i = b_u0r * r0, b_u0i * r0, b_u1r * r1, b_u1i * r1
    b_a0r = tl.zeros([BN], dtype=tl.float32)
    b_a0i = tl.zeros([BN], dtype=tl.float32)
    b_a1r = tl.zeros([BN], dtype=tl.float32)
    b_a1i = tl.zeros([BN], dtype=tl.float32)
    b_dr, b_di = _entering(rck, right, i_b, i_c, D, N, n_chunks, n_groups, i_n, mask_n, G)
    t = i_c * K + K - 1
    p_p = ctl + i_b.to(tl.int64) * CTL * L
    p_c = trig + i_b.to(tl.int64) * 2 * L
    p_dp = dp + i_b.to(tl.int64) * 2 * L
    row = (i_b.to(tl.int64) * L + t) * D + i_n
    p_g = dy + row
    p_x = x + row
    p_dx = dx + row
    bits, n = _walk_words(words, i_c, n_chunks, K, VARLEN)
    # token t + 1's controls (mr, cr, sr: for lambda_{t+1}); token t's controls, dy, x, dp and p (the
    # projections) fetched a token ahead
    p_m = p_p + 2 * L
    mr, cr, sr = _fetch_controls(p_m, p_c, t + 1, L)
    m1, c1, s1, b_gr1, b_gi1 = _fetch_token(p_g, p_m, p_c, t, L, N, mask_n)
    b_xr1, b_xi1 = _fetch_pair(p_x, t, L, N, mask_n)
    dp0_1, dp1_1, p0_1, p1_1 = _fetch_projections(p_p, p_dp, t, L)
    for j in tl.range(K, loop_unroll_factor=U):
        k = K - 1 - j
        valid = t < L
        ok = _both(mask_n, valid)
        m0, c0, s0, b_gr0, b_gi0, b_xr0, b_xi0 = m1, c1, s1, b_gr1, b_gi1, b_xr1, b_xi1
        dp0, dp1, p0, p1 = dp0_1, dp1_1, p0_1, p1_1
        m1, c1, s1, b_gr1, b_gi1 = _fetch_token(p_g - D, p_m, p_c, t - 1, L, N, mask_n)
        b_xr1, b_xi1 = _fetch_pair(p_x - D, t - 1, L, N, mask_n)
        dp0_1, dp1_1, p0_1, p1_1 = _fetch_projections(p_p, p_dp, t - 1, L)
        b_ar, b_ai, b_gr, b_gi = _adjoint_of(mr, cr, sr, b_gr0, b_gi0, t, L, mask_n, b_rate, b_ch, b_cl, b_sh, b_sl,
                                             bits, k, n, dfinal, i_n, N, D, K, VARLEN, HAS_DF)
        mr, cr, sr = m0, c0, s0
        if VARLEN:
            if HAS_DF:
                n = sequence_before(n, opens_in(bits, k), k)
        b_dr, b_di = _cfma(b_ar, b_ai, b_dr, b_di, b_gr, b_gi)
        b_w = m0 * b_rate
        b_g = _gamma(b_w, exp_flushed(-b_w))
        dp0 = tl.where(valid, dp0, 0.0)
        dp1 = tl.where(valid, dp1, 0.0)
        _store_pair(p_dx, 0, N, b_g * b_dr + dp0 * b_u0r + dp1 * b_u1r, b_g * b_di + dp0 * b_u0i + dp1 * b_u1i, ok)
        # dL/du_j = r_j sum_t dp_{t,j} (x_t - p_{t,j} u_hat_j); r_j is applied in the final reduction
        b_xr = b_xr0.to(tl.float32)
        b_xi = b_xi0.to(tl.float32)
        b_a0r += dp0 * (b_xr - p0 * b_u0r)
        b_a0i += dp0 * (b_xi - p0 * b_u0i)
        b_a1r += dp1 * (b_xr - p1 * b_u1r)
        b_a1i += dp1 * (b_xi - p1 * b_u1i)
        t -= 1
        p_g -= D
        p_x -= D
        p_dx -= D
    off = (i_b.to(tl.int64) * n_chunks + i_c) * 3 * D + D + i_n
    _store_quad(rows, off, N, D, b_a0r, b_a0i, b_a1r, b_a1i, mask_n)


@triton.jit
def _reduce_kernel(rows, dA_rows, theta_log, rnorm, dnu, dtheta, ddir, dA, n_rows, n_dA_rows, D, N,
                   BR: tl.constexpr, BC: tl.constexpr):
    """Column sums of the partial rows in a fixed order, scaled into parameter gradients.

    Columns: [0, N) w dL/dw -> dnu; [N, 2N) dL/dpsi -> dtheta_log (times theta);
    [2N, 2N + D) and [2N + D, 3D) -> d directions [2, D] (times r_0, r_1). The last program sums dA.
    """
    i_col = tl.program_id(0)
    if i_col * BC < 3 * D:
        i_x = i_col * BC + tl.arange(0, BC)
        mask_x = i_x < 3 * D
        b_acc = tl.zeros([BR, BC], dtype=tl.float32)
        for i_r0 in range(0, n_rows, BR):
            i_r = i_r0 + tl.arange(0, BR)
            b_acc += tl.load(rows + i_r.to(tl.int64)[:, None] * 3 * D + i_x[None, :],
                             mask=(i_r < n_rows)[:, None] & mask_x[None, :], other=0.0)
        b_sum = tl.sum(b_acc, axis=0)
        b_theta = tl.exp(tl.load(theta_log + (i_x - N), mask=(i_x >= N) & (i_x < D), other=0.0))
        b_scale = tl.where(i_x < N, 1.0, tl.where(i_x < D, b_theta,
                           tl.where(i_x < 2 * D, tl.load(rnorm), tl.load(rnorm + 1))))
        b_grad = b_sum * b_scale
        tl.store(dnu + i_x, b_grad, mask=i_x < N)
        tl.store(dtheta + (i_x - N), b_grad, mask=(i_x >= N) & (i_x < D))
        tl.store(ddir + (i_x - D), b_grad, mask=(i_x >= D) & mask_x)
    else:
        i_a = tl.arange(0, 4)
        b_acc4 = tl.zeros([BR, 4], dtype=tl.float32)
        for i_r0 in range(0, n_dA_rows, BR):
            i_r = i_r0 + tl.arange(0, BR)
            b_acc4 += tl.load(dA_rows + i_r.to(tl.int64)[:, None] * 4 + i_a[None, :],
                              mask=(i_r < n_dA_rows)[:, None], other=0.0)
        tl.store(dA + i_a, tl.sum(b_acc4, axis=0))


# tokens a backward controller program sums (~1,000 programs at L = 32,768); it fixes the order of dA's
# partial sums
CONTROLLER_TOKENS = 32


def slot_count(n_items: int, multiprocessors: int, per_sm: int) -> int:
    """Programs of the persistent main kernel (each owns one adjoint slot)."""
    return min(n_items, per_sm * multiprocessors)


_sms: dict = {}   # device -> multiprocessors


def multiprocessors(device: torch.device) -> int:
    """The multiprocessors of a CUDA device, asked once a device (torch's query costs an eager call ~2 us)."""
    if device not in _sms:
        _sms[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _sms[device]


def _slots(device, n_items: int, per_sm: int) -> int:
    if device.type == "cuda":
        return slot_count(n_items, multiprocessors(device), per_sm)
    # the interpreter runs programs one after another: a few slots exercise the persistent loop
    return min(n_items, 3)


def bwd(dy, dfinal, x, nu, theta_log, directions, amplitudes, has_h0, ctl, rnorm, bound, count, radial_bound, *,
        K, BN, G, unroll, main_BN=0, num_warps=1, slots_per_sm=16, empty=torch.empty, words=None, h0=None):
    """Backward pass. Returns dx (x.dtype), dnu, dtheta_log, ddirections, damplitudes, dh0 (or None).
    Packed (``words``, as fwd): dfinal and dh0 are [N, D], and ``h0`` is the initial state [N, D] (or None).
    ``main_BN``: the main kernel's mode tile (0: BN); it alone fixes the layout of ``part``. ``count``: the
    forward's prefix counters (zero)."""
    B, L, D = x.shape
    varlen = words is not None
    # packed, each sequence's final-state cotangent enters where it closes (in the walks)
    has_df = varlen and dfinal is not None
    words_arg = words if varlen else ctl
    df_arg = dfinal if has_df else ctl
    N = D // 2
    n_chunks = cdiv(L, K)
    n_tiles = cdiv(N, BN)
    f32 = dict(device=x.device, dtype=torch.float32)
    main_BN = main_BN or BN
    main_tiles = cdiv(N, main_BN)
    n_tb = cdiv(L, CONTROLLER_TOKENS)
    n_items = B * n_chunks * main_tiles
    n_slots = _slots(x.device, n_items, slots_per_sm)
    # trig (cos phi, sin phi) and modes (the mode table) are rebuilt by the adjoint summaries
    rsum, trig, modes, part, rows, dp, dA_rows, slots, *prefix = carve(
        empty, x.device, (B, n_chunks, 2, D), (B, 2, L), (5, N), (B, 2, main_tiles, L), (B * n_chunks, 3 * D),
        (B, 2, L), (B * n_tb, 4), (n_slots, K, 2 * main_BN), *prefix_shapes(B, n_chunks, D, G))
    rck, rgroups, right = prefix_buffers(rsum, prefix)
    # the final-state cotangent is the adjoint entering from the right end (tokens past L are identity)
    has_init = not varlen and dfinal is not None
    launch(_adjoint_summary_kernel, (n_chunks, n_tiles, B), dy, ctl, trig, nu, theta_log, modes, rsum, rck, rgroups,
           right, dfinal if has_init else rsum, count, words_arg, df_arg, L, D, N, n_chunks, G, K=K, BN=BN, U=unroll,
           VARLEN=varlen, HAS_DF=has_df, HAS_INIT=has_init, num_warps=num_warps)
    n_groups = right.shape[1]
    dh0 = empty(h0.shape[0] if varlen else B, D, **f32) if has_h0 else None
    launch(_main_kernel, (n_slots,), x, dy, ctl, trig, modes, bound, rck, right, slots, part, rows,
           dh0 if has_h0 else rows, words_arg, df_arg, h0 if varlen and has_h0 else rows, L, D, N, n_chunks, n_groups,
           main_tiles, n_items, K=K, BN=main_BN, U=unroll, G=G, HAS_H0=has_h0, VARLEN=varlen, HAS_DF=has_df,
           num_warps=num_warps)
    launch(_controller_kernel, (n_tb, B), ctl, amplitudes, part, dp, dA_rows, L, main_tiles, float(radial_bound),
           BT=CONTROLLER_TOKENS, num_warps=1)
    dx = empty(B, L, D, device=x.device, dtype=x.dtype)
    launch(_dx_kernel, (n_chunks, n_tiles, B), x, dy, ctl, trig, modes, directions, rnorm, rck, right, dp, dx,
           rows, words_arg, df_arg, L, D, N, n_chunks, n_groups, K=K, BN=BN, U=unroll, G=G, VARLEN=varlen,
           HAS_DF=has_df, num_warps=num_warps)
    dnu, dtheta, ddir = empty(N, **f32), empty(N, **f32), empty(2, D, **f32)
    dA = empty(2, 2, **f32)
    # ~200 narrow column blocks with 8 KB loads in flight each; BR fixes the order of the column sums
    BC = 32
    launch(_reduce_kernel, (cdiv(3 * D, BC) + 1,), rows, dA_rows, theta_log, rnorm, dnu, dtheta, ddir, dA,
           B * n_chunks, B * n_tb, D, N, BR=64, BC=BC, num_warps=4)
    return dx, dnu, dtheta, ddir, dA, dh0
