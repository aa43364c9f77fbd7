"""Triton kernels of one decoding step of each mixer (samu.ops.step): one launch per token and mixer.

Both evaluate the serial reference's definitions (samu.reference) for a single token in fp32, read the
state [B, D] fp32 and write the new state and y_t; the new state may be written over the old one (each
element is read and then written by the same thread).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from samu.ops.rglru.triton_fwd import _sigmoid_channel, _softplus, math_mode
from samu.ops.triton_utils import cast_to, next_power_of_2, one_minus_exp_neg, tanh

# input rows of the RG-LRU gate matrices one pass of the matvec reads
GATE_ROWS = 32


@triton.jit
def _samu_step(x, nu, theta_log, directions, amplitudes, h, y, h_out, N, radial_bound, BN: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, BN)   # [BN] modes
    ok = k < N
    D = 2 * N
    x_re = tl.load(x + b * D + k, mask=ok, other=0.0).to(tl.float32)
    x_im = tl.load(x + b * D + N + k, mask=ok, other=0.0).to(tl.float32)
    u0_re = tl.load(directions + k, mask=ok, other=0.0)
    u0_im = tl.load(directions + N + k, mask=ok, other=0.0)
    u1_re = tl.load(directions + D + k, mask=ok, other=0.0)
    u1_im = tl.load(directions + D + N + k, mask=ok, other=0.0)
    # p = x . (u / |u|) for the two directions; c = A p; m = exp(kappa tanh(c0 / kappa)); phi = c1
    p0 = tl.sum(x_re * u0_re + x_im * u0_im, axis=0) / tl.sqrt(tl.sum(u0_re * u0_re + u0_im * u0_im, axis=0))
    p1 = tl.sum(x_re * u1_re + x_im * u1_im, axis=0) / tl.sqrt(tl.sum(u1_re * u1_re + u1_im * u1_im, axis=0))
    c0 = tl.load(amplitudes) * p0 + tl.load(amplitudes + 1) * p1
    phi = tl.load(amplitudes + 2) * p0 + tl.load(amplitudes + 3) * p1
    m = tl.exp(radial_bound * tanh(c0 / radial_bound))
    # lambda = exp(-w) e^{i (exp(theta_log) + phi)}, gamma = sqrt(1 - exp(-2 w)), w = m e^nu
    w = m * tl.exp(tl.load(nu + k, mask=ok, other=0.0))
    rho = tl.exp(-w)
    psi = tl.exp(tl.load(theta_log + k, mask=ok, other=0.0)) + phi
    lam_re, lam_im = rho * tl.cos(psi), rho * tl.sin(psi)
    gamma = tl.sqrt(one_minus_exp_neg(2.0 * w))
    h_re = tl.load(h + b * D + k, mask=ok, other=0.0)
    h_im = tl.load(h + b * D + N + k, mask=ok, other=0.0)
    new_re = lam_re * h_re - lam_im * h_im + gamma * x_re
    new_im = lam_re * h_im + lam_im * h_re + gamma * x_im
    tl.store(h_out + b * D + k, new_re, mask=ok)
    tl.store(h_out + b * D + N + k, new_im, mask=ok)
    tl.store(y + b * D + k, cast_to(new_re, y.dtype.element_ty), mask=ok)
    tl.store(y + b * D + N + k, cast_to(new_im, y.dtype.element_ty), mask=ok)


@triton.jit
def _rglru_step(x, w_a, b_a, w_x, b_x, a_param, h, y, h_out, D, HD, c, BH: tl.constexpr, ROWS: tl.constexpr,
                MATH: tl.constexpr):
    b, head = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    j = tl.arange(0, BH)   # [BH] output channels of the head
    ok = j < HD
    base = b * D + head * HD
    # gate_a = sigmoid(x_h w_a[h] + b_a), gate_x likewise, accumulated over ROWS input rows at a time
    acc_a = tl.zeros((BH,), tl.float32)
    acc_x = tl.zeros((BH,), tl.float32)
    for i0 in tl.range(0, HD, ROWS):
        i = i0 + tl.arange(0, ROWS)   # [ROWS] input channels
        i_ok = i < HD
        xi = tl.load(x + base + i, mask=i_ok, other=0.0).to(tl.float32)
        wm = i_ok[:, None] & ok[None, :]
        w_off = head * HD * HD + i[:, None] * HD + j[None, :]
        acc_a += tl.sum(xi[:, None] * tl.load(w_a + w_off, mask=wm, other=0.0), axis=0)
        acc_x += tl.sum(xi[:, None] * tl.load(w_x + w_off, mask=wm, other=0.0), axis=0)
    ch = head * HD + j
    # the forward kernels' correctly rounded per-channel functions
    gate_a = _sigmoid_channel(acc_a + tl.load(b_a + ch, mask=ok, other=0.0), MATH)
    gate_x = _sigmoid_channel(acc_x + tl.load(b_x + ch, mask=ok, other=0.0), MATH)
    log_a = -c * gate_a * _softplus(tl.load(a_param + ch, mask=ok, other=0.0), MATH)
    # h = a h + sqrt(1 - a^2) gate_x x, with 1 - a^2 = 1 - exp(2 log a) free of cancellation
    xt = tl.load(x + base + j, mask=ok, other=0.0).to(tl.float32)
    hv = tl.load(h + base + j, mask=ok, other=0.0)
    new = tl.exp(log_a) * hv + tl.sqrt(one_minus_exp_neg(-2.0 * log_a)) * gate_x * xt
    tl.store(h_out + base + j, new, mask=ok)
    tl.store(y + base + j, cast_to(new, y.dtype.element_ty), mask=ok)


def samu_step(x_t, nu, theta_log, directions, amplitudes, h, radial_bound, h_out):
    """y_t [B, D] in x_t's dtype; writes the new fp32 state into h_out (which may be h)."""
    B, D = x_t.shape
    y = torch.empty_like(x_t)
    _samu_step[(B,)](x_t, nu, theta_log, directions, amplitudes, h, y, h_out, D // 2, float(radial_bound),
                     BN=next_power_of_2(D // 2), num_warps=4)
    return y


def rglru_step(x_t, w_a, b_a, w_x, b_x, a_param, h, c, h_out):
    """y_t [B, D] in x_t's dtype; writes the new fp32 state into h_out (which may be h)."""
    B, D = x_t.shape
    H = w_a.shape[0]
    y = torch.empty_like(x_t)
    _rglru_step[(B, H)](x_t, w_a, b_a, w_x, b_x, a_param, h, y, h_out, D, D // H, float(c),
                        BH=max(16, next_power_of_2(D // H)), ROWS=GATE_ROWS, MATH=math_mode(False), num_warps=4)
    return y
