"""SAMU forward in Triton: controller, chunk summaries with the group-local and outer prefixes, replay.

Every chunk is walked token by token with the modes of a tile spread over the threads, so each
thread runs the recurrence of its own modes in registers (no cross-thread scan). Per-token
controls (m, cos phi, sin phi) are scalar loads shared by all modes.

Layouts (fp32 unless noted; complex quantities in fused coordinates, real parts then imaginary):
  x, y      [B, L, D]       input dtype
  ctl       [B, 4, L]       p0, p1, m, phi per token (planar; saved for backward, spec §3.1)
  trig      [B, 2, L]       cos phi, sin phi per token (transient: the backward rebuilds it)
  rnorm     [2]             1 / ||u_j||
  csum      [B, nC, 2, D]   per chunk: (prod lambda, state reached from zero)
  ck        [B, nC, 2, D]   per chunk: the same composed over the group's chunks before it
  groups    [B, nG, 2, D]   per group: the same over the whole group
  start     [B, nG, D]      state entering each group (outer prefix)
  count     [B, tiles, nG + 1] int32  the prefix's arrival counters (prefix_counters, _prefix_tail; [B, tiles, 1]
                            where G = 1)
  bound     [B, nC, D]      state entering each chunk (saved for backward)
  words     [3, nC] int32   packed calls (B = 1): each chunk's opening bits, first and last sequence
                            (packing_triton.chunk_boundaries)
See README.md beside this file for the derivation. A packed call restarts the recurrence where a
sequence opens: the state carried in becomes that sequence's initial state (or zero) and the carried
transition zero, so no state crosses a boundary; its final state is stored where it closes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from samu.ops.packing_triton import chunk_word, first_sequence, opens_in, sequence_after
from samu.ops.triton_utils import (arrive, carve, cast_to, cdiv, exp_flushed, launch, next_power_of_2,
                                  one_minus_exp_neg_small, tanh)

CTL = tl.constexpr(4)  # planes of ctl: p0, p1, m, phi


@triton.jit
def _cmul(ar, ai, br, bi):
    return ar * br - ai * bi, ar * bi + ai * br


@triton.jit
def _cfma(ar, ai, hr, hi, br, bi):
    # a h + b, complex
    return ar * hr - ai * hi + br, ar * hi + ai * hr + bi


@triton.jit
def _mode_row(nu, theta_log, i_n, mask_n):
    """Per-mode constants of a [BN] tile: rate exp(nu), and cos and sin of theta = exp(theta_log)
    each as an fp32 pair (hi, lo) of a float64 value.

    A rounded (cos theta, sin theta) has a norm off 1 by up to an ulp, the same for every token, and
    a slow mode's state compounds it over its memory; the lo parts keep the norm exact.
    """
    b_rate = tl.exp(tl.load(nu + i_n, mask=mask_n, other=0.0))
    b_th = tl.exp(tl.load(theta_log + i_n, mask=mask_n, other=0.0).to(tl.float64))
    b_c, b_s = tl.cos(b_th), tl.sin(b_th)
    b_ch, b_sh = b_c.to(tl.float32), b_s.to(tl.float32)
    return b_rate, b_ch, (b_c - b_ch.to(tl.float64)).to(tl.float32), b_sh, (b_s - b_sh.to(tl.float64)).to(tl.float32)


@triton.jit
def _store_modes(modes, i_n, mask_n, N, b_rate, b_ch, b_cl, b_sh, b_sl):
    """_mode_row's five [BN] rows into a call's mode table ``modes`` [5, N] (rate, cos hi, cos lo, sin hi, sin lo):
    one kernel evaluates the float64 functions once a call, and the walks load them (_load_modes)."""
    tl.store(modes + i_n, b_rate, mask=mask_n)
    tl.store(modes + N + i_n, b_ch, mask=mask_n)
    tl.store(modes + 2 * N + i_n, b_cl, mask=mask_n)
    tl.store(modes + 3 * N + i_n, b_sh, mask=mask_n)
    tl.store(modes + 4 * N + i_n, b_sl, mask=mask_n)


@triton.jit
def _load_modes(modes, i_n, mask_n, N):
    """_mode_row's values from the mode table (_store_modes)."""
    return (tl.load(modes + i_n, mask=mask_n, other=0.0), tl.load(modes + N + i_n, mask=mask_n, other=0.0),
            tl.load(modes + 2 * N + i_n, mask=mask_n, other=0.0), tl.load(modes + 3 * N + i_n, mask=mask_n, other=0.0),
            tl.load(modes + 4 * N + i_n, mask=mask_n, other=0.0))


@triton.jit
def _clamp(t, L):
    """A token index inside [0, L): scalar loads stay in bounds without a mask."""
    return tl.minimum(tl.maximum(t, 0), L - 1)


@triton.jit
def _both(mask_n, valid):
    """A [BN] mask and a scalar condition (combined by where: interpreters reject scalar & vector)."""
    return tl.where(valid, mask_n, False)


@triton.jit
def _fetch_controls(p_m, p_c, t, L):
    """Token t's controls as loaded, from a clamped index: m, cos phi and sin phi (pointers to the batch row's
    m plane of ctl and cos plane of trig). The walks fetch a token's loads a token or two before they use
    them, with no arithmetic on them until then (_controls_of), so the serial chain does not wait for the
    loads (README.md, "Chunks")."""
    tc = _clamp(t, L)
    return tl.load(p_m + tc), tl.load(p_c + tc), tl.load(p_c + L + tc)


@triton.jit
def _fetch_token(p, p_m, p_c, t, L, N, mask_n):
    """_fetch_controls and _fetch_pair of token t (p: its row of x or dy)."""
    m, c, s = _fetch_controls(p_m, p_c, t, L)
    b_zr, b_zi = _fetch_pair(p, t, L, N, mask_n)
    return m, c, s, b_zr, b_zi


@triton.jit
def _controls_of(m, c, s, valid):
    """m, cos phi, sin phi from _fetch_controls' values (m = 0, phi = 0 where not valid)."""
    return tl.where(valid, m, 0.0), tl.where(valid, c, 1.0), tl.where(valid, s, 0.0)


@triton.jit
def _fetch_pair(p, t, L, N, mask_n):
    """Token t's complex [BN] tile from its row pointer p, as stored (zeros outside [0, L))."""
    ok = _both(mask_n, (t >= 0) & (t < L))
    return tl.load(p, mask=ok, other=0.0), tl.load(p + N, mask=ok, other=0.0)


@triton.jit
def _transition(m, cphi, sphi, b_rate, b_ch, b_cl, b_sh, b_sl):
    """w = m exp(nu), rho = exp(-w) and lambda = rho exp(i(theta + phi)) for one token, [BN]."""
    b_w = m * b_rate
    b_rho = exp_flushed(-b_w)
    # the lo parts join the smaller product first, so the sum keeps them through its last rounding
    b_lr = b_rho * (b_ch * cphi + ((b_cl * cphi - b_sl * sphi) - b_sh * sphi))
    b_li = b_rho * (b_ch * sphi + ((b_sl * cphi + b_cl * sphi) + b_sh * cphi))
    return b_w, b_rho, b_lr, b_li


@triton.jit
def _gamma_squared(b_w, b_rho):
    """1 - rho^2 for rho = exp(-w): 1 - rho * rho where 2 w >= 0.5 (rho^2 <= e^-0.5: it loses under two bits
    there), the Taylor polynomial of 1 - exp(-2 w) below, where 1 - rho * rho cancels."""
    b_2w = 2.0 * b_w
    return tl.where(b_2w < 0.5, one_minus_exp_neg_small(b_2w), 1.0 - b_rho * b_rho)


@triton.jit
def _gamma(b_w, b_rho):
    """gamma = sqrt(1 - rho^2)."""
    return tl.sqrt(_gamma_squared(b_w, b_rho))


@triton.jit
def _load_pair(ptr, off, N, mask):
    """Real and imaginary parts of a complex tile stored in fused coordinates, as fp32."""
    b_re = tl.load(ptr + off, mask=mask, other=0.0).to(tl.float32)
    b_im = tl.load(ptr + off + N, mask=mask, other=0.0).to(tl.float32)
    return b_re, b_im


@triton.jit
def _store_pair(ptr, off, N, b_re, b_im, mask):
    tl.store(ptr + off, cast_to(b_re, ptr.dtype.element_ty), mask=mask)
    tl.store(ptr + off + N, cast_to(b_im, ptr.dtype.element_ty), mask=mask)


@triton.jit
def _store_quad(ptr, off, N, D, b_ar, b_ai, b_br, b_bi, mask):
    """Two complex [BN] tiles in one [.., 2, D] row: (a, b) of an affine map, fused coordinates."""
    tl.store(ptr + off, b_ar, mask=mask)
    tl.store(ptr + off + N, b_ai, mask=mask)
    tl.store(ptr + off + D, b_br, mask=mask)
    tl.store(ptr + off + D + N, b_bi, mask=mask)


@triton.jit
def _restart(opens, n, h0, b_hr, b_hi, i_n, N, D, mask_n, HAS_H0: tl.constexpr):
    """The state carried into a token that opens sequence n: its initial state (row n of h0) or zero."""
    if HAS_H0:
        b_sr, b_si = _load_pair(h0, n.to(tl.int64) * D + i_n, N, _both(mask_n, opens))
    else:
        b_sr = tl.zeros_like(b_hr)
        b_si = tl.zeros_like(b_hi)
    return tl.where(opens, b_sr, b_hr), tl.where(opens, b_si, b_hi)


@triton.jit
def _input_of(m, c, s, b_zr, b_zi, valid, b_rate, b_ch, b_cl, b_sh, b_sl):
    """Transition and input of one token, [BN] each, from its fetched controls (_fetch_controls) and x
    tile (_fetch_pair); identity (lambda = 1, input 0) where not valid (past L)."""
    m, cphi, sphi = _controls_of(m, c, s, valid)
    b_w, b_rho, b_lr, b_li = _transition(m, cphi, sphi, b_rate, b_ch, b_cl, b_sh, b_sl)
    b_lr = tl.where(valid, b_lr, 1.0)
    b_li = tl.where(valid, b_li, 0.0)
    return b_w, b_rho, b_lr, b_li, _gamma(b_w, b_rho), b_zr.to(tl.float32), b_zi.to(tl.float32)


@triton.jit
def _fetch_map(summ, i_b, i, n_items, D, N, i_n, mask_n):
    """Item i's affine map (P, E) of a [B, n_items, 2, D] tile, [BN] each."""
    off = (i_b.to(tl.int64) * n_items + i) * 2 * D + i_n
    b_ar, b_ai = _load_pair(summ, off, N, mask_n)
    b_br, b_bi = _load_pair(summ, off + D, N, mask_n)
    return b_ar, b_ai, b_br, b_bi


@triton.jit
def _compose_span(summ, init, enter, total, i_b, i_g, n_items, span, n_spans, D, N, i_n, mask_n, BN: tl.constexpr,
                  HAS_INIT: tl.constexpr, MAPS: tl.constexpr, REVERSE: tl.constexpr):
    """Compose the affine maps (P, E) of span ``i_g`` of ``summ`` [B, n_items, 2, D] (its ``span`` consecutive items
    from i_g * span; right to left if REVERSE) for one mode tile and batch row.

    Starts from the identity map, or from the state ``init`` (the map (0, init)); before each item stores the
    running composition (the map, or with MAPS false only its state part, into ``enter``), and stores the whole
    span's composition as item i_g of the ``n_spans`` items of ``total`` (MAPS only).
    """
    b_pr = tl.full([BN], 0.0 if HAS_INIT else 1.0, dtype=tl.float32)
    b_pi = tl.zeros([BN], dtype=tl.float32)
    if HAS_INIT:
        b_er, b_ei = _load_pair(init, i_b.to(tl.int64) * D + i_n, N, mask_n)
    else:
        b_er = tl.zeros([BN], dtype=tl.float32)
        b_ei = tl.zeros([BN], dtype=tl.float32)
    first = i_g * span
    last = tl.minimum(first + span, n_items)
    # each item's map is fetched an item ahead (like the token walks' loads), so the composition's chain
    # does not wait for it
    i = last - 1 if REVERSE else first
    b_ar1, b_ai1, b_br1, b_bi1 = _fetch_map(summ, i_b, i, n_items, D, N, i_n, mask_n)
    for i_s in range(last - first):
        i = last - 1 - i_s if REVERSE else first + i_s
        b_ar, b_ai, b_br, b_bi = b_ar1, b_ai1, b_br1, b_bi1
        # the last item's fetch is clamped into the span: the item past it may be another program's, being written
        i_next = tl.minimum(tl.maximum(i - 1 if REVERSE else i + 1, first), last - 1)
        b_ar1, b_ai1, b_br1, b_bi1 = _fetch_map(summ, i_b, i_next, n_items, D, N, i_n, mask_n)
        if MAPS:
            off = (i_b.to(tl.int64) * n_items + i) * 2 * D + i_n
            _store_quad(enter, off, N, D, b_pr, b_pi, b_er, b_ei, mask_n)
        else:
            off = (i_b.to(tl.int64) * n_items + i) * D + i_n
            tl.store(enter + off, b_er, mask=mask_n)
            tl.store(enter + off + N, b_ei, mask=mask_n)
        b_er, b_ei = _cfma(b_ar, b_ai, b_er, b_ei, b_br, b_bi)
        b_pr, b_pi = _cmul(b_ar, b_ai, b_pr, b_pi)
    if MAPS:
        off = (i_b.to(tl.int64) * n_spans + i_g) * 2 * D + i_n
        _store_quad(total, off, N, D, b_pr, b_pi, b_er, b_ei, mask_n)


@triton.jit
def _prefix_tail(summ, ck, groups, start, init, count, i_c, i_j, i_b, n_chunks, G, D, N, i_n, mask_n,
                 BN: tl.constexpr, HAS_INIT: tl.constexpr, REVERSE: tl.constexpr):
    """The prefix over the chunk maps ``summ`` [B, nC, 2, D], run by the summary programs once their maps are stored
    (program (i_c, i_j, i_b) has just stored chunk i_c's map for mode tile i_j of batch row i_b).

    The last of a group's G chunk programs to arrive (triton_utils.arrive; the counters ``count`` of prefix_counters,
    zero on entry and left zero) composes the group: the map entering each of its chunks from the group's start
    into ``ck`` [B, nC, 2, D], the group's whole map into ``groups`` [B, nG, 2, D]; the last group to finish (with
    G = 1 the last chunk, and ``groups`` is ``summ``) composes the groups from ``init`` into ``start`` [B, nG, D],
    the state entering each group. REVERSE: right to left (the backward's adjoint). Every composition runs in a
    fixed order, so the prefix is the same whichever program arrives last.
    """
    n_groups = (n_chunks + G - 1) // G
    # per (batch row, mode tile): a counter a group, then the outer one (the outer one alone where G = 1)
    n_inner = n_groups if G > 1 else 0
    p_count = count + (i_b.to(tl.int64) * tl.num_programs(1) + i_j) * (n_inner + 1)
    outer = True
    if G > 1:
        i_g = i_c // G
        outer = arrive(p_count + i_g, tl.minimum(G, n_chunks - i_g * G))
        if outer:
            _compose_span(summ, summ, ck, groups, i_b, i_g, n_chunks, G, n_groups, D, N, i_n, mask_n, BN=BN,
                          HAS_INIT=False, MAPS=True, REVERSE=REVERSE)
            tl.store(p_count + i_g, 0)
    if outer:
        if arrive(p_count + n_inner, n_groups):
            _compose_span(groups, init, start, groups, i_b, 0, n_groups, n_groups, 1, D, N, i_n, mask_n, BN=BN,
                          HAS_INIT=HAS_INIT, MAPS=False, REVERSE=REVERSE)
            tl.store(p_count + n_inner, 0)


@triton.jit
def _controller_kernel(x, directions, amplitudes, nu, theta_log, ctl, trig, rnorm, modes, count, n_count, L, D, N,
                       kappa, BT: tl.constexpr, BD: tl.constexpr):
    """p = <u_j / ||u_j||, x_t>, c = A p, m = exp(k tanh(c0 / k)), phi = c1 for BT tokens; the first program also
    zeroes the call's ``n_count`` prefix counters (prefix_counters), and the first batch row's programs write the
    mode table (_store_modes), BD modes at a time."""
    i_tb, i_b = tl.program_id(0), tl.program_id(1)
    i_t = i_tb * BT + tl.arange(0, BT)
    mask_t = i_t < L
    row = (i_b.to(tl.int64) * L + i_t.to(tl.int64)) * D
    b_p0 = tl.zeros([BT], dtype=tl.float32)
    b_p1 = tl.zeros([BT], dtype=tl.float32)
    b_n0 = tl.zeros([BD], dtype=tl.float32)
    b_n1 = tl.zeros([BD], dtype=tl.float32)
    for i_d0 in range(0, D, BD):
        i_d = i_d0 + tl.arange(0, BD)
        mask_d = i_d < D
        b_u0 = tl.load(directions + i_d, mask=mask_d, other=0.0)
        b_u1 = tl.load(directions + D + i_d, mask=mask_d, other=0.0)
        b_x = tl.load(x + row[:, None] + i_d[None, :], mask=mask_t[:, None] & mask_d[None, :],
                      other=0.0).to(tl.float32)  # [BT, BD]
        b_p0 += tl.sum(b_x * b_u0[None, :], axis=1)
        b_p1 += tl.sum(b_x * b_u1[None, :], axis=1)
        b_n0 += b_u0 * b_u0
        b_n1 += b_u1 * b_u1
    b_r0 = 1.0 / tl.sqrt(tl.sum(b_n0, axis=0))
    b_r1 = 1.0 / tl.sqrt(tl.sum(b_n1, axis=0))
    b_p0 *= b_r0
    b_p1 *= b_r1
    b_c0 = tl.load(amplitudes + 0) * b_p0 + tl.load(amplitudes + 1) * b_p1
    b_c1 = tl.load(amplitudes + 2) * b_p0 + tl.load(amplitudes + 3) * b_p1
    b_m = tl.exp(kappa * tanh(b_c0 / kappa))
    p_ctl = ctl + i_b.to(tl.int64) * CTL * L + i_t
    tl.store(p_ctl, b_p0, mask=mask_t)
    tl.store(p_ctl + L, b_p1, mask=mask_t)
    tl.store(p_ctl + 2 * L, b_m, mask=mask_t)
    tl.store(p_ctl + 3 * L, b_c1, mask=mask_t)
    p_trig = trig + i_b.to(tl.int64) * 2 * L + i_t
    tl.store(p_trig, tl.cos(b_c1), mask=mask_t)
    tl.store(p_trig + L, tl.sin(b_c1), mask=mask_t)
    if i_b == 0:
        for i_m0 in range(i_tb * BD, N, tl.num_programs(0) * BD):
            i_m = i_m0 + tl.arange(0, BD)
            b_rate, b_ch, b_cl, b_sh, b_sl = _mode_row(nu, theta_log, i_m, i_m < N)
            _store_modes(modes, i_m, i_m < N, N, b_rate, b_ch, b_cl, b_sh, b_sl)
    if (i_tb == 0) & (i_b == 0):
        tl.store(rnorm, b_r0)
        tl.store(rnorm + 1, b_r1)
        for i_k0 in range(0, n_count, BD):
            i_k = i_k0 + tl.arange(0, BD)
            tl.store(count + i_k, tl.zeros([BD], dtype=tl.int32), mask=i_k < n_count)


@triton.jit
def _summary_kernel(x, ctl, trig, modes, csum, ck, groups, start, init, count, words, h0, L, D, N, n_chunks, G,
                    K: tl.constexpr, BN: tl.constexpr, U: tl.constexpr, VARLEN: tl.constexpr, HAS_H0: tl.constexpr,
                    HAS_INIT: tl.constexpr):
    """(prod lambda, state reached from zero) of one chunk, for one mode tile, then the prefix over the chunks
    (_prefix_tail: ck, groups, start from the initial state ``init``). Packed (VARLEN), where a sequence opens the
    product restarts from zero and the state from that sequence's initial state."""
    i_c, i_j, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_n = i_j * BN + tl.arange(0, BN)
    mask_n = i_n < N
    b_rate, b_ch, b_cl, b_sh, b_sl = _load_modes(modes, i_n, mask_n, N)
    t = i_c * K
    p_m = ctl + i_b.to(tl.int64) * CTL * L + 2 * L
    p_c = trig + i_b.to(tl.int64) * 2 * L
    p_x = x + (i_b.to(tl.int64) * L + t) * D + i_n
    b_pr = tl.full([BN], 1.0, dtype=tl.float32)
    b_pi = tl.zeros([BN], dtype=tl.float32)
    b_er = tl.zeros([BN], dtype=tl.float32)
    b_ei = tl.zeros([BN], dtype=tl.float32)
    if VARLEN:
        bits = chunk_word(words, i_c, n_chunks, K)
        n = first_sequence(words, i_c, n_chunks)
    m1, c1, s1, b_zr1, b_zi1 = _fetch_token(p_x, p_m, p_c, t, L, N, mask_n)
    for k in tl.range(K, loop_unroll_factor=U):
        m0, c0, s0, b_zr0, b_zi0 = m1, c1, s1, b_zr1, b_zi1
        m1, c1, s1, b_zr1, b_zi1 = _fetch_token(p_x + D, p_m, p_c, t + 1, L, N, mask_n)
        if VARLEN:
            # n: the sequence of token t
            opens = (t < L) & opens_in(bits, k)
            if HAS_H0:
                n = sequence_after(n, opens, k)
            b_er, b_ei = _restart(opens, n, h0, b_er, b_ei, i_n, N, D, mask_n, HAS_H0)
            b_pr = tl.where(opens, 0.0, b_pr)
            b_pi = tl.where(opens, 0.0, b_pi)
        _, _, b_lr, b_li, b_g, b_zr, b_zi = _input_of(m0, c0, s0, b_zr0, b_zi0, t < L, b_rate, b_ch, b_cl, b_sh, b_sl)
        b_er, b_ei = _cfma(b_lr, b_li, b_er, b_ei, b_g * b_zr, b_g * b_zi)
        b_pr, b_pi = _cmul(b_lr, b_li, b_pr, b_pi)
        t += 1
        p_x += D
    off = (i_b.to(tl.int64) * n_chunks + i_c) * 2 * D + i_n
    _store_quad(csum, off, N, D, b_pr, b_pi, b_er, b_ei, mask_n)
    _prefix_tail(csum, ck, groups, start, init, count, i_c, i_j, i_b, n_chunks, G, D, N, i_n, mask_n, BN=BN,
                 HAS_INIT=HAS_INIT, REVERSE=False)


@triton.jit
def _entering(ck, start, i_b, i_c, D, N, n_chunks, n_groups, i_n, mask_n, G):
    """State entering chunk i_c: the group's entering state carried through the group's earlier chunks."""
    b_sr, b_si = _load_pair(start, (i_b.to(tl.int64) * n_groups + i_c // G) * D + i_n, N, mask_n)
    if G > 1:
        b_ar, b_ai, b_br, b_bi = _fetch_map(ck, i_b, i_c, n_chunks, D, N, i_n, mask_n)
        b_sr, b_si = _cfma(b_ar, b_ai, b_sr, b_si, b_br, b_bi)
    return b_sr, b_si


@triton.jit
def _replay_kernel(x, ctl, trig, modes, ck, start, y, bound, final, words, h0, L, D, N, n_chunks, n_groups,
                   K: tl.constexpr, BN: tl.constexpr, U: tl.constexpr, G, HAS_FINAL: tl.constexpr,
                   VARLEN: tl.constexpr, HAS_H0: tl.constexpr):
    """Rerun each chunk from its entering state and write y (and the final state; packed, each
    sequence's final state where it closes)."""
    i_c, i_j, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_n = i_j * BN + tl.arange(0, BN)
    mask_n = i_n < N
    b_rate, b_ch, b_cl, b_sh, b_sl = _load_modes(modes, i_n, mask_n, N)
    b_hr, b_hi = _entering(ck, start, i_b, i_c, D, N, n_chunks, n_groups, i_n, mask_n, G)
    off = (i_b.to(tl.int64) * n_chunks + i_c) * D + i_n
    tl.store(bound + off, b_hr, mask=mask_n)
    tl.store(bound + off + N, b_hi, mask=mask_n)
    t = i_c * K
    p_m = ctl + i_b.to(tl.int64) * CTL * L + 2 * L
    p_c = trig + i_b.to(tl.int64) * 2 * L
    row = (i_b.to(tl.int64) * L + t) * D + i_n
    p_x = x + row
    p_y = y + row
    if VARLEN:
        bits = chunk_word(words, i_c, n_chunks, K)
        n = first_sequence(words, i_c, n_chunks)
    # the two fetches apart, not through _fetch_token: that changed this kernel's SASS (scripts/sass_same.py)
    m1, c1, s1 = _fetch_controls(p_m, p_c, t, L)
    b_zr1, b_zi1 = _fetch_pair(p_x, t, L, N, mask_n)
    for k in tl.range(K, loop_unroll_factor=U):
        valid = t < L
        m0, c0, s0, b_zr0, b_zi0 = m1, c1, s1, b_zr1, b_zi1
        m1, c1, s1 = _fetch_controls(p_m, p_c, t + 1, L)
        b_zr1, b_zi1 = _fetch_pair(p_x + D, t + 1, L, N, mask_n)
        if VARLEN:
            opens = valid & opens_in(bits, k)
            if HAS_H0 or HAS_FINAL:
                n = sequence_after(n, opens, k)
            b_hr, b_hi = _restart(opens, n, h0, b_hr, b_hi, i_n, N, D, mask_n, HAS_H0)
        _, _, b_lr, b_li, b_g, b_zr, b_zi = _input_of(m0, c0, s0, b_zr0, b_zi0, valid, b_rate, b_ch, b_cl, b_sh, b_sl)
        b_hr, b_hi = _cfma(b_lr, b_li, b_hr, b_hi, b_g * b_zr, b_g * b_zi)
        _store_pair(p_y, 0, N, b_hr, b_hi, _both(mask_n, valid))
        if VARLEN:
            if HAS_FINAL:
                closes = valid & ((t == L - 1) | opens_in(bits, k + 1))
                _store_pair(final, n.to(tl.int64) * D + i_n, N, b_hr, b_hi, _both(mask_n, closes))
        t += 1
        p_x += D
        p_y += D
    if HAS_FINAL and not VARLEN:
        # tokens past L are identity steps, so the chunk's last state is the state after token L-1
        _store_pair(final, i_b.to(tl.int64) * D + i_n, N, b_hr, b_hi, _both(mask_n, i_c == n_chunks - 1))


def prefix_shapes(B, n_chunks, D, G) -> list:
    """Shapes of _prefix_tail's buffers beside the chunk maps [B, nC, 2, D]: ck, groups and start, or start alone where
    G = 1 (prefix_buffers)."""
    n_groups = cdiv(n_chunks, G)
    return [(B, n_groups, D)] if G == 1 else [(B, n_chunks, 2, D), (B, n_groups, 2, D), (B, n_groups, D)]


def prefix_buffers(summ, buffers) -> tuple:
    """(ck, groups, start) for _prefix_tail over the chunk maps ``summ`` from ``buffers`` of prefix_shapes. Where G = 1
    ck and groups are summ itself: the group maps are the chunk maps, and no kernel reads ck (every read of it is under
    G > 1)."""
    return (summ, summ, *buffers) if len(buffers) == 1 else tuple(buffers)


def prefix_counters(B, L, D, *, K, BN, G, device, empty=torch.empty):
    """The int32 arrival counters of _prefix_tail for one call, forward and backward, uninitialised: [B, tiles,
    nG + 1] (one a group, then the outer one; [B, tiles, 1] where G = 1). The forward's controller kernel zeroes
    them and every launch that uses them leaves them zero, so one launch at a time may use them: the backward runs
    on the forward's stream after it (two backwards of one graph at once on two streams would share them)."""
    return empty(B, cdiv(D // 2, BN), (cdiv(cdiv(L, K), G) if G > 1 else 0) + 1, device=device, dtype=torch.int32)


def fwd(x, nu, theta_log, directions, amplitudes, initial_state, radial_bound, *, K, BN, G,
        unroll, num_warps=1, want_final=True, empty=torch.empty, words=None, n_seqs=None):
    """Forward pass. Returns y [B, L, D] (x.dtype), final [B, D] fp32 (or None), and the saved
    tensors for backward: ctl [B, 4, L], rnorm [2], bound [B, nC, D] (spec §3.1's list), and the prefix
    counters (prefix_counters: zero again once the forward is done; the backward's prefix uses them).

    Packed (``words``, packing_triton.chunk_boundaries with this K, and ``n_seqs`` = N, with B = 1):
    initial_state and final are [N, D], one row per sequence.
    ``empty`` allocates every output (tests pass one that fills NaN, so unwritten elements show).
    """
    B, L, D = x.shape
    varlen = words is not None
    N = D // 2
    n_chunks = cdiv(L, K)
    n_tiles = cdiv(N, BN)
    f32 = dict(device=x.device, dtype=torch.float32)
    ctl = empty(B, CTL.value, L, **f32)
    rnorm = empty(2, **f32)
    count = prefix_counters(B, L, D, K=K, BN=BN, G=G, device=x.device, empty=empty)
    trig, modes, csum, *prefix = carve(empty, x.device, (B, 2, L), (5, N), (B, n_chunks, 2, D),
                                       *prefix_shapes(B, n_chunks, D, G))
    BT = 16
    launch(_controller_kernel, (cdiv(L, BT), B), x, directions, amplitudes, nu, theta_log, ctl, trig, rnorm, modes,
           count, count.numel(), L, D, N, float(radial_bound), BT=BT, BD=min(256, next_power_of_2(D)), num_warps=4)
    ck, groups, start = prefix_buffers(csum, prefix)
    # packed, each sequence's initial state enters where it opens (in the walks), not at the left end
    has_h0 = varlen and initial_state is not None
    has_init = not varlen and initial_state is not None
    h0 = initial_state if has_h0 else csum
    words_arg = words if varlen else csum
    launch(_summary_kernel, (n_chunks, n_tiles, B), x, ctl, trig, modes, csum, ck, groups, start,
           initial_state if has_init else csum, count, words_arg, h0, L, D, N, n_chunks, G, K=K, BN=BN, U=unroll,
           VARLEN=varlen, HAS_H0=has_h0, HAS_INIT=has_init, num_warps=num_warps)
    n_groups = start.shape[1]
    y = empty(B, L, D, device=x.device, dtype=x.dtype)
    bound = empty(B, n_chunks, D, **f32)
    final = empty(n_seqs if varlen else B, D, **f32) if want_final else None
    launch(_replay_kernel, (n_chunks, n_tiles, B), x, ctl, trig, modes, ck, start, y, bound,
           final if want_final else bound, words_arg, h0, L, D, N, n_chunks, n_groups,
           K=K, BN=BN, U=unroll, G=G, HAS_FINAL=want_final, VARLEN=varlen, HAS_H0=has_h0, num_warps=num_warps)
    return y, final, ctl, rnorm, bound, count
