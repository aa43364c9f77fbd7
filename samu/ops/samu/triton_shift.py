"""SAMU's sequence-parallel correction as one Triton kernel each way (samu.ops.sequence_parallel).

A shard entered with state h has y_t = y0_t + P_t h per mode (complex, fused coordinates: real parts in
columns [0, N), imaginary parts in [N, 2N)), with

    P_t = exp(-e^nu mass_t) exp(i (turns_tn + drift_t)),   turns_tn = ((t + 1) e^theta_log) mod 2 pi,

mass and drift the shard's cumulative sums of the controller's m and phi (float64, drift already reduced
mod 2 pi). The PyTorch form builds P [B, L, N] complex and autograd saves it: ~10 passes over B·L·D words
each way. Here the forward reads y0 and writes y (P formed in registers from the two [B, L] sums and the
[N] parameters), and the backward reads dy once: dy0 is dy itself, and the kernel writes fixed-order
partial sums (over its modes for d mass and d drift, over its tokens for dh, d nu and d theta_log) that
the host adds up in a fixed order, so results repeat to the bit.

turns is formed in float64 from the step index, as the PyTorch form does, before it becomes fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from samu.ops.triton_utils import cast_to, cdiv, launch

# tokens x modes of one program
BT, BN = 64, 32


@triton.jit
def _correction(mass, drift, rate, omega, h, L, N, BT: tl.constexpr, BN: tl.constexpr):
    """This program's [BT, BN] tile: its tokens, modes and masks, the mass and rate it read, P_t as (radius,
    cos, sin) in fp32 (the phase's mode term formed in float64) and the correction c = P h (real, imaginary)."""
    i_t, i_n, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    t = i_t * BT + tl.arange(0, BT)
    n = i_n * BN + tl.arange(0, BN)
    ok_t, ok_n = t < L, n < N
    row = i_b.to(tl.int64) * L + t
    b_mass = tl.load(mass + row, mask=ok_t, other=0.0).to(tl.float32)
    b_drift = tl.load(drift + row, mask=ok_t, other=0.0).to(tl.float32)
    b_rate = tl.load(rate + n, mask=ok_n, other=0.0)
    b_omega = tl.load(omega + n, mask=ok_n, other=0.0)
    h_re = tl.load(h + i_b * 2 * N + n, mask=ok_n, other=0.0)[None, :]
    h_im = tl.load(h + i_b * 2 * N + N + n, mask=ok_n, other=0.0)[None, :]
    turns = (t + 1).to(tl.float64)[:, None] * b_omega[None, :]
    turns = turns - 6.283185307179586 * tl.floor(turns / 6.283185307179586)
    phase = turns.to(tl.float32) + b_drift[:, None]
    radius = tl.exp(-(b_mass[:, None] * b_rate[None, :]))
    c, s = tl.cos(phase), tl.sin(phase)
    c_re = radius * (c * h_re - s * h_im)
    c_im = radius * (s * h_re + c * h_im)
    return t, n, ok_t, ok_n, b_mass, b_rate, radius, c, s, c_re, c_im


@triton.jit
def _tile_offsets(t, n, N):
    """Offsets of the real parts of a [BT, BN] tile in a [L, 2N] row block (the imaginary parts: + N)."""
    return t.to(tl.int64)[:, None] * 2 * N + n[None, :]


@triton.jit
def _shift_fwd(y0, y, mass, drift, rate, omega, h, L, N, BT: tl.constexpr, BN: tl.constexpr):
    t, n, ok_t, ok_n, _, _, _, _, _, c_re, c_im = _correction(mass, drift, rate, omega, h, L, N, BT, BN)
    ok = ok_t[:, None] & ok_n[None, :]
    offs = tl.program_id(2).to(tl.int64) * L * 2 * N + _tile_offsets(t, n, N)
    re = tl.load(y0 + offs, mask=ok, other=0.0).to(tl.float32)
    im = tl.load(y0 + offs + N, mask=ok, other=0.0).to(tl.float32)
    tl.store(y + offs, cast_to(re + c_re, y.dtype.element_ty), mask=ok)
    tl.store(y + offs + N, cast_to(im + c_im, y.dtype.element_ty), mask=ok)


@triton.jit
def _shift_bwd(dy, mass, drift, rate, omega, h, d_tok, d_mode, L, N, n_ttiles, n_ntiles,
               BT: tl.constexpr, BN: tl.constexpr):
    """d_tok [B, 2, n_ntiles, L]: per token, this tile's sums over modes of d mass and d drift;
    d_mode [B, 4, n_ttiles, N]: per mode, this tile's sums over tokens of dh (real, imaginary),
    -mass dlog|P| (for d nu) and (t + 1) darg P (for d theta_log)."""
    t, n, ok_t, ok_n, b_mass, b_rate, radius, c, s, c_re, c_im = _correction(mass, drift, rate, omega, h, L, N,
                                                                              BT, BN)
    i_t, i_n, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    ok = ok_t[:, None] & ok_n[None, :]
    offs = i_b.to(tl.int64) * L * 2 * N + _tile_offsets(t, n, N)
    g_re = tl.load(dy + offs, mask=ok, other=0.0).to(tl.float32)   # zeros outside the tile: no terms
    g_im = tl.load(dy + offs + N, mask=ok, other=0.0).to(tl.float32)
    # dL/dlog|P| = Re(g conj(c)), dL/darg P = Im(g conj(c)) (dc/darg P = i c)
    d_log = g_re * c_re + g_im * c_im
    d_arg = g_im * c_re - g_re * c_im
    # dh = conj(P) g
    dh_re = radius * (c * g_re + s * g_im)
    dh_im = radius * (c * g_im - s * g_re)
    p_tok = d_tok + (i_b.to(tl.int64) * 2 * n_ntiles + i_n) * L + t
    tl.store(p_tok, tl.sum(-b_rate[None, :] * d_log, axis=1), mask=ok_t)
    tl.store(p_tok + n_ntiles * L, tl.sum(d_arg, axis=1), mask=ok_t)
    p_mode = d_mode + (i_b.to(tl.int64) * 4 * n_ttiles + i_t) * N + n
    tl.store(p_mode, tl.sum(dh_re, axis=0), mask=ok_n)
    tl.store(p_mode + n_ttiles * N, tl.sum(dh_im, axis=0), mask=ok_n)
    tl.store(p_mode + 2 * n_ttiles * N, tl.sum(-b_mass[:, None] * d_log, axis=0), mask=ok_n)
    tl.store(p_mode + 3 * n_ttiles * N, tl.sum((t + 1).to(tl.float32)[:, None] * d_arg, axis=0), mask=ok_n)


def _constants(nu, theta_log):
    """e^nu (fp32, as the PyTorch form's rate in fp32) and e^theta_log (float64, for the turns)."""
    return torch.exp(nu.detach().double()).float().contiguous(), torch.exp(theta_log.detach().double()).contiguous()


class SamuShift(torch.autograd.Function):
    """y = y0 + P h (module docstring): y0 [B, L, D] in x's dtype, mass and drift [B, L] float64, nu and
    theta_log [N], h [B, D] (any float dtype; fp32 inside). Returns y in y0's dtype."""

    @staticmethod
    def forward(ctx, y0, mass, drift, nu, theta_log, h):
        B, L, D = y0.shape
        N = D // 2
        rate, omega = _constants(nu, theta_log)
        mass, drift = mass.contiguous(), drift.contiguous()
        h32 = h.detach().float().contiguous()
        y = torch.empty_like(y0)
        if y.numel():
            launch(_shift_fwd, (cdiv(L, BT), cdiv(N, BN), B), y0.contiguous(), y, mass, drift, rate, omega, h32, L,
                   N, BT=BT, BN=BN, num_warps=4)
        ctx.save_for_backward(mass, drift, nu, theta_log, h32)
        ctx.h_dtype = h.dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        mass, drift, nu, theta_log, h32 = ctx.saved_tensors
        B, L, D = dy.shape
        N = D // 2
        rate, omega = _constants(nu, theta_log)
        n_ttiles, n_ntiles = cdiv(L, BT), cdiv(N, BN)
        f32 = dict(device=dy.device, dtype=torch.float32)
        d_tok = torch.empty(B, 2, n_ntiles, L, **f32)
        d_mode = torch.empty(B, 4, n_ttiles, N, **f32)
        if dy.numel():
            launch(_shift_bwd, (n_ttiles, n_ntiles, B), dy.contiguous(), mass, drift, rate, omega, h32, d_tok, d_mode,
                   L, N, n_ttiles, n_ntiles, BT=BT, BN=BN, num_warps=4)
        else:
            d_tok.zero_()
            d_mode.zero_()
        # fixed-order sums of the partials, in float64
        d_tok, d_mode = d_tok.double().sum(2), d_mode.double().sum(2)
        dh = torch.cat([d_mode[:, 0], d_mode[:, 1]], -1).to(ctx.h_dtype)
        d_nu = (rate.double() * d_mode[:, 2].sum(0)).to(nu.dtype)
        d_theta = (omega * d_mode[:, 3].sum(0)).to(theta_log.dtype)
        return dy, d_tok[:, 0].to(mass.dtype), d_tok[:, 1].to(drift.dtype), d_nu, d_theta, dh
