"""Triton kernels of one decoding step of each mixer (samu.ops.step): one launch per token for SAMU, two for
RG-LRU (its gate products split over input blocks, then the update).

Both evaluate the serial reference's definitions (samu.reference) for a single token in fp32, read the
mixer state [B, D] fp32 and write the new state and y_t (the mixer's own step into a fresh buffer, the
block's over the old state).

With K > 0 a kernel is the RecurrentBlock's whole step between its two projections: it reads the
in-projection row z = [z_x | z_y] [B, 2D], runs the block's causal Conv1D of width K <= 4 on z_x (its
state [B, K-1, D] shifted in place), the mixer, and writes y_t = mixer_t * GeLU(z_y), rounding where the
block's forward rounds (the Conv1D output, the mixer output and the GeLU in the storage dtype), so a
decode follows the forward of samu.ops.glue and the mixers. A program owns its batch rows' channels
(SAMU: one row, all channels; RG-LRU's gate products: 16 rows, 32 channels of one head), so no two programs
touch the same state.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import cuda as tlc

from samu.ops.rglru.triton_fwd import _sigmoid_channel, _softplus, math_mode
from samu.ops.triton_utils import (_PDL_WAIT, NO_WAIT, PDL_WAIT, cast_to, cdiv, gelu_gate, launch, next_power_of_2,
                                   one_minus_exp_neg, pdl, tanh)

# input rows of the RG-LRU gate matrices one program of the matvec reads; warps of a program (a decoding step
# at batch 1 is latency-bound: SAMU takes at most one warp per 32 modes, so no thread holds a copy)
GATE_ROWS = 32
SAMU_WARPS = 8
RGLRU_WARPS = 8
# batch rows of one RG-LRU program (the gate matvecs as [rows, GATE_ROWS] @ [GATE_ROWS, head] products), and
# the channels of one program of its update
STEP_ROWS = 16
UPDATE_CHANNELS = 128
UPDATE_WARPS = 4


@triton.jit
def _conv_in(x, cw, cb, state, b, ch, ok, D, K: tl.constexpr):
    """Channels ch of the mixer input for batch row(s) b (x offset to those rows), fp32: x[ch] itself
    (K = 0), or the block's Conv1D of width K <= 4 over its state and x, rounded to x's dtype like the
    forward's, and then the new Conv1D state (the last K - 1 inputs) written over the old, after a
    barrier: every thread of the program has read the old state before any writes. b and ch broadcast:
    a row and [C] channels, or [BB, 1] rows and [1, C] channels."""
    v = tl.load(x + ch, mask=ok, other=0.0)
    if K == 0:
        return v.to(tl.float32)
    else:
        acc = tl.load(cb + ch, mask=ok, other=0.0).to(tl.float32)
        row = state + b * (K - 1) * D + ch
        if K > 1:
            s0 = tl.load(row, mask=ok, other=0.0)
            acc += s0.to(tl.float32) * tl.load(cw + ch, mask=ok, other=0.0).to(tl.float32)
        if K > 2:
            s1 = tl.load(row + D, mask=ok, other=0.0)
            acc += s1.to(tl.float32) * tl.load(cw + D + ch, mask=ok, other=0.0).to(tl.float32)
        if K > 3:
            s2 = tl.load(row + 2 * D, mask=ok, other=0.0)
            acc += s2.to(tl.float32) * tl.load(cw + 2 * D + ch, mask=ok, other=0.0).to(tl.float32)
        acc += v.to(tl.float32) * tl.load(cw + (K - 1) * D + ch, mask=ok, other=0.0).to(tl.float32)
        if K > 1:
            # shifted by one input: [s1, s2, v] (K = 4), [s1, v] (K = 3), [v] (K = 2)
            tl.debug_barrier()
            if K > 2:
                tl.store(row, s1, mask=ok)
            if K > 3:
                tl.store(row + D, s2, mask=ok)
            tl.store(row + (K - 2) * D, v.to(row.dtype.element_ty), mask=ok)
        return cast_to(acc, x.dtype.element_ty).to(tl.float32)


@triton.jit
def _store_out(y, new, x, ch, ok, D, K: tl.constexpr):
    """y[ch] = new in y's dtype, times GeLU(z_y[ch]) after the block's roundings when K > 0."""
    out = cast_to(new, y.dtype.element_ty)
    if K > 0:
        gate = tl.load(x + D + ch, mask=ok, other=0.0).to(tl.float32)
        out = cast_to(gelu_gate(gate, out.to(tl.float32), y.dtype.element_ty), y.dtype.element_ty)
    tl.store(y + ch, out, mask=ok)


@triton.jit
def _samu_step(x, nu, theta_log, directions, amplitudes, h, y, h_out, cw, cb, state, N, sx, radial_bound,
               BN: tl.constexpr, K: tl.constexpr, WAIT: tl.constexpr):
    """SAMU's step for this program's batch row over its N modes (BN >= N of them), the Conv1D state shifted. x is
    waited for after the parameters' loads as rowprod_triton._row_product waits (WAIT: triton_utils.NO_WAIT or
    PDL_WAIT)."""
    b = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, BN)   # [BN] modes
    ok = k < N
    D = 2 * N
    # the parameters first: under PDL (samu_step's ``early``) no kernel just before writes them, so their loads
    # overlap its tail
    u0_re = tl.load(directions + k, mask=ok, other=0.0)
    u0_im = tl.load(directions + N + k, mask=ok, other=0.0)
    u1_re = tl.load(directions + D + k, mask=ok, other=0.0)
    u1_im = tl.load(directions + D + N + k, mask=ok, other=0.0)
    nu_k = tl.load(nu + k, mask=ok, other=0.0)
    theta_k = tl.load(theta_log + k, mask=ok, other=0.0)
    if WAIT == _PDL_WAIT:
        tlc.gdc_wait()               # the kernel before this one has finished and its writes are seen
        tlc.gdc_launch_dependents()
    xb = x + b * sx
    x_re = _conv_in(xb, cw, cb, state, b, k, ok, D, K)
    x_im = _conv_in(xb, cw, cb, state, b, N + k, ok, D, K)
    # p = x . (u / |u|) for the two directions; c = A p; m = exp(kappa tanh(c0 / kappa)); phi = c1
    p0 = tl.sum(x_re * u0_re + x_im * u0_im, axis=0) / tl.sqrt(tl.sum(u0_re * u0_re + u0_im * u0_im, axis=0))
    p1 = tl.sum(x_re * u1_re + x_im * u1_im, axis=0) / tl.sqrt(tl.sum(u1_re * u1_re + u1_im * u1_im, axis=0))
    c0 = tl.load(amplitudes) * p0 + tl.load(amplitudes + 1) * p1
    phi = tl.load(amplitudes + 2) * p0 + tl.load(amplitudes + 3) * p1
    m = tl.exp(radial_bound * tanh(c0 / radial_bound))
    # lambda = exp(-w) e^{i (exp(theta_log) + phi)}, gamma = sqrt(1 - exp(-2 w)), w = m e^nu
    w = m * tl.exp(nu_k)
    rho = tl.exp(-w)
    psi = tl.exp(theta_k) + phi
    lam_re, lam_im = rho * tl.cos(psi), rho * tl.sin(psi)
    gamma = tl.sqrt(one_minus_exp_neg(2.0 * w))
    h_re = tl.load(h + b * D + k, mask=ok, other=0.0)
    h_im = tl.load(h + b * D + N + k, mask=ok, other=0.0)
    new_re = lam_re * h_re - lam_im * h_im + gamma * x_re
    new_im = lam_re * h_im + lam_im * h_re + gamma * x_im
    tl.store(h_out + b * D + k, new_re, mask=ok)
    tl.store(h_out + b * D + N + k, new_im, mask=ok)
    _store_out(y + b * D, new_re, xb, k, ok, D, K)
    _store_out(y + b * D, new_im, xb, N + k, ok, D, K)


@triton.jit
def _rglru_step_gates(x, w_a, w_x, cw, cb, state, xc, part, B, D, HD, sx, BB: tl.constexpr, BH: tl.constexpr,
                      ROWS: tl.constexpr, K: tl.constexpr):
    """Phase 1 of RG-LRU's step: one program per (BB batch rows, head, ROWS input channels of it) computes those
    channels' mixer input (the Conv1D over its state, shifting that state: each (row, channel) belongs to one
    program, so no program reads a state another one writes), stores it in xc (fp32) and stores its share of
    both gates' pre-activations, [BB, ROWS] @ [ROWS, BH], in part[gate, input block]."""
    rb, head, ib = tl.program_id(0), tl.program_id(1).to(tl.int64), tl.program_id(2)
    r = (rb.to(tl.int64) * BB + tl.arange(0, BB))[:, None]   # [BB, 1] batch rows
    r_ok = r < B
    i = ib * ROWS + tl.arange(0, ROWS)   # [ROWS] input channels of the head
    i_ok = i < HD
    j = tl.arange(0, BH)   # [BH] output channels of the head
    j_ok = j < HD
    ok = r_ok & i_ok[None, :]
    ch = head * HD + i[None, :]
    xi = _conv_in(x + r * sx, cw, cb, state, r, ch, ok, D, K)
    tl.store(xc + r * D + ch, xi, mask=ok)
    wm = i_ok[:, None] & j_ok[None, :]
    w_off = head * HD * HD + i[:, None] * HD + j[None, :]
    pa = tl.dot(xi, tl.load(w_a + w_off, mask=wm, other=0.0), input_precision="ieee")
    px = tl.dot(xi, tl.load(w_x + w_off, mask=wm, other=0.0), input_precision="ieee")
    n_ib = tl.num_programs(2).to(tl.int64)
    out = (ib * B + r) * D + (head * HD + j)[None, :]
    m = r_ok & j_ok[None, :]
    tl.store(part + out, pa, mask=m)
    tl.store(part + n_ib * B * D + out, px, mask=m)


@triton.jit
def _rglru_step_update(x, xc, part, b_a, b_x, a_param, h, y, h_out, B, D, NI, sx, c, BB: tl.constexpr,
                       BC: tl.constexpr, MATH: tl.constexpr, K: tl.constexpr):
    """Phase 2 of RG-LRU's step, for BB batch rows and BC channels: each gate's pre-activation is its NI partial
    sums added in input-block order (deterministic), then the gates, the new state and y_t."""
    r = (tl.program_id(0).to(tl.int64) * BB + tl.arange(0, BB))[:, None]
    ch = (tl.program_id(1) * BC + tl.arange(0, BC))[None, :]
    col_ok = ch < D
    ok = (r < B) & col_ok
    acc_a = tl.zeros((BB, BC), tl.float32)
    acc_x = tl.zeros((BB, BC), tl.float32)
    for ib in range(0, NI):
        acc_a += tl.load(part + (ib * B + r) * D + ch, mask=ok, other=0.0)
        acc_x += tl.load(part + ((NI + ib) * B + r) * D + ch, mask=ok, other=0.0)   # r is int64: so is the sum
    # the forward kernels' correctly rounded per-channel functions
    gate_a = _sigmoid_channel(acc_a + tl.load(b_a + ch, mask=col_ok, other=0.0), MATH)
    gate_x = _sigmoid_channel(acc_x + tl.load(b_x + ch, mask=col_ok, other=0.0), MATH)
    log_a = -c * gate_a * _softplus(tl.load(a_param + ch, mask=col_ok, other=0.0), MATH)
    # h = a h + sqrt(1 - a^2) gate_x x, with 1 - a^2 = 1 - exp(2 log a) free of cancellation
    xt = tl.load(xc + r * D + ch, mask=ok, other=0.0)
    hv = tl.load(h + r * D + ch, mask=ok, other=0.0)
    new = tl.exp(log_a) * hv + tl.sqrt(one_minus_exp_neg(-2.0 * log_a)) * gate_x * xt
    tl.store(h_out + r * D + ch, new, mask=ok)
    _store_out(y + r * D, new, x + r * sx, ch, ok, D, K)


def _conv_args(conv):
    """(weight, bias, state, K) of the block's Conv1D (x_t is then z [B, 2D]); no pointers and K = 0 for the
    mixer's own step."""
    if conv is None:
        return None, None, None, 0
    weight, bias, state = conv
    return weight.contiguous(), bias.contiguous(), state, weight.shape[0]


def samu_step(x_t, nu, theta_log, directions, amplitudes, h, radial_bound, h_out, conv=None, early=False):
    """y_t [B, D] in x_t's dtype; writes the new fp32 state into h_out (which may be h). With ``conv`` =
    (weight [K, D], bias [D], contiguous state [B, K-1, D]) x_t is z [B, 2D], y_t is the block's
    mixer_t * GeLU(z_y) and the Conv1D state is updated in place. ``early``: launch with programmatic
    dependent launch where there is one, reading nu, theta_log and directions before the wait for the kernel
    before, which must not write them (the block's decode step, after the in-projection: results/dev/session11,
    call2, with the row products' prefetch, 0.502 -> 0.478 ms a batch-1 token)."""
    B, D = h.shape
    cw, cb, cs, K = _conv_args(conv)
    y = torch.empty_like(h, dtype=x_t.dtype)
    BN = next_power_of_2(D // 2)
    options = pdl(x_t.device) if early else {}
    launch(_samu_step, (B,), x=x_t, nu=nu, theta_log=theta_log, directions=directions, amplitudes=amplitudes, h=h, y=y,
           h_out=h_out, cw=cw, cb=cb, state=cs, N=D // 2, sx=x_t.stride(0), radial_bound=float(radial_bound),
           BN=BN, K=K, WAIT=PDL_WAIT if options else NO_WAIT, num_warps=max(1, min(SAMU_WARPS, BN // 32)), **options)
    return y


def rglru_step(x_t, w_a, b_a, w_x, b_x, a_param, h, c, h_out, conv=None):
    """y_t [B, D] in x_t's dtype; writes the new fp32 state into h_out (which may be h); ``conv`` as for
    samu_step. Two launches: the gate products split over input blocks (phase 1: many programs, where one
    program a head took 13-18 µs a layer at batch 1 and 64, results/dev/session11/call2), then the update."""
    B, D = h.shape
    H = w_a.shape[0]
    HD = D // H
    cw, cb, cs, K = _conv_args(conv)
    y = torch.empty_like(h, dtype=x_t.dtype)
    NI = cdiv(HD, GATE_ROWS)
    xc = h.new_empty(B, D)
    part = h.new_empty(2, NI, B, D)
    launch(_rglru_step_gates, (cdiv(B, STEP_ROWS), H, NI), x=x_t, w_a=w_a, w_x=w_x, cw=cw, cb=cb, state=cs, xc=xc,
           part=part, B=B, D=D, HD=HD, sx=x_t.stride(0), BB=STEP_ROWS, BH=max(16, next_power_of_2(HD)),
           ROWS=GATE_ROWS, K=K, num_warps=RGLRU_WARPS)
    launch(_rglru_step_update, (cdiv(B, STEP_ROWS), cdiv(D, UPDATE_CHANNELS)), x=x_t, xc=xc, part=part, b_a=b_a,
           b_x=b_x, a_param=a_param, h=h, y=y, h_out=h_out, B=B, D=D, NI=NI, sx=x_t.stride(0), c=float(c),
           BB=STEP_ROWS, BC=UPDATE_CHANNELS, MATH=math_mode(False), K=K, num_warps=UPDATE_WARPS)
    return y
