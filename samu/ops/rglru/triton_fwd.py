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


def native() -> bool:
    """Compiled for a GPU: libdevice math and hardware conversions (False in the interpreter).

    The interpreter has no libdevice (its numpy functions are exact already) and truncates on
    fp32 -> bf16 casts, so kernels round those by hand there.
    """
    return os.environ.get("TRITON_INTERPRET", "0") != "1" and libdevice is not None


def head_block(n: int) -> int:
    """Register tile width of one head: a power of two >= 16 (the tl.dot minimum), padded by masks."""
    return max(16, triton.next_power_of_2(n))


# ----------------------------------------------------------------------------------------------
# jit helpers: elementary functions


@triton.jit
def _exp(x, NATIVE: tl.constexpr):
    if NATIVE:
        return libdevice.exp(x)
    else:
        return tl.exp(x)


@triton.jit
def _expm1(x, NATIVE: tl.constexpr):
    if NATIVE:
        return libdevice.expm1(x)
    else:
        return _expm1_interp(x)


@triton.jit
def _sqrt(x, NATIVE: tl.constexpr):
    if NATIVE:
        return tl.sqrt_rn(x)
    else:
        return tl.sqrt(x)


@triton.jit
def _div(a, b, NATIVE: tl.constexpr):
    if NATIVE:
        return tl.div_rn(a, b)
    else:
        return a / b


@triton.jit
def _log1p(x, NATIVE: tl.constexpr):
    """log(1 + x) for x >= 0; Goldberg's u = 1 + x trick where libdevice is unavailable."""
    if NATIVE:
        return libdevice.log1p(x)
    else:
        u = 1.0 + x
        safe = tl.where(u == 1.0, 2.0, u)
        return tl.where(u == 1.0, x, tl.log(safe) * x / (safe - 1.0))


@triton.jit
def _to_store(v, dtype: tl.constexpr, NATIVE: tl.constexpr):
    """fp32 -> the output dtype, rounding to nearest even."""
    if NATIVE or dtype != tl.bfloat16:
        return v.to(dtype)
    else:
        bits = v.to(tl.int32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        return (bits >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _sigmoid(z, NATIVE: tl.constexpr):
    # exp(-z) overflows to inf for z < -88 and the quotient is then exactly 0
    return _div(1.0, 1.0 + _exp(-z, NATIVE), NATIVE)


@triton.jit
def _sigmoid_pair(z, NATIVE: tl.constexpr):
    """sigma(z) and 1 - sigma(z), each without cancellation."""
    e = _exp(-tl.abs(z), NATIVE)
    r = _div(1.0, 1.0 + e, NATIVE)
    pos = z >= 0
    return tl.where(pos, r, e * r), tl.where(pos, e * r, r)


@triton.jit
def _softplus(p, NATIVE: tl.constexpr):
    return tl.maximum(p, 0.0) + _log1p(_exp(-tl.abs(p), NATIVE), NATIVE)


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
    """x @ w for a row-split x [K, BN] and a column-split w [BN, BN]: [K, BN] fp32."""
    b_z = tl.dot(b_xh, b_wlo)
    if X_PARTS == 2:
        b_z = tl.dot(b_xl, b_whi, b_z)
    b_z = tl.dot(b_xh, b_whi, b_z)
    return b_z * b_xinv[:, None] * b_winv[None, :]


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
    w16, w_inv,          # [2, 2, H, BN, BN] fp16 (gate, hi/lo); [2, H, BN] fp32: column-scaled w
    wt16, wt_inv,        # same for w^T (rows of w scaled), used by the backward's dx
    n, H,
    BN: tl.constexpr, TRANSPOSED: tl.constexpr,
):
    i_h, i_gate = tl.program_id(0), tl.program_id(1)
    o_i = tl.arange(0, BN)
    m = (o_i < n)[:, None] & (o_i < n)[None, :]
    o_src = i_h.to(tl.int64) * n * n + o_i[:, None] * n + o_i[None, :]
    if i_gate == 0:
        b_w = tl.load(w_a + o_src, mask=m, other=0.0)      # [BN(i), BN(j)]
    else:
        b_w = tl.load(w_x + o_src, mask=m, other=0.0)
    HBB = H * BN * BN
    o_dst = i_h.to(tl.int64) * BN * BN + o_i[:, None] * BN + o_i[None, :]
    o_hi = (2 * i_gate) * HBB
    b_hi, b_lo, b_inv = _split_cols(b_w, 2)
    tl.store(w16 + o_hi + o_dst, b_hi)
    tl.store(w16 + o_hi + HBB + o_dst, b_lo)
    tl.store(w_inv + (i_gate * H + i_h) * BN + o_i, b_inv)
    if TRANSPOSED:
        # w^T[j, i] = w[i, j], split along its columns i: scale each row of w
        b_hi, b_lo, b_inv = _split_rows(b_w, 2)
        o_t = i_h.to(tl.int64) * BN * BN + o_i[:, None] + o_i[None, :] * BN
        tl.store(wt16 + o_hi + o_t, b_hi)
        tl.store(wt16 + o_hi + HBB + o_t, b_lo)
        tl.store(wt_inv + (i_gate * H + i_h) * BN + o_i, b_inv)


@triton.jit
def _gates_fwd(b_x, b_wah, b_wal, b_wainv, b_wxh, b_wxl, b_wxinv, b_ba, b_bx, b_csp,
               X_PARTS: tl.constexpr, NATIVE: tl.constexpr):
    """Transition a_t and scan input multiplier_t * gate_x_t * x_t for x [K, BN] fp32."""
    b_xh, b_xl, b_xinv = _split_rows(b_x, X_PARTS)
    b_za = _gate_dot(b_xh, b_xl, b_xinv, b_wah, b_wal, b_wainv, X_PARTS) + b_ba[None, :]
    b_zx = _gate_dot(b_xh, b_xl, b_xinv, b_wxh, b_wxl, b_wxinv, X_PARTS) + b_bx[None, :]
    b_ga = _sigmoid(b_za, NATIVE)
    b_gx = _sigmoid(b_zx, NATIVE)
    b_loga = b_csp[None, :] * b_ga
    b_a = _exp(b_loga, NATIVE)
    b_mult = _sqrt(-_expm1(2.0 * b_loga, NATIVE), NATIVE)
    return b_a, b_mult * b_gx * b_x


@triton.jit
def _rglru_fwd_kernel(
    x,                   # [B, L, D] bf16 / fp16 / fp32
    w16, w_inv,          # split gate weights (see _rglru_split_weights_kernel)
    b_a, b_x, a_param,   # [D] fp32
    h0,                  # [B, D] fp32 (read when HAS_H0)
    sums,                # [2, B, NG, D] fp32 group summaries (A = prod a, B = end state from 0)
    y,                   # [B, L, D] x.dtype
    states,              # [B, NC, D] fp32: state entering each chunk (written when SAVE_STATES)
    h_last,              # [B, D] fp32 final state
    L, D, n, H, NC, G, NG, c,
    K: tl.constexpr, BN: tl.constexpr, NGP: tl.constexpr, X_PARTS: tl.constexpr,
    HAS_H0: tl.constexpr, SUMMARY: tl.constexpr, SAVE_STATES: tl.constexpr, NATIVE: tl.constexpr,
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
    b_csp = -c * _softplus(tl.load(a_param + o_d, mask=m_j, other=0.0), NATIVE)

    HBB = H * BN * BN
    o_w = i_h.to(tl.int64) * BN * BN + o_j[:, None] * BN + o_j[None, :]
    b_wah = tl.load(w16 + o_w)
    b_wal = tl.load(w16 + HBB + o_w)
    b_wxh = tl.load(w16 + 2 * HBB + o_w)
    b_wxl = tl.load(w16 + 3 * HBB + o_w)
    b_wainv = tl.load(w_inv + i_h * BN + o_j)
    b_wxinv = tl.load(w_inv + (H + i_h) * BN + o_j)

    b_h = tl.zeros([BN], dtype=tl.float32)
    b_p = tl.full([BN], 1.0, dtype=tl.float32)
    if not SUMMARY:
        if HAS_H0:
            b_h = tl.load(h0 + i_b64 * D + o_d, mask=m_j, other=0.0)
        if NGP > 1:
            o_g = tl.arange(0, NGP)
            SB = tl.num_programs(2).to(tl.int64) * NG * D
            b_h = _fold_prefix(b_h, sums + i_b64 * NG * D, o_g, o_g < i_g, o_d, m_j, D, SB, NGP)
    for i_c in range(i_g * G, tl.minimum(i_g * G + G, NC)):
        o_t = i_c * K + o_k
        m_t = o_t < L
        m_x = m_t[:, None] & m_j[None, :]
        p_x = x + (i_b64 * L + o_t[:, None]) * D + o_d[None, :]
        b_xt = tl.load(p_x, mask=m_x, other=0.0).to(tl.float32)               # [K, BN]
        if SAVE_STATES:
            tl.store(states + (i_b64 * NC + i_c) * D + o_d, b_h, mask=m_j)
        b_at, b_bt = _gates_fwd(b_xt, b_wah, b_wal, b_wainv, b_wxh, b_wxl, b_wxinv,
                                b_ba, b_bx, b_csp, X_PARTS, NATIVE)
        # tokens past L are identities: the state passes through to the chunk end unchanged
        b_at = tl.where(m_t[:, None], b_at, 1.0)
        b_bt = tl.where(m_t[:, None], b_bt, 0.0)
        b_bt = tl.where(o_k[:, None] == 0, b_bt + b_at * b_h[None, :], b_bt)
        b_A, b_H = tl.associative_scan((b_at, b_bt), 0, _affine)            # [K, BN]
        if SUMMARY:
            b_p = b_p * _last_row(b_A, K)
        else:
            tl.store(y + (i_b64 * L + o_t[:, None]) * D + o_d[None, :], _to_store(b_H, y.dtype.element_ty, NATIVE), mask=m_x)
        b_h = _last_row(b_H, K)
    if SUMMARY:
        p_s = sums + (i_b64 * NG + i_g) * D + o_d
        tl.store(p_s, b_p, mask=m_j)
        tl.store(p_s + tl.num_programs(2).to(tl.int64) * NG * D, b_h, mask=m_j)
    else:
        if i_g == NG - 1:
            tl.store(h_last + i_b64 * D + o_d, b_h, mask=m_j)


# ----------------------------------------------------------------------------------------------
# host


def split_weights(w_a: torch.Tensor, w_x: torch.Tensor, transposed: bool = False):
    """fp16 hi/lo parts of both gate weights with per-column power-of-two scales (one launch).

    Returns (w16 [2, 2, H, BN, BN], w_inv [2, H, BN]) and, when ``transposed``, the same for w^T
    (used by the backward's input gradient); otherwise those two are None.
    """
    H, n, _ = w_a.shape
    BN = head_block(n)
    dev = w_a.device
    w16 = new_buffer((2, 2, H, BN, BN), torch.float16, dev)
    w_inv = new_buffer((2, H, BN), torch.float32, dev)
    wt16, wt_inv = ((new_buffer((2, 2, H, BN, BN), torch.float16, dev), new_buffer((2, H, BN), torch.float32, dev))
                    if transposed else (w16, w_inv))
    _rglru_split_weights_kernel[(H, 2)](w_a.contiguous(), w_x.contiguous(), w16, w_inv, wt16, wt_inv, n, H,
                                        BN=BN, TRANSPOSED=transposed, num_warps=4)
    return (w16, w_inv, wt16, wt_inv) if transposed else (w16, w_inv, None, None)


def rglru_fwd(x, w_a, b_a, w_x, b_x, a_param, h0, c: float, *, K: int, G: int, save_states: bool,
              num_warps: int = 4, num_stages: int = 1):
    """Chunked RG-LRU forward.

    x: [B, L, D] bf16/fp16/fp32 contiguous; w_a, w_x: [H, n, n] fp32; b_a, b_x, a_param: [D] fp32;
    h0: [B, D] fp32 or None. K: chunk length (power of two >= 16); G: chunks per group (one
    program walks a group; G >= ceil(L / K) is the single-sweep serial variant).
    Returns y [B, L, D] x.dtype, h_last [B, D] fp32, states [B, ceil(L/K), D] fp32 (the state
    entering every chunk; an empty tensor unless ``save_states``).
    """
    B, L, D = x.shape
    H, n = w_a.shape[0], w_a.shape[1]
    BN = head_block(n)
    NC = triton.cdiv(L, K)
    NG = triton.cdiv(NC, G)
    NGP = triton.next_power_of_2(NG)
    dev = x.device
    w16, w_inv, _, _ = split_weights(w_a, w_x)
    y = new_buffer((B, L, D), x.dtype, dev)
    h_last = new_buffer((B, D), torch.float32, dev)
    states = new_buffer((B, NC, D), torch.float32, dev) if save_states else torch.empty(0, device=dev)
    sums = new_buffer((2, B, NG, D), torch.float32, dev) if NG > 1 else h_last
    has_h0 = h0 is not None
    args = (x, w16, w_inv, b_a, b_x, a_param, h0.contiguous() if has_h0 else h_last, sums, y,
            states if save_states else h_last, h_last, L, D, n, H, NC, G, NG, float(c))
    meta = dict(K=K, BN=BN, NGP=NGP, X_PARTS=2 if x.dtype == torch.float32 else 1, HAS_H0=has_h0,
                NATIVE=native(), num_warps=num_warps, num_stages=num_stages)
    grid = (NG, H, B)
    if NG > 1:
        _rglru_fwd_kernel[grid](*args, SUMMARY=True, SAVE_STATES=False, **meta)
    _rglru_fwd_kernel[grid](*args, SUMMARY=False, SAVE_STATES=save_states, **meta)
    return y, h_last, states
