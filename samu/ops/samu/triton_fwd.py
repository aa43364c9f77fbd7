"""SAMU forward in Triton: controller, chunk summaries with a group-local prefix, outer prefix, replay.

Layouts (fp32 unless noted; complex quantities in fused coordinates, real parts then imaginary):
  x, y      [B, L, D]       input dtype
  ctl       [B, 4, L]       p0, p1, m, phi per token (planar, so a chunk's vector is contiguous)
  rnorm     [2]             1 / ||u_j||
  ck        [B, nC, 2, D]   per chunk: (prod lambda, state) of the group's chunks before it
  grp       [B, nG, 2, D]   per group: (prod lambda, state) over the whole group
  start     [B, nG, D]      state entering each group (outer prefix)
  bound     [B, nC, D]      state entering each chunk (saved for backward)
See README.md beside this file for the derivation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from samu.ops.triton_utils import cast_to, one_minus_exp_neg, tanh


@triton.jit
def _affine_combine(ar1, ai1, br1, bi1, ar2, ai2, br2, bi2):
    # (a1, b1) then (a2, b2): h -> a2 (a1 h + b1) + b2, complex
    return (ar2 * ar1 - ai2 * ai1, ar2 * ai1 + ai2 * ar1,
            ar2 * br1 - ai2 * bi1 + br2, ar2 * bi1 + ai2 * br1 + bi2)


@triton.jit
def _transition(b_m, b_cphi, b_sphi, b_rate, b_cth, b_sth):
    """w, rho and lambda = rho exp(i(theta + phi)) for a [K, 1] token column and a [1, BN] mode row."""
    b_w = b_m * b_rate
    b_rho = tl.exp(-b_w)
    b_lr = b_rho * (b_cth * b_cphi - b_sth * b_sphi)
    b_li = b_rho * (b_sth * b_cphi + b_cth * b_sphi)
    return b_w, b_rho, b_lr, b_li


@triton.jit
def _gamma(b_w):
    # gamma = sqrt(1 - rho^2) = sqrt(-expm1(-2 w)), accurate as w -> 0
    return tl.sqrt(one_minus_exp_neg(2.0 * b_w))


@triton.jit
def _mode_row(nu, theta_log, i_n, mask_n):
    """Per-mode constants for a [BN] tile: rate exp(nu), cos and sin of theta = exp(theta_log)."""
    b_rate = tl.exp(tl.load(nu + i_n, mask=mask_n, other=0.0))
    b_th = tl.exp(tl.load(theta_log + i_n, mask=mask_n, other=0.0))
    return b_rate[None, :], tl.cos(b_th)[None, :], tl.sin(b_th)[None, :]


@triton.jit
def _token_col(ctl, i_b, i_t, L, mask_t):
    """Per-token m, cos(phi), sin(phi) for a [K] tile, as [K, 1] columns (m = 0 where masked)."""
    p_ctl = ctl + i_b.to(tl.int64) * 4 * L
    b_m = tl.load(p_ctl + 2 * L + i_t, mask=mask_t, other=0.0)
    b_phi = tl.load(p_ctl + 3 * L + i_t, mask=mask_t, other=0.0)
    return b_m[:, None], tl.cos(b_phi)[:, None], tl.sin(b_phi)[:, None]


@triton.jit
def _load_pair(ptr, row_off, i_n, N, mask):
    """Real and imaginary parts of a complex tile stored in fused coordinates."""
    b_re = tl.load(ptr + row_off + i_n, mask=mask, other=0.0).to(tl.float32)
    b_im = tl.load(ptr + row_off + N + i_n, mask=mask, other=0.0).to(tl.float32)
    return b_re, b_im


@triton.jit
def _chunk_scan(x, ctl, i_b, i_c, L, D, N, b_rate, b_cth, b_sth, i_n, mask_n,
                K: tl.constexpr):
    """Local scan of chunk i_c for one mode tile from a zero state: (prod lambda, state) per token."""
    i_t = i_c * K + tl.arange(0, K)
    mask_t = i_t < L
    b_m, b_cphi, b_sphi = _token_col(ctl, i_b, i_t, L, mask_t)
    _, b_rho, b_lr, b_li = _transition(b_m, b_cphi, b_sphi, b_rate, b_cth, b_sth)
    b_g = _gamma(b_m * b_rate)
    row = (i_b.to(tl.int64) * L + i_t.to(tl.int64)) * D
    mask = mask_t[:, None] & mask_n[None, :]
    b_zr, b_zi = _load_pair(x, row[:, None], i_n[None, :], N, mask)
    return tl.associative_scan((b_lr, b_li, b_g * b_zr, b_g * b_zi), 0, _affine_combine)


@triton.jit
def _last_row(b, K: tl.constexpr):
    """Row K-1 of a [K, BN] tile, as [BN] (an exact selection)."""
    return tl.sum(tl.where(tl.arange(0, K)[:, None] == K - 1, b, 0.0), axis=0)


@triton.jit
def _controller_kernel(x, directions, amplitudes, ctl, rnorm, L, D, kappa,
                       BT: tl.constexpr, BD: tl.constexpr):
    """p = <u_j / ||u_j||, x_t>, c = A p, m = exp(k tanh(c0 / k)), phi = c1 for BT tokens."""
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
    p_ctl = ctl + i_b.to(tl.int64) * 4 * L + i_t
    tl.store(p_ctl, b_p0, mask=mask_t)
    tl.store(p_ctl + L, b_p1, mask=mask_t)
    tl.store(p_ctl + 2 * L, b_m, mask=mask_t)
    tl.store(p_ctl + 3 * L, b_c1, mask=mask_t)
    if (i_tb == 0) & (i_b == 0):
        tl.store(rnorm, b_r0)
        tl.store(rnorm + 1, b_r1)


@triton.jit
def _summary_kernel(x, ctl, nu, theta_log, ck, grp, L, D, N, n_chunks, n_groups,
                    K: tl.constexpr, BN: tl.constexpr, G: tl.constexpr):
    """Chunk summaries of one group of G chunks, composed left to right (group-local prefix)."""
    i_g, i_j, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_n = i_j * BN + tl.arange(0, BN)
    mask_n = i_n < N
    b_rate, b_cth, b_sth = _mode_row(nu, theta_log, i_n, mask_n)
    b_pr = tl.full([BN], 1.0, dtype=tl.float32)
    b_pi = tl.zeros([BN], dtype=tl.float32)
    b_er = tl.zeros([BN], dtype=tl.float32)
    b_ei = tl.zeros([BN], dtype=tl.float32)
    for i_k in range(G):
        i_c = i_g * G + i_k
        if i_c < n_chunks:
            if G > 1:
                p_ck = ck + (i_b.to(tl.int64) * n_chunks + i_c) * 2 * D
                tl.store(p_ck + i_n, b_pr, mask=mask_n)
                tl.store(p_ck + N + i_n, b_pi, mask=mask_n)
                tl.store(p_ck + D + i_n, b_er, mask=mask_n)
                tl.store(p_ck + D + N + i_n, b_ei, mask=mask_n)
            s_ar, s_ai, s_br, s_bi = _chunk_scan(x, ctl, i_b, i_c, L, D, N, b_rate, b_cth, b_sth,
                                                 i_n, mask_n, K)
            c_ar, c_ai = _last_row(s_ar, K), _last_row(s_ai, K)
            c_br, c_bi = _last_row(s_br, K), _last_row(s_bi, K)
            b_pr, b_pi, b_er, b_ei = _affine_combine(b_pr, b_pi, b_er, b_ei, c_ar, c_ai, c_br, c_bi)
    p_grp = grp + (i_b.to(tl.int64) * n_groups + i_g) * 2 * D
    tl.store(p_grp + i_n, b_pr, mask=mask_n)
    tl.store(p_grp + N + i_n, b_pi, mask=mask_n)
    tl.store(p_grp + D + i_n, b_er, mask=mask_n)
    tl.store(p_grp + D + N + i_n, b_ei, mask=mask_n)


@triton.jit
def _prefix_kernel(grp, h0, start, D, N, n_groups,
                   BN: tl.constexpr, HAS_H0: tl.constexpr, REVERSE: tl.constexpr):
    """Serial walk over group summaries: the state entering every group (from the right if REVERSE)."""
    i_j, i_b = tl.program_id(0), tl.program_id(1)
    i_n = i_j * BN + tl.arange(0, BN)
    mask_n = i_n < N
    if HAS_H0:
        b_hr = tl.load(h0 + i_b.to(tl.int64) * D + i_n, mask=mask_n, other=0.0).to(tl.float32)
        b_hi = tl.load(h0 + i_b.to(tl.int64) * D + N + i_n, mask=mask_n, other=0.0).to(tl.float32)
    else:
        b_hr = tl.zeros([BN], dtype=tl.float32)
        b_hi = tl.zeros([BN], dtype=tl.float32)
    for i_s in range(n_groups):
        i_g = n_groups - 1 - i_s if REVERSE else i_s
        p_st = start + (i_b.to(tl.int64) * n_groups + i_g) * D
        tl.store(p_st + i_n, b_hr, mask=mask_n)
        tl.store(p_st + N + i_n, b_hi, mask=mask_n)
        p_grp = grp + (i_b.to(tl.int64) * n_groups + i_g) * 2 * D
        b_ar, b_ai = _load_pair(p_grp, 0, i_n, N, mask_n)
        b_br, b_bi = _load_pair(p_grp, D, i_n, N, mask_n)
        b_hr, b_hi = b_ar * b_hr - b_ai * b_hi + b_br, b_ar * b_hi + b_ai * b_hr + b_bi


@triton.jit
def _entering(ck, start, i_b, i_c, D, N, n_chunks, n_groups, i_n, mask_n, G: tl.constexpr):
    """State entering chunk i_c: the group's entering state carried through the group's earlier chunks."""
    i_g = i_c // G
    b_sr, b_si = _load_pair(start, (i_b.to(tl.int64) * n_groups + i_g) * D, i_n, N, mask_n)
    if G > 1:
        p_ck = (i_b.to(tl.int64) * n_chunks + i_c) * 2 * D
        b_ar, b_ai = _load_pair(ck, p_ck, i_n, N, mask_n)
        b_br, b_bi = _load_pair(ck, p_ck + D, i_n, N, mask_n)
        b_sr, b_si = b_ar * b_sr - b_ai * b_si + b_br, b_ar * b_si + b_ai * b_sr + b_bi
    return b_sr, b_si


@triton.jit
def _replay_kernel(x, ctl, nu, theta_log, ck, start, y, bound, final, L, D, N, n_chunks, n_groups,
                   K: tl.constexpr, BN: tl.constexpr, G: tl.constexpr, HAS_FINAL: tl.constexpr):
    """Rerun each chunk from its entering state and write y (and the final state)."""
    i_c, i_j, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_n = i_j * BN + tl.arange(0, BN)
    mask_n = i_n < N
    b_rate, b_cth, b_sth = _mode_row(nu, theta_log, i_n, mask_n)
    b_sr, b_si = _entering(ck, start, i_b, i_c, D, N, n_chunks, n_groups, i_n, mask_n, G)
    p_bd = bound + (i_b.to(tl.int64) * n_chunks + i_c) * D
    tl.store(p_bd + i_n, b_sr, mask=mask_n)
    tl.store(p_bd + N + i_n, b_si, mask=mask_n)
    s_ar, s_ai, s_br, s_bi = _chunk_scan(x, ctl, i_b, i_c, L, D, N, b_rate, b_cth, b_sth, i_n, mask_n, K)
    b_hr = s_br + s_ar * b_sr[None, :] - s_ai * b_si[None, :]
    b_hi = s_bi + s_ar * b_si[None, :] + s_ai * b_sr[None, :]
    i_t = i_c * K + tl.arange(0, K)
    row = (i_b.to(tl.int64) * L + i_t.to(tl.int64)) * D
    mask = (i_t < L)[:, None] & mask_n[None, :]
    p_y = y + row[:, None] + i_n[None, :]
    tl.store(p_y, cast_to(b_hr, y.dtype.element_ty), mask=mask)
    tl.store(p_y + N, cast_to(b_hi, y.dtype.element_ty), mask=mask)
    if HAS_FINAL:
        if i_c == n_chunks - 1:
            last = (i_t == L - 1)[:, None] & mask_n[None, :]
            p_f = final + i_b.to(tl.int64) * D + tl.zeros([K], dtype=tl.int64)[:, None] + i_n[None, :]
            tl.store(p_f, b_hr, mask=last)
            tl.store(p_f + N, b_hi, mask=last)


def fwd(x, nu, theta_log, directions, amplitudes, initial_state, radial_bound, *, K, BN, G,
        num_warps=4, want_final=True, empty=torch.empty):
    """Forward pass. Returns y [B, L, D] (x.dtype), final [B, D] fp32 (or None), and the saved
    tensors for backward: ctl [B, 4, L], rnorm [2], bound [B, nC, D].

    ``empty`` allocates every output (tests pass one that fills NaN, so unwritten elements show).
    """
    B, L, D = x.shape
    N = D // 2
    n_chunks = triton.cdiv(L, K)
    n_groups = triton.cdiv(n_chunks, G)
    n_tiles = triton.cdiv(N, BN)
    f32 = dict(device=x.device, dtype=torch.float32)
    ctl = empty(B, 4, L, **f32)
    rnorm = empty(2, **f32)
    BT = 16
    _controller_kernel[(triton.cdiv(L, BT), B)](x, directions, amplitudes, ctl, rnorm, L, D, float(radial_bound),
                                                BT=BT, BD=min(256, triton.next_power_of_2(D)), num_warps=num_warps)
    ck = empty(B, n_chunks, 2, D, **f32) if G > 1 else rnorm
    grp = empty(B, n_groups, 2, D, **f32)
    _summary_kernel[(n_groups, n_tiles, B)](x, ctl, nu, theta_log, ck, grp, L, D, N, n_chunks, n_groups,
                                            K=K, BN=BN, G=G, num_warps=num_warps)
    start = empty(B, n_groups, D, **f32)
    has_h0 = initial_state is not None
    _prefix_kernel[(n_tiles, B)](grp, initial_state if has_h0 else grp, start, D, N, n_groups,
                                 BN=BN, HAS_H0=has_h0, REVERSE=False, num_warps=1)
    y = empty(B, L, D, device=x.device, dtype=x.dtype)
    bound = empty(B, n_chunks, D, **f32)
    final = empty(B, D, **f32) if want_final else None
    _replay_kernel[(n_chunks, n_tiles, B)](x, ctl, nu, theta_log, ck, start, y, bound,
                                           final if want_final else bound, L, D, N, n_chunks, n_groups,
                                           K=K, BN=BN, G=G, HAS_FINAL=want_final, num_warps=num_warps)
    return y, final, ctl, rnorm, bound
