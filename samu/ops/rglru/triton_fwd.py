"""RG-LRU forward in Triton: block-diagonal gates fused with a chunked linear scan (SPEC §4, §6).

Read bottom-up: ``rglru_fwd`` (host) launches ``_rglru_fwd_kernel`` once per pass; the kernel is
built from the jit helpers above it (exact gate products, gates, affine scan combines). The math,
the precision argument and the scratch formula are in README.md beside this file.

Layout: x, y [B, L, D]; channel d = h * n + j for head h and in-head index j (n = D / H);
gate weights [H, n, n] with x_{t,h} @ w[h]. A program owns one (batch row, head, group of chunks)
and walks its chunks in order, carrying the state in registers.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from samu.ops.triton_utils import expm1 as _expm1_interp

try:
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - older Triton
    libdevice = None

_POISON = os.environ.get("SAMU_POISON_OUTPUTS", "0") == "1"


def poison_outputs(enabled: bool) -> bool:
    """Fill every buffer a kernel is meant to write with NaN first (tests); returns the old flag."""
    global _POISON
    previous, _POISON = _POISON, bool(enabled)
    return previous


def new_buffer(shape, dtype, device) -> torch.Tensor:
    """An output or scratch buffer: uninitialised, or NaN-filled while poisoning is on."""
    t = torch.empty(shape, dtype=dtype, device=device)
    if _POISON:
        t.fill_(float("nan"))
    return t


def math_mode(fast: bool) -> int:
    """The kernels' MATH constant: 0 in the interpreter, else 1 (precise) or 2 (fast); see below.

    The interpreter has no libdevice (its numpy functions are correctly rounded already) and
    truncates on fp32 -> bf16 casts, so kernels round those by hand there.
    """
    if os.environ.get("TRITON_INTERPRET", "0") == "1" or libdevice is None:
        return 0
    return 2 if fast else 1


def head_block(n: int) -> int:
    """Register tile width of one head: a power of two >= 16 (the tl.dot minimum), padded by masks."""
    return max(16, triton.next_power_of_2(n))


# ----------------------------------------------------------------------------------------------
# jit helpers: elementary functions
#
# MATH selects their implementation: 0 the interpreter (numpy, correctly rounded), 1 precise
# (libdevice, correctly rounded division and square root), 2 fast (hardware approximations of a
# few ulp: ex2, rcp, sqrt, rsqrt). Every formulation avoids cancellation, so the modes differ by
# ulps, not by digits; each mode is its own variant and passes the gates on its own.

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _exp(x, MATH: tl.constexpr):
    if MATH == 1:
        return libdevice.exp(x)
    elif MATH == 2:
        return tl.exp2(x * LOG2E)
    else:
        return tl.exp(x)


@triton.jit
def _recip(x, MATH: tl.constexpr):
    if MATH == 1:
        return tl.div_rn(1.0, x)
    else:
        return 1.0 / x


@triton.jit
def _sqrt(x, MATH: tl.constexpr):
    if MATH == 1:
        return tl.sqrt_rn(x)
    else:
        return tl.sqrt(x)


@triton.jit
def _rsqrt(x, MATH: tl.constexpr):
    if MATH == 1:
        return tl.div_rn(1.0, tl.sqrt_rn(x))
    elif MATH == 2:
        return tl.rsqrt(x)
    else:
        return 1.0 / tl.sqrt(x)


@triton.jit
def _expm1_neg(x, MATH: tl.constexpr):
    """exp(x) - 1 for x <= 0 without cancellation near 0."""
    if MATH == 1:
        return libdevice.expm1(x)
    elif MATH == 2:
        # Taylor to degree 9 on [-0.5, 0] (truncation < 2^-28 relative), exp - 1 below
        p = 1.0 / 362880.0
        p = p * x + 1.0 / 40320.0
        p = p * x + 1.0 / 5040.0
        p = p * x + 1.0 / 720.0
        p = p * x + 1.0 / 120.0
        p = p * x + 1.0 / 24.0
        p = p * x + 1.0 / 6.0
        p = p * x + 0.5
        p = (p * x + 1.0) * x
        return tl.where(x > -0.5, p, tl.exp2(x * LOG2E) - 1.0)
    else:
        return _expm1_interp(x)


@triton.jit
def _log1p(x, MATH: tl.constexpr):
    """log(1 + x) for x >= 0 (per channel only); Goldberg's u = 1 + x trick in the interpreter."""
    if MATH == 0:
        u = 1.0 + x
        safe = tl.where(u == 1.0, 2.0, u)
        return tl.where(u == 1.0, x, tl.log(safe) * x / (safe - 1.0))
    else:
        return libdevice.log1p(x)


@triton.jit
def _to_store(v, dtype: tl.constexpr, MATH: tl.constexpr):
    """fp32 -> the output dtype, rounding to nearest even (the interpreter truncates to bf16)."""
    if MATH != 0 or dtype != tl.bfloat16:
        return v.to(dtype)
    else:
        bits = v.to(tl.int32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        return (bits >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _sigmoid(z, MATH: tl.constexpr):
    # exp(-z) overflows to inf for z < -88 and the reciprocal is then exactly 0
    return _recip(1.0 + _exp(-z, MATH), MATH)


@triton.jit
def _sigmoid_pair(z, MATH: tl.constexpr):
    """sigma(z) and 1 - sigma(z), each without cancellation."""
    e = _exp(-tl.abs(z), MATH)
    r = _recip(1.0 + e, MATH)
    pos = z >= 0
    return tl.where(pos, r, e * r), tl.where(pos, e * r, r)


@triton.jit
def _softplus(p, MATH: tl.constexpr):
    """Per channel: correctly rounded functions in every GPU mode."""
    if MATH == 0:
        e = tl.exp(-tl.abs(p))
    else:
        e = libdevice.exp(-tl.abs(p))
    return tl.maximum(p, 0.0) + _log1p(e, MATH)


@triton.jit
def _sigmoid_channel(p, MATH: tl.constexpr):
    """Per channel: correctly rounded functions in every GPU mode."""
    if MATH == 0:
        return 1.0 / (1.0 + tl.exp(-p))
    else:
        return tl.div_rn(1.0, 1.0 + libdevice.exp(-p))


@triton.jit
def _decay(b_loga, MATH: tl.constexpr):
    """a = exp(log a) and u = 1 - a^2 = -(e (2 + e)) with e = expm1(log a): no cancellation as a -> 1."""
    e = _expm1_neg(b_loga, MATH)
    return 1.0 + e, -(e * (2.0 + e))


# ----------------------------------------------------------------------------------------------
# jit helpers: fp32-accurate products on fp16 tensor cores
#
# A value v is scaled by a power of two s so that max|v * s| lies in [2^14, 2^15) along the
# reduction-free axis, then split into fp16 hi = fp16(v s) and lo = fp16(v s - hi): 22 significant
# bits. bf16 and fp16 inputs are exact in one fp16 part after scaling. Products of fp16 parts are
# exact in fp32 and accumulate in fp32; scaling back by 1/s is exact. See README.md, "Precision".


@triton.jit
def _pow2_scale(m):
    """Powers of two (s, 1/s) with m * s in [2^14, 2^15) for m >= 0, clamped to normal range."""
    e = (m.to(tl.int32, bitcast=True) >> 23) & 0xFF
    es = tl.minimum(tl.maximum(268 - e, 1), 253)
    s = (es << 23).to(tl.float32, bitcast=True)
    inv = ((254 - es) << 23).to(tl.float32, bitcast=True)
    return s, inv


@triton.jit
def _split_rows(b_v, PARTS: tl.constexpr):
    """[M, N] fp32 -> fp16 (hi, lo) with per-row scale, and the per-row inverse scale [M]."""
    s, inv = _pow2_scale(tl.max(tl.abs(b_v), axis=1))
    b_s = b_v * s[:, None]
    b_hi = b_s.to(tl.float16)
    if PARTS == 2:
        b_lo = (b_s - b_hi.to(tl.float32)).to(tl.float16)
    else:
        b_lo = b_hi
    return b_hi, b_lo, inv


@triton.jit
def _split_cols(b_v, PARTS: tl.constexpr):
    """[M, N] fp32 -> fp16 (hi, lo) with per-column scale, and the per-column inverse scale [N]."""
    s, inv = _pow2_scale(tl.max(tl.abs(b_v), axis=0))
    b_s = b_v * s[None, :]
    b_hi = b_s.to(tl.float16)
    if PARTS == 2:
        b_lo = (b_s - b_hi.to(tl.float32)).to(tl.float16)
    else:
        b_lo = b_hi
    return b_hi, b_lo, inv


@triton.jit
def _gate_dot(b_xh, b_xl, b_xinv, b_whi, b_wlo, b_winv, X_PARTS: tl.constexpr):
    """x @ w for x split along rows ([M, R] parts, inverse scales [M]) and w split with inverse
    scale b_winv (a scalar or a [1, N] row): [M, N] fp32."""
    b_z = tl.dot(b_xh, b_wlo)
    if X_PARTS == 2:
        b_z = tl.dot(b_xl, b_whi, b_z)
    b_z = tl.dot(b_xh, b_whi, b_z)
    return b_z * b_xinv[:, None] * b_winv


# ----------------------------------------------------------------------------------------------
# jit helpers: scan combines


@triton.jit
def _affine(a1, b1, a2, b2):
    """(a1, b1) then (a2, b2) for h -> a h + b."""
    return a1 * a2, a2 * b1 + b2


@triton.jit
def _last_row(b_v, K: tl.constexpr):
    """Row K - 1 of [K, N]: [N]."""
    o_k = tl.arange(0, K)
    return tl.sum(tl.where(o_k[:, None] == K - 1, b_v, 0.0), axis=0)


@triton.jit
def _fold_prefix(b_h, sums, o_rows, m_rows, o_d, m_j, n_rows_stride, SB, NGP: tl.constexpr):
    """Compose the summaries (A, B) at rows o_rows (in order) after state b_h; identity where masked.

    Returns the state after the last unmasked row, [BN].
    """
    m = m_rows[:, None] & m_j[None, :]
    p_s = sums + o_rows[:, None].to(tl.int64) * n_rows_stride + o_d[None, :]
    b_A = tl.load(p_s, mask=m, other=1.0)
    b_B = tl.load(p_s + SB, mask=m, other=0.0)
    o_g = tl.arange(0, NGP)
    b_B = tl.where(o_g[:, None] == 0, b_B + b_A * b_h[None, :], b_B)
    _, b_Hs = tl.associative_scan((b_A, b_B), 0, _affine)
    return _last_row(b_Hs, NGP)


# ----------------------------------------------------------------------------------------------
# kernels


@triton.jit
def _rglru_split_weights_kernel(
    w_a, w_x,            # [H, n, n] fp32
    w16,                 # [2, 2, H, BN, BN] fp16: (gate, hi/lo) parts of w * s, zero-padded
    w_inv,               # [2, H] fp32: 1 / s, one power of two per (gate, head)
    n, H,
    BN: tl.constexpr,
):
    """One scale per head keeps w^T's parts the transposes of w's (the backward reuses the tiles)."""
    i_h, i_gate = tl.program_id(0), tl.program_id(1)
    o_i = tl.arange(0, BN)
    m = (o_i < n)[:, None] & (o_i < n)[None, :]
    o_src = i_h.to(tl.int64) * n * n + o_i[:, None] * n + o_i[None, :]
    if i_gate == 0:
        b_w = tl.load(w_a + o_src, mask=m, other=0.0)      # [BN(i), BN(j)]
    else:
        b_w = tl.load(w_x + o_src, mask=m, other=0.0)
    s, inv = _pow2_scale(tl.max(tl.max(tl.abs(b_w), axis=1), axis=0))
    b_s = b_w * s
    b_hi = b_s.to(tl.float16)
    b_lo = (b_s - b_hi.to(tl.float32)).to(tl.float16)
    HBB = H * BN * BN
    o_dst = (2 * i_gate * H + i_h).to(tl.int64) * BN * BN + o_i[:, None] * BN + o_i[None, :]
    tl.store(w16 + o_dst, b_hi)
    tl.store(w16 + HBB + o_dst, b_lo)
    tl.store(w_inv + i_gate * H + i_h, inv)


@triton.jit
def _gates_fwd(b_x, b_wah, b_wal, b_wainv, b_wxh, b_wxl, b_wxinv, b_ba, b_bx, b_csp,
               X_PARTS: tl.constexpr, MATH: tl.constexpr):
    """Transition a_t and scan input multiplier_t * gate_x_t * x_t for x [K, BN] fp32."""
    b_xh, b_xl, b_xinv = _split_rows(b_x, X_PARTS)
    b_ga = _sigmoid(_gate_dot(b_xh, b_xl, b_xinv, b_wah, b_wal, b_wainv, X_PARTS) + b_ba[None, :], MATH)
    b_gx = _sigmoid(_gate_dot(b_xh, b_xl, b_xinv, b_wxh, b_wxl, b_wxinv, X_PARTS) + b_bx[None, :], MATH)
    b_a, b_u = _decay(b_csp[None, :] * b_ga, MATH)
    return b_a, _sqrt(b_u, MATH) * b_gx * b_x


@triton.jit(do_not_specialize=["L", "NC", "G", "NG"])
def _rglru_fwd_kernel(
    x,                   # [B, L, D] bf16 / fp16 / fp32
    w16, w_inv,          # split gate weights (see _rglru_split_weights_kernel)
    b_a, b_x, a_param,   # [D] fp32
    h0,                  # [B, D] fp32 (read when HAS_H0)
    sums,                # [2, B, NG, D] fp32 group summaries (A = prod a, B = end state from 0)
    y,                   # [B, L, D] x.dtype
    states,              # [B, ceil(L/S), D] fp32: state entering every S tokens (when SAVE_STATES)
    h_last,              # [B, D] fp32 final state
    L, D, n, H, NC, G, NG, c,
    K: tl.constexpr, BN: tl.constexpr, NGP: tl.constexpr, X_PARTS: tl.constexpr, S: tl.constexpr,
    HAS_H0: tl.constexpr, SUMMARY: tl.constexpr, SAVE_STATES: tl.constexpr, MATH: tl.constexpr,
):
    """One (group of G chunks, head, batch row). SUMMARY: write the group's affine summary.

    Otherwise: enter with the state composed from h0 and the summaries of earlier groups, write y,
    the chunk-entering states and (last group) the final state.
    """
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

    b_h = tl.zeros([BN], dtype=tl.float32)
    b_p = tl.full([BN], 1.0, dtype=tl.float32)
    if not SUMMARY:
        if HAS_H0:
            b_h = tl.load(h0 + i_b64 * D + o_d, mask=m_j, other=0.0)
        if NGP > 1:
            o_g = tl.arange(0, NGP)
            SB = tl.num_programs(2).to(tl.int64) * NG * D
            b_h = _fold_prefix(b_h, sums + i_b64 * NG * D, o_g, o_g < i_g, o_d, m_j, D, SB, NGP)

    c_lo = i_g * G
    c_hi = tl.minimum(c_lo + G, NC)
    # 64-bit bases, 32-bit offsets inside a [K, BN] tile
    o_tile = o_k[:, None] * D + o_j[None, :]
    o_base = (i_b64 * L + c_lo.to(tl.int64) * K) * D + i_h * n
    p_x = x + o_base
    p_y = y + o_base
    NS = tl.cdiv(L, S)
    for i_c in range(c_lo, c_hi):
        m_t = i_c * K + o_k < L
        m_x = m_t[:, None] & m_j[None, :]
        b_xt = tl.load(p_x + o_tile, mask=m_x, other=0.0).to(tl.float32)       # [K, BN]
        if SAVE_STATES:
            if (i_c * K) % S == 0:
                tl.store(states + (i_b64 * NS + (i_c * K) // S) * D + o_d, b_h, mask=m_j)
        b_at, b_bt = _gates_fwd(b_xt, b_wah, b_wal, b_wainv, b_wxh, b_wxl, b_wxinv,
                                b_ba, b_bx, b_csp, X_PARTS, MATH)
        # tokens past L are identities: the state passes through to the chunk end unchanged
        b_at = tl.where(m_t[:, None], b_at, 1.0)
        b_bt = tl.where(m_t[:, None], b_bt, 0.0)
        b_bt = tl.where(o_k[:, None] == 0, b_bt + b_at * b_h[None, :], b_bt)
        b_A, b_H = tl.associative_scan((b_at, b_bt), 0, _affine)            # [K, BN]
        if SUMMARY:
            b_p = b_p * _last_row(b_A, K)
        else:
            tl.store(p_y + o_tile, _to_store(b_H, y.dtype.element_ty, MATH), mask=m_x)
            if SAVE_STATES:
                if S < K:
                    # the state entering each later S-token piece of the chunk is a row of b_H
                    o_next = i_c * K + o_k + 1
                    m_s = (o_next % S == 0) & (o_k < K - 1) & (o_next < L)
                    p_s = states + (i_b64 * NS + o_next // S)[:, None] * D + o_d[None, :]
                    tl.store(p_s, b_H, mask=m_s[:, None] & m_j[None, :])
        b_h = _last_row(b_H, K)
        p_x += K * D
        p_y += K * D
    if SUMMARY:
        p_s = sums + (i_b64 * NG + i_g) * D + o_d
        tl.store(p_s, b_p, mask=m_j)
        tl.store(p_s + tl.num_programs(2).to(tl.int64) * NG * D, b_h, mask=m_j)
    else:
        if i_g == NG - 1:
            tl.store(h_last + i_b64 * D + o_d, b_h, mask=m_j)


# ----------------------------------------------------------------------------------------------
# host


def split_weights(w_a: torch.Tensor, w_x: torch.Tensor):
    """fp16 hi/lo parts of both gate weights, one power-of-two scale per (gate, head); one launch.

    Returns w16 [2, 2, H, BN, BN] fp16 (gate, part) and w_inv [2, H] fp32 (the inverse scales).
    """
    H, n, _ = w_a.shape
    BN = head_block(n)
    w16 = new_buffer((2, 2, H, BN, BN), torch.float16, w_a.device)
    w_inv = new_buffer((2, H), torch.float32, w_a.device)
    _rglru_split_weights_kernel[(H, 2)](w_a.contiguous(), w_x.contiguous(), w16, w_inv, n, H, BN=BN, num_warps=4)
    return w16, w_inv


MAX_GROUPS = 64


def rglru_fwd(x, w_a, b_a, w_x, b_x, a_param, h0, c: float, *, K: int, G: int, save_states: bool,
              state_every: int = 0, fast: bool = False, num_warps: int = 4, num_stages: int = 1):
    """Chunked RG-LRU forward.

    x: [B, L, D] bf16/fp16/fp32 contiguous; w_a, w_x: [H, n, n] fp32; b_a, b_x, a_param: [D] fp32;
    h0: [B, D] fp32 or None. K: chunk length (power of two >= 16); G: chunks per group (one
    program walks a group; G >= ceil(L / K) is the single-sweep serial variant; at most
    MAX_GROUPS groups). fast: hardware approximations of exp, reciprocal and sqrt (MATH = 2).
    state_every: S, the spacing of the saved states (a power of two; 0 means K), the backward's
    chunk length. Returns y [B, L, D] x.dtype, h_last [B, D] fp32, states [B, ceil(L/S), D] fp32
    (the state entering every S tokens; an empty tensor unless ``save_states``).
    """
    B, L, D = x.shape
    H, n = w_a.shape[0], w_a.shape[1]
    BN = head_block(n)
    NC = triton.cdiv(L, K)
    NG = triton.cdiv(NC, G)
    assert NG <= MAX_GROUPS, f"{NG} groups of {G} chunks; at most {MAX_GROUPS}"
    # one compiled prefix width for every grouped launch
    NGP = MAX_GROUPS if NG > 1 else 1
    dev = x.device
    w16, w_inv = split_weights(w_a, w_x)
    y = new_buffer((B, L, D), x.dtype, dev)
    h_last = new_buffer((B, D), torch.float32, dev)
    S = state_every or K
    states = new_buffer((B, triton.cdiv(L, S), D), torch.float32, dev) if save_states else torch.empty(0, device=dev)
    sums = new_buffer((2, B, NG, D), torch.float32, dev) if NG > 1 else h_last
    has_h0 = h0 is not None
    args = (x, w16, w_inv, b_a, b_x, a_param, h0.contiguous() if has_h0 else h_last, sums, y,
            states if save_states else h_last, h_last, L, D, n, H, NC, G, NG, float(c))
    meta = dict(K=K, BN=BN, NGP=NGP, X_PARTS=2 if x.dtype == torch.float32 else 1, S=S, HAS_H0=has_h0,
                MATH=math_mode(fast), num_warps=num_warps, num_stages=num_stages)
    grid = (NG, H, B)
    if NG > 1:
        _rglru_fwd_kernel[grid](*args, SUMMARY=True, SAVE_STATES=False, **meta)
    _rglru_fwd_kernel[grid](*args, SUMMARY=False, SAVE_STATES=save_states, **meta)
    return y, h_last, states
