"""SAMU backward in Triton (SPEC §3.1): adjoint summaries, reverse prefix, replay, reductions.

Kernels, in launch order:
  _adjoint_summary_kernel  conjugated reverse chunk summaries with a group-local prefix (right to left)
  _prefix_kernel           (from triton_fwd, REVERSE) adjoint entering every group from the right
  _main_kernel             per (chunk, mode tile): delta and h_{t-1} as register tiles, the per-token
                           controller partials [B, 2, n_tiles, L] and per-mode partial sums
  _controller_kernel       fixed-order sum of the controller partials over mode tiles -> dp, dA partials
  _dx_kernel               dx = gamma delta + dp . u_hat, and the direction-gradient partials
  _reduce_kernel           fixed-order sums over all partial rows -> parameter gradients
Extra layouts (fp32): rck [B, nC, 2, D], rgrp [B, nG, 2, D], right [B, nG, D] mirror ck, grp, start;
part [B, 2, n_tiles, L]; dp [B, 2, L]; rows [B * nC, 3 D] = (w dL/dw | dL/dpsi | du_0 | du_1) partials.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from samu.ops.samu.triton_fwd import (_affine_combine, _entering, _gamma, _load_pair, _mode_row,
                                      _prefix_kernel, _token_col, _transition)
from samu.ops.triton_utils import cast_to, tanh


@triton.jit
def _first_row(b, K: tl.constexpr):
    """Row 0 of a [K, BN] tile, as [BN] (an exact selection)."""
    return tl.sum(tl.where(tl.arange(0, K)[:, None] == 0, b, 0.0), axis=0)


@triton.jit
def _adjoint_scan(dy, dfinal, ctl, i_b, i_c, L, D, N, b_rate, b_cth, b_sth, i_n, mask_n,
                  K: tl.constexpr, HAS_DFINAL: tl.constexpr):
    """Local reverse scan of delta_t = conj(lambda_{t+1}) delta_{t+1} + g_t over chunk i_c from zero.

    g is dy in complex form, plus the final-state cotangent at t = L - 1; lambda_L := 0.
    """
    i_t = i_c * K + tl.arange(0, K)
    mask_t = i_t < L
    mask = mask_t[:, None] & mask_n[None, :]
    row = (i_b.to(tl.int64) * L + i_t.to(tl.int64)) * D
    b_gr, b_gi = _load_pair(dy, row[:, None], i_n[None, :], N, mask)
    if HAS_DFINAL:
        last = (i_t == L - 1)[:, None] & mask_n[None, :]
        p_f = dfinal + i_b.to(tl.int64) * D + i_n[None, :]
        b_gr += tl.load(p_f + tl.zeros([K], dtype=tl.int64)[:, None], mask=last, other=0.0)
        b_gi += tl.load(p_f + N + tl.zeros([K], dtype=tl.int64)[:, None], mask=last, other=0.0)
    mask_next = (i_t + 1) < L
    b_m, b_cphi, b_sphi = _token_col(ctl, i_b, i_t + 1, L, mask_next)
    _, _, b_lr, b_li = _transition(b_m, b_cphi, b_sphi, b_rate, b_cth, b_sth)
    b_lr = tl.where(mask_next[:, None], b_lr, 0.0)
    b_li = tl.where(mask_next[:, None], -b_li, 0.0)
    return tl.associative_scan((b_lr, b_li, b_gr, b_gi), 0, _affine_combine, reverse=True)


@triton.jit
def _adjoint(dy, dfinal, ctl, rck, right, i_b, i_c, L, D, N, n_chunks, n_groups, b_rate, b_cth, b_sth,
             i_n, mask_n, K: tl.constexpr, G: tl.constexpr, HAS_DFINAL: tl.constexpr):
    """delta over chunk i_c as a [K, BN] complex tile (local reverse scan plus the entering adjoint)."""
    s_ar, s_ai, s_br, s_bi = _adjoint_scan(dy, dfinal, ctl, i_b, i_c, L, D, N, b_rate, b_cth, b_sth,
                                           i_n, mask_n, K, HAS_DFINAL)
    b_er, b_ei = _entering(rck, right, i_b, i_c, D, N, n_chunks, n_groups, i_n, mask_n, G)
    return s_br + s_ar * b_er[None, :] - s_ai * b_ei[None, :], s_bi + s_ar * b_ei[None, :] + s_ai * b_er[None, :]


@triton.jit
def _adjoint_summary_kernel(dy, dfinal, ctl, nu, theta_log, rck, rgrp, L, D, N, n_chunks, n_groups,
                            K: tl.constexpr, BN: tl.constexpr, G: tl.constexpr, HAS_DFINAL: tl.constexpr):
    """Reverse chunk summaries of one group, composed right to left (group-local reverse prefix)."""
    i_g, i_j, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_n = i_j * BN + tl.arange(0, BN)
    mask_n = i_n < N
    b_rate, b_cth, b_sth = _mode_row(nu, theta_log, i_n, mask_n)
    b_qr = tl.full([BN], 1.0, dtype=tl.float32)
    b_qi = tl.zeros([BN], dtype=tl.float32)
    b_fr = tl.zeros([BN], dtype=tl.float32)
    b_fi = tl.zeros([BN], dtype=tl.float32)
    for i_k in range(G):
        i_c = i_g * G + (G - 1 - i_k)
        if i_c < n_chunks:
            if G > 1:
                p_ck = rck + (i_b.to(tl.int64) * n_chunks + i_c) * 2 * D
                tl.store(p_ck + i_n, b_qr, mask=mask_n)
                tl.store(p_ck + N + i_n, b_qi, mask=mask_n)
                tl.store(p_ck + D + i_n, b_fr, mask=mask_n)
                tl.store(p_ck + D + N + i_n, b_fi, mask=mask_n)
            s_ar, s_ai, s_br, s_bi = _adjoint_scan(dy, dfinal, ctl, i_b, i_c, L, D, N, b_rate, b_cth, b_sth,
                                                   i_n, mask_n, K, HAS_DFINAL)
            c_ar, c_ai = _first_row(s_ar, K), _first_row(s_ai, K)
            c_br, c_bi = _first_row(s_br, K), _first_row(s_bi, K)
            b_qr, b_qi, b_fr, b_fi = _affine_combine(b_qr, b_qi, b_fr, b_fi, c_ar, c_ai, c_br, c_bi)
    p_grp = rgrp + (i_b.to(tl.int64) * n_groups + i_g) * 2 * D
    tl.store(p_grp + i_n, b_qr, mask=mask_n)
    tl.store(p_grp + N + i_n, b_qi, mask=mask_n)
    tl.store(p_grp + D + i_n, b_fr, mask=mask_n)
    tl.store(p_grp + D + N + i_n, b_fi, mask=mask_n)


@triton.jit
def _main_kernel(x, dy, dfinal, ctl, nu, theta_log, bound, rck, right, part, rows, dh0,
                 L, D, N, n_chunks, n_groups, n_tiles,
                 K: tl.constexpr, BN: tl.constexpr, G: tl.constexpr, HAS_DFINAL: tl.constexpr,
                 HAS_H0: tl.constexpr):
    """Per (chunk, mode tile): the transition and scale cotangents, reduced over modes and tokens."""
    i_c, i_j, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_n = i_j * BN + tl.arange(0, BN)
    mask_n = i_n < N
    b_rate, b_cth, b_sth = _mode_row(nu, theta_log, i_n, mask_n)
    b_dr, b_di = _adjoint(dy, dfinal, ctl, rck, right, i_b, i_c, L, D, N, n_chunks, n_groups, b_rate, b_cth,
                          b_sth, i_n, mask_n, K, G, HAS_DFINAL)
    i_k = tl.arange(0, K)
    i_t = i_c * K + i_k
    mask_t = i_t < L
    mask = mask_t[:, None] & mask_n[None, :]
    # h_{t-1} as an inclusive scan of the coefficients shifted by one token, the entering state at row 0
    mask_prev = (i_k >= 1) & mask_t
    b_m, b_cphi, b_sphi = _token_col(ctl, i_b, i_t - 1, L, mask_prev)
    b_w, _, b_lr, b_li = _transition(b_m, b_cphi, b_sphi, b_rate, b_cth, b_sth)
    b_g = _gamma(b_w)
    row_prev = (i_b.to(tl.int64) * L + (i_t - 1).to(tl.int64)) * D
    b_zr, b_zi = _load_pair(x, row_prev[:, None], i_n[None, :], N, mask_prev[:, None] & mask_n[None, :])
    b_sr, b_si = _load_pair(bound, (i_b.to(tl.int64) * n_chunks + i_c) * D, i_n, N, mask_n)
    first = (i_k == 0)[:, None]
    _, _, b_hr, b_hi = tl.associative_scan(
        (tl.where(first, 0.0, b_lr), tl.where(first, 0.0, b_li),
         tl.where(first, b_sr[None, :], b_g * b_zr), tl.where(first, b_si[None, :], b_g * b_zi)),
        0, _affine_combine)
    # this token's transition, scale and input
    b_m, b_cphi, b_sphi = _token_col(ctl, i_b, i_t, L, mask_t)
    b_w, b_rho, b_lr, b_li = _transition(b_m, b_cphi, b_sphi, b_rate, b_cth, b_sth)
    b_g = _gamma(b_w)
    row = (i_b.to(tl.int64) * L + i_t.to(tl.int64)) * D
    b_zr, b_zi = _load_pair(x, row[:, None], i_n[None, :], N, mask)
    # v = conj(G_lambda) = conj(delta) h_{t-1}; with v lambda: dL/dpsi = -Im(v lambda), w rho dL/drho = w Re(v lambda)
    b_vr = b_dr * b_hr + b_di * b_hi
    b_vi = b_dr * b_hi - b_di * b_hr
    b_vlr = b_vr * b_lr - b_vi * b_li
    b_vli = b_vr * b_li + b_vi * b_lr
    b_dpsi = tl.where(mask, -b_vli, 0.0)
    b_dgamma = b_dr * b_zr + b_di * b_zi
    # w dL/dw = -w rho dL/drho + (w / gamma) rho^2 dL/dgamma; w / gamma -> 0 as w -> 0
    b_wg = tl.where(b_w > 0.0, b_w / tl.where(b_w > 0.0, b_g, 1.0), 0.0)
    b_wdw = tl.where(mask, -b_w * b_vlr + b_wg * b_rho * b_rho * b_dgamma, 0.0)
    p_part = part + ((i_b.to(tl.int64) * 2 * n_tiles + i_j) * L) + i_t
    tl.store(p_part, tl.sum(b_wdw, axis=1), mask=mask_t)
    tl.store(p_part + n_tiles * L, tl.sum(b_dpsi, axis=1), mask=mask_t)
    p_rows = rows + (i_b.to(tl.int64) * n_chunks + i_c) * 3 * D
    tl.store(p_rows + i_n, tl.sum(b_wdw, axis=0), mask=mask_n)
    tl.store(p_rows + N + i_n, tl.sum(b_dpsi, axis=0), mask=mask_n)
    if HAS_H0:
        if i_c == 0:
            # d initial_state = conj(lambda_0) delta_0
            p_h = dh0 + i_b.to(tl.int64) * D + tl.zeros([K], dtype=tl.int64)[:, None] + i_n[None, :]
            row0 = first & mask_n[None, :]
            tl.store(p_h, b_lr * b_dr + b_li * b_di, mask=row0)
            tl.store(p_h + N, b_lr * b_di - b_li * b_dr, mask=row0)


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
    p_ctl = ctl + i_b.to(tl.int64) * 4 * L + i_t
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
def _dx_kernel(x, dy, dfinal, ctl, nu, theta_log, directions, rnorm, rck, right, dp, dx, rows,
               L, D, N, n_chunks, n_groups,
               K: tl.constexpr, BN: tl.constexpr, G: tl.constexpr, HAS_DFINAL: tl.constexpr):
    """dx = gamma delta + sum_j dp_j u_hat_j, and partials of sum_t dp_j (x_t - p_j u_hat_j)."""
    i_c, i_j, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_n = i_j * BN + tl.arange(0, BN)
    mask_n = i_n < N
    b_rate, b_cth, b_sth = _mode_row(nu, theta_log, i_n, mask_n)
    b_dr, b_di = _adjoint(dy, dfinal, ctl, rck, right, i_b, i_c, L, D, N, n_chunks, n_groups, b_rate, b_cth,
                          b_sth, i_n, mask_n, K, G, HAS_DFINAL)
    i_t = i_c * K + tl.arange(0, K)
    mask_t = i_t < L
    mask = mask_t[:, None] & mask_n[None, :]
    b_m = tl.load(ctl + i_b.to(tl.int64) * 4 * L + 2 * L + i_t, mask=mask_t, other=0.0)
    b_g = _gamma(b_m[:, None] * b_rate)
    r0, r1 = tl.load(rnorm), tl.load(rnorm + 1)
    b_u0r, b_u0i = _load_pair(directions, 0, i_n, N, mask_n)
    b_u1r, b_u1i = _load_pair(directions, D, i_n, N, mask_n)
    b_u0r, b_u0i, b_u1r, b_u1i = b_u0r * r0, b_u0i * r0, b_u1r * r1, b_u1i * r1
    p_dp = dp + i_b.to(tl.int64) * 2 * L + i_t
    b_dp0 = tl.load(p_dp, mask=mask_t, other=0.0)[:, None]
    b_dp1 = tl.load(p_dp + L, mask=mask_t, other=0.0)[:, None]
    b_dxr = b_g * b_dr + b_dp0 * b_u0r[None, :] + b_dp1 * b_u1r[None, :]
    b_dxi = b_g * b_di + b_dp0 * b_u0i[None, :] + b_dp1 * b_u1i[None, :]
    row = (i_b.to(tl.int64) * L + i_t.to(tl.int64)) * D
    p_dx = dx + row[:, None] + i_n[None, :]
    tl.store(p_dx, cast_to(b_dxr, dx.dtype.element_ty), mask=mask)
    tl.store(p_dx + N, cast_to(b_dxi, dx.dtype.element_ty), mask=mask)
    # dL/du_j = r_j sum_t dp_{t,j} (x_t - p_{t,j} u_hat_j); r_j is applied in the final reduction
    b_xr, b_xi = _load_pair(x, row[:, None], i_n[None, :], N, mask)
    p_ctl = ctl + i_b.to(tl.int64) * 4 * L + i_t
    b_p0 = tl.load(p_ctl, mask=mask_t, other=0.0)[:, None]
    b_p1 = tl.load(p_ctl + L, mask=mask_t, other=0.0)[:, None]
    p_rows = rows + (i_b.to(tl.int64) * n_chunks + i_c) * 3 * D + D
    tl.store(p_rows + i_n, tl.sum(b_dp0 * (b_xr - b_p0 * b_u0r[None, :]), axis=0), mask=mask_n)
    tl.store(p_rows + N + i_n, tl.sum(b_dp0 * (b_xi - b_p0 * b_u0i[None, :]), axis=0), mask=mask_n)
    tl.store(p_rows + D + i_n, tl.sum(b_dp1 * (b_xr - b_p1 * b_u1r[None, :]), axis=0), mask=mask_n)
    tl.store(p_rows + D + N + i_n, tl.sum(b_dp1 * (b_xi - b_p1 * b_u1i[None, :]), axis=0), mask=mask_n)


@triton.jit
def _reduce_kernel(rows, dA_rows, theta_log, rnorm, out, dA, n_rows, n_dA_rows, D, N,
                   BR: tl.constexpr, BC: tl.constexpr):
    """Column sums of the partial rows in a fixed order, scaled into parameter gradients.

    Columns: [0, N) w dL/dw -> dnu; [N, 2N) dL/dpsi -> dtheta_log (times theta);
    [2N, 2N + D) and [2N + D, 3D) -> d directions (times r_0, r_1). The last program sums dA.
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
        tl.store(out + i_x, b_sum * b_scale, mask=mask_x)
    else:
        i_a = tl.arange(0, 4)
        b_acc4 = tl.zeros([BR, 4], dtype=tl.float32)
        for i_r0 in range(0, n_dA_rows, BR):
            i_r = i_r0 + tl.arange(0, BR)
            b_acc4 += tl.load(dA_rows + i_r.to(tl.int64)[:, None] * 4 + i_a[None, :],
                              mask=(i_r < n_dA_rows)[:, None], other=0.0)
        tl.store(dA + i_a, tl.sum(b_acc4, axis=0))


def bwd(dy, dfinal, x, nu, theta_log, directions, amplitudes, has_h0, ctl, rnorm, bound, radial_bound, *,
        K, BN, G, num_warps=4, empty=torch.empty):
    """Backward pass. Returns dx (x.dtype), dnu, dtheta_log, ddirections, damplitudes, dh0 (or None)."""
    B, L, D = x.shape
    N = D // 2
    n_chunks = triton.cdiv(L, K)
    n_groups = triton.cdiv(n_chunks, G)
    n_tiles = triton.cdiv(N, BN)
    f32 = dict(device=x.device, dtype=torch.float32)
    has_df = dfinal is not None
    df = dfinal if has_df else ctl
    rck = empty(B, n_chunks, 2, D, **f32) if G > 1 else ctl
    rgrp = empty(B, n_groups, 2, D, **f32)
    grid = (n_groups, n_tiles, B)
    _adjoint_summary_kernel[grid](dy, df, ctl, nu, theta_log, rck, rgrp, L, D, N, n_chunks, n_groups,
                                  K=K, BN=BN, G=G, HAS_DFINAL=has_df, num_warps=num_warps)
    right = empty(B, n_groups, D, **f32)
    _prefix_kernel[(n_tiles, B)](rgrp, rgrp, right, D, N, n_groups, BN=BN, HAS_H0=False, REVERSE=True,
                                 num_warps=1)
    part = empty(B, 2, n_tiles, L, **f32)
    rows = empty(B * n_chunks, 3 * D, **f32)
    dh0 = empty(B, D, **f32) if has_h0 else None
    _main_kernel[(n_chunks, n_tiles, B)](x, dy, df, ctl, nu, theta_log, bound, rck, right, part, rows,
                                         dh0 if has_h0 else rows, L, D, N, n_chunks, n_groups, n_tiles,
                                         K=K, BN=BN, G=G, HAS_DFINAL=has_df, HAS_H0=has_h0,
                                         num_warps=num_warps)
    BT = 128
    n_tb = triton.cdiv(L, BT)
    dp = empty(B, 2, L, **f32)
    dA_rows = empty(B * n_tb, 4, **f32)
    _controller_kernel[(n_tb, B)](ctl, amplitudes, part, dp, dA_rows, L, n_tiles, float(radial_bound), BT=BT,
                                  num_warps=4)
    dx = empty(B, L, D, device=x.device, dtype=x.dtype)
    _dx_kernel[(n_chunks, n_tiles, B)](x, dy, df, ctl, nu, theta_log, directions, rnorm, rck, right, dp, dx,
                                       rows, L, D, N, n_chunks, n_groups, K=K, BN=BN, G=G, HAS_DFINAL=has_df,
                                       num_warps=num_warps)
    out = empty(3 * D, **f32)
    dA = empty(4, **f32)
    BC = 128
    _reduce_kernel[(triton.cdiv(3 * D, BC) + 1,)](rows, dA_rows, theta_log, rnorm, out, dA, B * n_chunks,
                                                  B * n_tb, D, N, BR=16, BC=BC, num_warps=4)
    return dx, out[:N], out[N:D], out[D:].view(2, D), dA.view(2, 2), dh0
