"""RG-LRU forward in Triton: block-diagonal gates on tensor cores fused with a chunked linear scan
(spec §4, §6).

Read bottom-up: ``rglru_fwd`` (host) runs ``_rglru_chunk_kernel`` twice: the summary pass (each
program composes the affine maps of its group of chunks, keeping the map from the group's start
to every chunk) and the replay (each program applies the maps of the groups before its own,
enters every chunk with the state that gives, writes it for the backward and writes y). The
kernels are built from the jit helpers above them (elementary functions, exact gate products on
tensor cores, scan combines). The math, the precision argument, the layouts and the scratch
formula are in README.md beside this file.

Layout: x, y [B, L, D]; channel d = h * n + j for head h and in-head index j (n = D / H); gate
weights [H, n, n] with x_{t,h} @ w[h]. Every chunk is independent once the states entering the
chunks are known, so a program owns (batch row, head, tile of BJ output channels, a range of
chunks) and takes WC chunks per step, one per warp: its gate products read the head's whole input
rows of those WC * K tokens, everything else is per channel, in [BJ, WC, K] tiles laid out one
channel per lane, one chunk per warp and a chunk's K tokens inside the thread, so token scans
(and flips) never leave a thread.

Packed calls (VARLEN, B = 1, ``words``: packing_triton.chunk_boundaries') restart the recurrence
where a sequence opens: that token's transition becomes 0 and its input gains a_t times the
sequence's initial state, so the scans need no other change. Each sequence's final state is the
summary pass's map from its last chunk's start to the token that closes it (``fin``, fp32-accurate
gates), applied by the replay to the state entering that chunk.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from samu.ops.packing_triton import chunk_word, first_sequence, opens_in, step_opens
from samu.ops.triton_utils import carve, cdiv, next_power_of_2
from samu.ops.triton_utils import launch as triton_launch
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


def new_flat(n, device, dtype) -> torch.Tensor:
    """new_buffer of n elements, called as torch.empty(n, device=, dtype=) (triton_utils.carve's allocator)."""
    return new_buffer((n,), dtype, device)


def math_mode(fast: bool) -> int:
    """The kernels' MATH constant: 0 in the interpreter, else 1 (precise) or 2 (fast); see below.

    The interpreter has no libdevice (its numpy functions are correctly rounded already), truncates
    on fp32 -> bf16 casts and multiplies bf16 matrices as raw integers, so kernels work around all
    three there.
    """
    if os.environ.get("TRITON_INTERPRET", "0") == "1" or libdevice is None:
        return 0
    return 2 if fast else 1


def head_pieces(n: int) -> tuple[int, int]:
    """The head's columns as two power-of-two pieces (tl.dot needs powers of two >= 16), NPA the
    largest that fits and NPB the rest padded (0 when none): 160 = 128 + 32, 96 = 64 + 32, 64 = 64 + 0.
    Products over the head run piece by piece, so only the second piece carries padding."""
    NPA = max(16, 1 << (n.bit_length() - 1))
    rest = n - NPA
    return NPA, (max(16, next_power_of_2(rest)) if rest > 0 else 0)


def channel_block(n: int) -> int:
    """Output channels per program BJ: one per lane of a warp, at most the first head piece."""
    return min(head_pieces(n)[0], 32)


def weight_width(n: int) -> int:
    """NPW, the padded side of each head's weight parts: covers both pieces and whole channel tiles."""
    return max(sum(head_pieces(n)), cdiv(n, channel_block(n)) * channel_block(n))


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
    elif MATH == 2:
        # one MUFU.RCP; Triton's `1 / x` adds a range fix-up the callers never need
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                        is_pure=True, pack=1)
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
        # Taylor to degree 8 on [-0.5, 0] (truncation < 1.4e-8 relative), exp - 1 below
        p = 1.0 / 40320.0
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
# jit helpers: exact products on bf16 tensor cores
#
# An fp32 value v is the exact sum of three bf16 parts: hi = bf16(v), mid = bf16(v - hi),
# lo = bf16(v - hi - mid) (8 + 8 + 8 significant bits; bf16 has fp32's exponent range, so no
# scaling). bf16 x is its own single part. A product sums the part products p_i q_k with
# i + k <= ORDER (2: all terms down to 2^-16 relative of the leading one, fp32-accurate; 1: down
# to 2^-8, accurate to ~2^-16, enough for results stored in bf16 or fp16), smallest first, each
# exact in fp32 and accumulated in fp32. See README.md, "Precision".


@triton.jit
def _split3(b_v):
    """fp32 -> bf16 (hi, mid, lo) with hi + mid + lo == v exactly (truncating casts also qualify)."""
    b_hi = b_v.to(tl.bfloat16)
    b_r = b_v - b_hi.to(tl.float32)
    b_mid = b_r.to(tl.bfloat16)
    return b_hi, b_mid, (b_r - b_mid.to(tl.float32)).to(tl.bfloat16)


@triton.jit
def _parts_dot(a, b, acc, A_PARTS: tl.constexpr, B_PARTS: tl.constexpr, ORDER: tl.constexpr, MATH: tl.constexpr):
    """acc + sum of a[i] @ b[k] over i < A_PARTS, k < B_PARTS, i + k <= ORDER, smallest terms first
    (a, b: tuples of three bf16 parts)."""
    a0, a1, a2 = a
    b0, b1, b2 = b
    if MATH == 0:
        # the interpreter multiplies bf16 matrices as raw integers: upcast (exact for bf16 parts)
        a0, a1, a2 = a0.to(tl.float32), a1.to(tl.float32), a2.to(tl.float32)
        b0, b1, b2 = b0.to(tl.float32), b1.to(tl.float32), b2.to(tl.float32)
    if ORDER >= 2:
        if B_PARTS > 2:
            acc = tl.dot(a0, b2, acc)
        if A_PARTS > 2:
            acc = tl.dot(a2, b0, acc)
        if A_PARTS > 1 and B_PARTS > 1:
            acc = tl.dot(a1, b1, acc)
    if B_PARTS > 1:
        acc = tl.dot(a0, b1, acc)
    if A_PARTS > 1:
        acc = tl.dot(a1, b0, acc)
    return tl.dot(a0, b0, acc)


@triton.jit
def _trans3(t):
    return tl.trans(t[0]), tl.trans(t[1]), tl.trans(t[2])


@triton.jit
def _x_parts(b_x, X_PARTS: tl.constexpr):
    """bf16 parts of an input tile: bf16 is one part; fp16 (11 bits) two; fp32 three."""
    if X_PARTS == 1:
        b_x0 = b_x.to(tl.bfloat16)
        return b_x0, b_x0, b_x0
    else:
        return _split3(b_x.to(tl.float32))


@triton.jit
def _x_rows(p_x, o_t, m_rows, o_i, m_i, D: tl.constexpr, X_PARTS: tl.constexpr):
    """Parts of the head's input rows of one step (tokens o_t), columns o_i: [WC K, len(o_i)] each."""
    return _x_parts(tl.load(p_x + o_t[:, None] * D + o_i[None, :], mask=m_rows[:, None] & m_i[None, :], other=0.0),
                    X_PARTS)


@triton.jit
def _w_slab(w3, gate, i_h, o_i, o_j, NPW: tl.constexpr, HPP: tl.constexpr):
    """The three bf16 parts of a gate's weight rows o_i, columns o_j of head i_h: [len(o_i), BJ] each."""
    p_w = w3 + gate * 3 * HPP + i_h.to(tl.int64) * NPW * NPW + o_i[:, None] * NPW + o_j[None, :]
    return tl.load(p_w), tl.load(p_w + HPP), tl.load(p_w + 2 * HPP)


@triton.jit
def _second(a1, b1, a2, b2):
    return a2, b2


@triton.jit
def _gate_dot(xa, xb, wa, wb, X_PARTS: tl.constexpr, ORDER: tl.constexpr, NPB: tl.constexpr, WC: tl.constexpr,
              K: tl.constexpr, BJ: tl.constexpr, MATH: tl.constexpr):
    """Pre-activation of one gate, x [WC K, n] @ w [n, BJ], as [BJ, WC, K]: the head's columns in
    two pieces (xa @ wa over the first NPA, xb @ wb over the next NPB when NPB > 0); ORDER 2
    fp32-accurate, ORDER 1 to ~2^-16 (for results only stored in bf16 or fp16)."""
    b_z = tl.zeros([WC * K, BJ], dtype=tl.float32)
    b_z = _parts_dot(xa, wa, b_z, X_PARTS, 3, ORDER, MATH)
    if NPB > 0:
        b_z = _parts_dot(xb, wb, b_z, X_PARTS, 3, ORDER, MATH)
    return tl.reshape(tl.trans(b_z), [BJ, WC, K])


@triton.jit
def _to_scan_layout(b_v, MATH: tl.constexpr):
    """b_v [BJ, WC, K] through a scan that returns its input: the compiler moves it to the scans'
    layout (one channel per lane, tokens inside threads) here, once, and keeps every later
    per-element step there (left alone it computes in the product's layout and moves several
    tiles back and forth around the scans). Nothing to do in the interpreter."""
    if MATH != 0:
        _, b_v = tl.associative_scan((b_v, b_v), 2, _second)
    return b_v


@triton.jit
def _rows(b_v, WC: tl.constexpr, K: tl.constexpr, BJ: tl.constexpr):
    """[BJ, WC, K] -> [WC K, BJ]: token rows, the operand shape of the products over tokens or channels."""
    return tl.trans(tl.reshape(b_v, [BJ, WC * K]))


# ----------------------------------------------------------------------------------------------
# jit helpers: scan combines


@triton.jit
def _affine(a1, b1, a2, b2):
    """(a1, b1) then (a2, b2) for h -> a h + b."""
    return a1 * a2, a2 * b1 + b2


@triton.jit
def _token(b_v, k, K: tl.constexpr):
    """Token k of every chunk of [BJ, WC, K]: [BJ, WC] (a masked sum: exact, and inside each thread)."""
    o_k = tl.arange(0, K)
    return tl.sum(tl.where(o_k[None, None, :] == k, b_v, 0.0), axis=2)


@triton.jit
def _walk2(x1, x2, combine, K: tl.constexpr):
    """Interpreter stand-in for tl.associative_scan((x1, x2), 2, combine) on [BJ, WC, K] tiles.

    The interpreter's scan calls the combine once per element in Python; this walks the tokens in
    the same order as the GPU's in-thread scan (same rounding), combining whole [BJ, WC, 1] columns
    (builtins only: the interpreter re-patches the language on every device-function call).
    """
    o_k = tl.arange(0, K)[None, None, :]
    S: tl.constexpr = [x1.shape[0], x1.shape[1], 1]
    c1, c2 = tl.gather(x1, tl.full(S, 0, tl.int32), 2), tl.gather(x2, tl.full(S, 0, tl.int32), 2)
    for k in tl.static_range(1, K):
        o_c = tl.full(S, k, tl.int32)
        c1, c2 = combine(c1, c2, tl.gather(x1, o_c, 2), tl.gather(x2, o_c, 2))
        x1 = tl.where(o_k == k, c1, x1)
        x2 = tl.where(o_k == k, c2, x2)
    return x1, x2


@triton.jit
def _walk3(x1, x2, x3, combine, K: tl.constexpr):
    """_walk2 for three-component combines."""
    o_k = tl.arange(0, K)[None, None, :]
    S: tl.constexpr = [x1.shape[0], x1.shape[1], 1]
    o_c = tl.full(S, 0, tl.int32)
    c1, c2, c3 = tl.gather(x1, o_c, 2), tl.gather(x2, o_c, 2), tl.gather(x3, o_c, 2)
    for k in tl.static_range(1, K):
        o_c = tl.full(S, k, tl.int32)
        c1, c2, c3 = combine(c1, c2, c3, tl.gather(x1, o_c, 2), tl.gather(x2, o_c, 2), tl.gather(x3, o_c, 2))
        x1 = tl.where(o_k == k, c1, x1)
        x2 = tl.where(o_k == k, c2, x2)
        x3 = tl.where(o_k == k, c3, x3)
    return x1, x2, x3


@triton.jit
def _scan_affine(b_a, b_b, K: tl.constexpr, MATH: tl.constexpr):
    """Inclusive scan of (a, b) under _affine along the tokens (axis 2) of [BJ, WC, K] tiles."""
    if MATH == 0:
        return _walk2(b_a, b_b, _affine, K)
    else:
        return tl.associative_scan((b_a, b_b), 2, _affine)


@triton.jit
def _flip_tokens(b_v, K: tl.constexpr, MATH: tl.constexpr):
    """[BJ, WC, K] with each chunk's tokens reversed: free on the GPU (inside threads); the
    interpreter's tl.flip runs a Python loop per element, so it gathers there."""
    if MATH == 0:
        o_k = tl.arange(0, K)
        return tl.gather(b_v, tl.broadcast_to((K - 1 - o_k)[None, None, :], b_v.shape), 2)
    else:
        return tl.flip(b_v, 2)


@triton.jit
def _compose_chunks(b_A, b_B, b_rA, b_rB, BJ: tl.constexpr, WC: tl.constexpr, REVERSE: tl.constexpr,
                    MATH: tl.constexpr):
    """The maps from the running map (rA, rB) [BJ] through each chunk of a step, [BJ, WC] each.

    (A, B) [BJ, WC] are the chunks' own maps h -> A h + B (one chunk per warp). Forward: the
    running map covers the chunks before the step and chunk c's result covers them through c.
    REVERSE (the adjoint): the running map covers the chunks after the step and chunk c's result
    covers c through them.
    """
    b_A = tl.reshape(b_A, [BJ, 1, WC])
    b_B = tl.reshape(b_B, [BJ, 1, WC])
    if REVERSE:
        b_A = _flip_tokens(b_A, WC, MATH)
        b_B = _flip_tokens(b_B, WC, MATH)
    o_c = tl.arange(0, WC)[None, None, :]
    b_B = tl.where(o_c == 0, b_B + b_A * b_rB[:, None, None], b_B)
    b_A = tl.where(o_c == 0, b_A * b_rA[:, None, None], b_A)
    b_A, b_B = _scan_affine(b_A, b_B, WC, MATH)
    if REVERSE:
        b_A = _flip_tokens(b_A, WC, MATH)
        b_B = _flip_tokens(b_B, WC, MATH)
    return tl.reshape(b_A, [BJ, WC]), tl.reshape(b_B, [BJ, WC])


@triton.jit
def _fold_groups(b_h, p_g, SB, o_rows, m_rows, o_d, m_j, D: tl.constexpr, BJ: tl.constexpr, NGP: tl.constexpr,
                 MATH: tl.constexpr):
    """Apply the group maps at rows o_rows [NGP] (A at p_g + row * D + d, B SB further), in order,
    to b_h [BJ]; masked rows are identities. Returns the result, [BJ]."""
    p_r = p_g + o_rows[None, None, :].to(tl.int64) * D + o_d[:, None, None]         # [BJ, 1, NGP]
    m = m_j[:, None, None] & m_rows[None, None, :]
    b_A = tl.load(p_r, mask=m, other=1.0)
    b_B = tl.load(p_r + SB, mask=m, other=0.0)
    o_g = tl.arange(0, NGP)[None, None, :]
    b_B = tl.where(o_g == 0, b_B + b_A * b_h[:, None, None], b_B)
    _, b_H = _scan_affine(b_A, b_B, NGP, MATH)
    return tl.sum(_token(b_H, NGP - 1, NGP), axis=1)


# ----------------------------------------------------------------------------------------------
# kernels


@triton.jit
def _rglru_split_weights_kernel(
    w_a, w_x,            # [H, n, n] fp32
    w3,                  # [2, 3, H, NPW, NPW] bf16: (gate, part) of w, zero-padded to NPW x NPW
    n, HPP,
    NPW: tl.constexpr, BLOCK: tl.constexpr,
):
    """Elementwise over the padded weights: w = hi + mid + lo exactly."""
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < 2 * HPP
    i_g = o // HPP
    o_w = o % HPP
    i_h = o_w // (NPW * NPW)
    i_r = (o_w // NPW) % NPW
    i_c = o_w % NPW
    m_src = m & (i_r < n) & (i_c < n)
    o_src = (i_h * n + i_r) * n + i_c
    b_w = tl.where(i_g == 0, tl.load(w_a + o_src, mask=m_src & (i_g == 0), other=0.0),
                   tl.load(w_x + o_src, mask=m_src & (i_g == 1), other=0.0))
    b_hi, b_mid, b_lo = _split3(b_w)
    o_dst = i_g * 3 * HPP + o_w
    tl.store(w3 + o_dst, b_hi, mask=m)
    tl.store(w3 + o_dst + HPP, b_mid, mask=m)
    tl.store(w3 + o_dst + 2 * HPP, b_lo, mask=m)


@triton.jit
def _chunk_gates(xa, xb, b_xj, wa, wb, b_ba, b_bx, b_csp, m_t, X_PARTS: tl.constexpr, ORDER: tl.constexpr,
                 NPB: tl.constexpr, WC: tl.constexpr, K: tl.constexpr, BJ: tl.constexpr, MATH: tl.constexpr):
    """Transition a_t and scan input multiplier_t * gate_x_t * x_t, [BJ, WC, K] fp32, from the parts
    of the head's input rows (xa, xb: the two column pieces), this tile's inputs b_xj [BJ, WC, K]
    fp32 and the weight slabs (wa, wb: (gate a, gate x) per piece); tokens past L (m_t false) are
    identities a = 1, b = 0."""
    b_za = _gate_dot(xa, xb, wa[0], wb[0], X_PARTS, ORDER, NPB, WC, K, BJ, MATH)
    b_zx = _gate_dot(xa, xb, wa[1], wb[1], X_PARTS, ORDER, NPB, WC, K, BJ, MATH)
    b_ga = _sigmoid(b_za + b_ba[:, None, None], MATH)
    b_gx = _sigmoid(b_zx + b_bx[:, None, None], MATH)
    b_a, b_u = _decay(b_csp[:, None, None] * b_ga, MATH)
    b_a = tl.where(m_t[None, :, :], b_a, 1.0)
    return b_a, tl.where(m_t[None, :, :], _sqrt(b_u, MATH) * b_gx * b_xj, 0.0)


@triton.jit
def _head_pieces(n: tl.constexpr, NPA: tl.constexpr, NPB: tl.constexpr):
    """Column indices and masks of the head's two pieces (the second a copy of the first when NPB = 0)."""
    o_ia = tl.arange(0, NPA)
    if NPB > 0:
        o_ib = NPA + tl.arange(0, NPB)
    else:
        o_ib = o_ia
    return o_ia, o_ia < n, o_ib, o_ib < n


@triton.jit
def _head_rows(p_x, o_t, m_rows, o_ia, m_ia, o_ib, m_ib, D: tl.constexpr, NPB: tl.constexpr, X_PARTS: tl.constexpr):
    """Parts of the head's input rows of one step, per piece (the second a copy when NPB = 0)."""
    xa = _x_rows(p_x, o_t, m_rows, o_ia, m_ia, D, X_PARTS)
    if NPB > 0:
        xb = _x_rows(p_x, o_t, m_rows, o_ib, m_ib, D, X_PARTS)
    else:
        xb = xa
    return xa, xb


@triton.jit
def _weight_slabs(w3, i_h, o_ia, o_ib, o_j, NPB: tl.constexpr, NPW: tl.constexpr, HPP: tl.constexpr):
    """((gate a, gate x) slabs of piece a, the same of piece b): each the three parts [len(o_i), BJ]."""
    wa = (_w_slab(w3, 0, i_h, o_ia, o_j, NPW, HPP), _w_slab(w3, 1, i_h, o_ia, o_j, NPW, HPP))
    if NPB > 0:
        wb = (_w_slab(w3, 0, i_h, o_ib, o_j, NPW, HPP), _w_slab(w3, 1, i_h, o_ib, o_j, NPW, HPP))
    else:
        wb = wa
    return wa, wb


@triton.jit
def _channel_tile(i_hj, n: tl.constexpr, BJ: tl.constexpr):
    """Program axis 1 (heads x channel tiles of BJ): head, channels in it, their mask, model channels."""
    NJ: tl.constexpr = (n + BJ - 1) // BJ
    i_h = i_hj // NJ
    o_j = (i_hj % NJ) * BJ + tl.arange(0, BJ)
    return i_h, o_j, o_j < n, i_h * n + o_j


@triton.jit
def _tile_ptrs(p, o_c, o_j, one, K: tl.constexpr, D: tl.constexpr):
    """[BJ, WC, K] pointers to a channel tile's tokens in the WC chunks of a step from its base p: one pointer a
    thread (its channel and chunk), then a constant a token. Offsets summed before the pointer is formed left a
    64-bit address a token live, which the weight-gradient kernel spilled (docs/performance.md, "Session 19").
    The channel stride `one` is hidden from the compiler so it lays channel tiles out one channel per lane
    (token scans stay in-thread)."""
    return (p + (o_c[None, :, None] * (K * D) + (o_j * one)[:, None, None])) + (tl.arange(0, K) * D)[None, None, :]


@triton.jit
def _channel_consts(b_a, a_param, w3, c, i_h, o_ia, o_ib, o_j, o_d, m_j, NPB: tl.constexpr, NPW: tl.constexpr,
                    H: tl.constexpr, MATH: tl.constexpr):
    """A channel tile's gate-a bias, -c softplus(a_param), and weight slabs (see _weight_slabs)."""
    b_ba = tl.load(b_a + o_d, mask=m_j, other=0.0)
    b_csp = -c * _softplus(tl.load(a_param + o_d, mask=m_j, other=0.0), MATH)
    wa, wb = _weight_slabs(w3, i_h, o_ia, o_ib, o_j, NPB, NPW, H * NPW * NPW)
    return b_ba, b_csp, wa, wb


@triton.jit
def _boundaries(words, i_s, m_t, L, NC, WC: tl.constexpr, K: tl.constexpr):
    """Per token of step i_s [WC, K]: its packed sequence, whether it opens it and whether it closes it, from
    the step's chunk words (packing_triton: bits by shifts, the sequence by an in-thread prefix count)."""
    o_k = tl.arange(0, K)[None, :]
    i_c = i_s * WC + tl.arange(0, WC)                                                # [WC] chunks
    word = chunk_word(words, i_c, NC, K)[:, None]
    opens = opens_in(word, o_k)
    closes = opens_in(word, o_k + 1) | (i_c[:, None] * K + o_k == L - 1)
    n = first_sequence(words, i_c, NC)[:, None] + tl.cumsum(tl.where(opens & (o_k > 0), 1, 0), axis=1)
    return n, m_t & opens, m_t & closes


@triton.jit
def _rows_of(p, n, o_d, m_j, m_tok, D: tl.constexpr):
    """Rows n [WC, K] of a [N, D] state at channels o_d [BJ], as [BJ, WC, K] fp32 (0 where m_tok is false)."""
    return tl.load(p + n[None, :, :].to(tl.int64) * D + o_d[:, None, None], mask=m_j[:, None, None] & m_tok[None, :, :],
                   other=0.0)


@triton.jit
def _restart(b_at, b_bt, opens, b_h0, HAS_H0: tl.constexpr):
    """Where a token opens its sequence: transition 0, input plus a_t times the initial state (b_h0)."""
    if HAS_H0:
        b_bt = b_bt + tl.where(opens[None, :, :], b_at * b_h0, 0.0)
    return tl.where(opens[None, :, :], 0.0, b_at), b_bt


@triton.jit
def _steps(i_g, G, NC, WC: tl.constexpr):
    """The steps [s_lo, s_hi) of WC chunks that group i_g walks."""
    s_lo = i_g * G
    return s_lo, tl.minimum(s_lo + G, tl.cdiv(NC, WC))


@triton.jit(do_not_specialize=["L", "NC", "G", "NG", "one"])
def _rglru_chunk_kernel(
    x,                   # [B, L, D] bf16 / fp16 / fp32
    w3,                  # [2, 3, H, NPW, NPW] bf16 weight parts (see _rglru_split_weights_kernel)
    b_a, b_x, a_param,   # [D] fp32
    h0,                  # [B, D] fp32 initial state (when HAS_H0: the replay's; packed, [N, D], both passes')
    cums,                # [2, B, NC, D] fp32: per chunk, the map (A, B) from its group's start to it
    gsums,               # [2, B, NG, D] fp32: per group, the map through the whole group
    states,              # [B, NC, D] fp32: the state entering every chunk (replay writes it)
    y,                   # [B, L, D] x.dtype (replay)
    h_last,              # [B, D] fp32 final state (replay, HAS_FINAL); packed, [N, D]
    words,               # [3, NC] int32: packing_triton.chunk_boundaries (VARLEN)
    fin_a, fin_b,        # [N, D] fp32 each: per sequence, the map from its last chunk's start to its end
                         # (VARLEN, HAS_FINAL)
    L, NC, G, NG, c,
    one,                 # 1, as a runtime value (see below)
    D: tl.constexpr, n: tl.constexpr, H: tl.constexpr,
    K: tl.constexpr, WC: tl.constexpr, NPA: tl.constexpr, NPB: tl.constexpr, NPW: tl.constexpr,
    BJ: tl.constexpr, NGP: tl.constexpr,
    X_PARTS: tl.constexpr, Y_ORDER: tl.constexpr, HAS_H0: tl.constexpr, SUMMARY: tl.constexpr, MATH: tl.constexpr,
    VARLEN: tl.constexpr, HAS_FINAL: tl.constexpr,
):
    """One (group: a range of G steps of WC chunks, head x channel tile, batch row).

    SUMMARY: carry the composition of the group's chunk maps from the group's start; write, for
    every chunk, the map from the group's start to the chunk (``cums``) and the group's whole map
    (``gsums``). Replay: enter with h0 composed with the maps of the groups before, enter every
    chunk with its ``cums`` map applied to that, write the states and y; the last group also
    applies its own map: h_last. Only y depends on the replay's gates, so they carry Y_ORDER (1
    when y is stored in bf16 or fp16); every fp32 result comes from the summary pass's. Packed
    (VARLEN): the module docstring. Without HAS_FINAL (a caller that drops the final state) neither pass
    computes it: packed, that is a scatter and a gather per token less.
    """
    i_g, i_hj, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_h, o_j, m_j, o_d = _channel_tile(i_hj, n, BJ)
    i_b64 = i_b.to(tl.int64)
    o_ia, m_ia, o_ib, m_ib = _head_pieces(n, NPA, NPB)
    o_c = tl.arange(0, WC)
    o_k = tl.arange(0, K)
    o_t = tl.arange(0, WC * K)
    b_bx = tl.load(b_x + o_d, mask=m_j, other=0.0)
    b_ba, b_csp, wa, wb = _channel_consts(b_a, a_param, w3, c, i_h, o_ia, o_ib, o_j, o_d, m_j, NPB, NPW, H, MATH)

    SC = tl.num_programs(2).to(tl.int64) * NC * D
    SG = tl.num_programs(2).to(tl.int64) * NG * D
    s_lo, s_hi = _steps(i_g, G, NC, WC)
    c_end = tl.minimum(s_hi * WC, NC)
    b_rA = tl.full([BJ], 1.0, dtype=tl.float32)
    b_rB = tl.zeros([BJ], dtype=tl.float32)
    if SUMMARY:
        # the group's first chunk is entered by the identity map
        p_c = cums + (i_b64 * NC + s_lo * WC) * D + o_d
        tl.store(p_c, b_rA, mask=m_j)
        tl.store(p_c + SC, b_rB, mask=m_j)
    else:
        # packed, each sequence's initial state enters where it opens, and its final state where it closes
        if HAS_H0 and not VARLEN:
            b_rB = tl.load(h0 + i_b64 * D + o_d, mask=m_j, other=0.0)
        o_r = tl.arange(0, NGP)
        p_g = gsums + i_b64 * NG * D
        if HAS_FINAL and not VARLEN:
            if i_g == NG - 1:
                b_end = _fold_groups(b_rB, p_g, SG, o_r, o_r < NG, o_d, m_j, D, BJ, NGP, MATH)
                tl.store(h_last + i_b64 * D + o_d, b_end, mask=m_j)
        if NGP > 1:
            b_rB = _fold_groups(b_rB, p_g, SG, o_r, o_r < i_g, o_d, m_j, D, BJ, NGP, MATH)

    o_base = (i_b64 * L + s_lo.to(tl.int64) * (WC * K)) * D + i_h * n
    p_x = x + o_base
    p_y = y + o_base
    for i_s in range(s_lo, s_hi):
        t0 = i_s * (WC * K)
        m_t = t0 + o_c[:, None] * K + o_k[None, :] < L                                 # [WC, K]
        m_x = m_j[:, None, None] & m_t[None, :, :]
        m_r = t0 + o_t < L
        xa, xb = _head_rows(p_x, o_t, m_r, o_ia, m_ia, o_ib, m_ib, D, NPB, X_PARTS)
        b_xj = tl.load(_tile_ptrs(p_x, o_c, o_j, one, K, D), mask=m_x, other=0.0).to(tl.float32)
        b_at, b_bt = _chunk_gates(xa, xb, b_xj, wa, wb, b_ba, b_bx, b_csp, m_t, X_PARTS,
                                  2 if SUMMARY else Y_ORDER, NPB, WC, K, BJ, MATH)
        if VARLEN:
            if HAS_H0 or HAS_FINAL:
                i_n, opens, closes = _boundaries(words, i_s, m_t, L, NC, WC, K)
                b_h0 = b_bt   # read only with an initial state
                if HAS_H0:
                    b_h0 = _rows_of(h0, i_n, o_d, m_j, opens, D)
                b_at, b_bt = _restart(b_at, b_bt, opens, b_h0, HAS_H0)
            elif step_opens(words, i_s * WC, NC, WC):
                # training's call: a step in which no sequence opens is an unpacked step
                opens = _boundaries(words, i_s, m_t, L, NC, WC, K)[1]
                b_at, b_bt = _restart(b_at, b_bt, opens, b_bt, False)
        i_c = i_s * WC + o_c                                                            # [WC] chunk index
        o_s = (i_b64 * NC + i_c)[None, :] * D + o_d[:, None]                           # [BJ, WC]
        if SUMMARY:
            # a scan (not a reduce) keeps the order of this non-commutative combine in any layout
            b_A, b_B = _scan_affine(b_at, b_bt, K, MATH)
            if VARLEN and HAS_FINAL:
                # the map from the chunk's start to each token that closes a sequence
                o_f = i_n[None, :, :].to(tl.int64) * D + o_d[:, None, None]
                m_f = m_j[:, None, None] & closes[None, :, :]
                tl.store(fin_a + o_f, b_A, mask=m_f)
                tl.store(fin_b + o_f, b_B, mask=m_f)
            b_A, b_B = _compose_chunks(_token(b_A, K - 1, K), _token(b_B, K - 1, K), b_rA, b_rB, BJ, WC, False,
                                       MATH)
            # the map entering chunk c + 1 runs through chunk c: stored one chunk over
            m_n = m_j[:, None] & (i_c + 1 < c_end)[None, :]
            tl.store(cums + o_s + D, b_A, mask=m_n)
            tl.store(cums + SC + o_s + D, b_B, mask=m_n)
            # chunks past NC (in the last step) are identities, so the step's last column carries on
            b_rA = tl.sum(tl.where(o_c[None, :] == WC - 1, b_A, 0.0), axis=1)
            b_rB = tl.sum(tl.where(o_c[None, :] == WC - 1, b_B, 0.0), axis=1)
        else:
            m_s = m_j[:, None] & (i_c < NC)[None, :]
            b_h = tl.load(cums + o_s, mask=m_s, other=1.0) * b_rB[:, None] + tl.load(cums + SC + o_s, mask=m_s,
                                                                                     other=0.0)
            tl.store(states + o_s, b_h, mask=m_s)
            if VARLEN and HAS_FINAL:
                o_f = i_n[None, :, :].to(tl.int64) * D + o_d[:, None, None]
                m_f = m_j[:, None, None] & closes[None, :, :]
                b_end = tl.load(fin_a + o_f, mask=m_f, other=0.0) * b_h[:, :, None] + tl.load(fin_b + o_f, mask=m_f,
                                                                                             other=0.0)
                tl.store(h_last + o_f, b_end, mask=m_f)
            b_bt = tl.where(o_k[None, None, :] == 0, b_bt + b_at * b_h[:, :, None], b_bt)
            _, b_H = _scan_affine(b_at, b_bt, K, MATH)
            tl.store(_tile_ptrs(p_y, o_c, o_j, one, K, D), _to_store(b_H, y.dtype.element_ty, MATH), mask=m_x)
        p_x += WC * K * D
        p_y += WC * K * D
    if SUMMARY:
        p_g = gsums + (i_b64 * NG + i_g) * D + o_d
        tl.store(p_g, b_rA, mask=m_j)
        tl.store(p_g + SG, b_rB, mask=m_j)


# ----------------------------------------------------------------------------------------------
# host


def x_parts(dtype: torch.dtype) -> int:
    """bf16 parts that hold one input value exactly: 1 for bf16, 2 for fp16, 3 for fp32."""
    return {torch.bfloat16: 1, torch.float16: 2}.get(dtype, 3)


def out_order(dtype: torch.dtype) -> int:
    """ORDER of the products behind results stored in ``dtype``: 2 (fp32-accurate) for fp32, 1
    (~2^-16, far below the rounding) for bf16 and fp16."""
    return 2 if dtype == torch.float32 else 1


def split_weights(w_a: torch.Tensor, w_x: torch.Tensor) -> torch.Tensor:
    """bf16 hi/mid/lo parts of both gate weights, zero-padded to [NPW, NPW] per head; one launch.

    Returns w3 [2, 3, H, NPW, NPW] bf16 (gate, part) with w = hi + mid + lo exactly.
    """
    H, n, _ = w_a.shape
    NPW = weight_width(n)
    w3 = new_buffer((2, 3, H, NPW, NPW), torch.bfloat16, w_a.device)
    HPP = H * NPW * NPW
    BLOCK = 1024
    launch_staged(_rglru_split_weights_kernel, (cdiv(2 * HPP, BLOCK),), w_a.contiguous(), w_x.contiguous(), w3, n, HPP,
                  NPW=NPW, BLOCK=BLOCK, num_warps=4)
    return w3


MAX_GROUPS = 64


def chunk_launch(x, H: int, K: int, WC: int, G: int, grouped: bool = True, **meta):
    """Grid and shape constants shared by the chunk-parallel kernels (forward and backward);
    grouped: the programs carry compositions over their steps (at most MAX_GROUPS per batch row)."""
    B, L, D = x.shape
    n = D // H
    (NPA, NPB), BJ = head_pieces(n), channel_block(n)
    NG = cdiv(cdiv(cdiv(L, K), WC), G)
    assert NG <= MAX_GROUPS or not grouped, f"{NG} groups of {G} steps; at most {MAX_GROUPS}"
    grid = (NG, H * cdiv(n, BJ), B)
    return grid, dict(D=D, n=n, H=H, K=K, WC=WC, NPA=NPA, NPB=NPB, NPW=weight_width(n), BJ=BJ,
                      X_PARTS=x_parts(x.dtype), num_warps=WC, num_stages=2, **meta)


_SINGLE_STAGE: set = set()   # (kernel, tensor dtypes, options) whose pipelined buffers did not fit


def launch_staged(kernel, grid, *args, **meta):
    """launch(kernel, grid, *args, **meta), without software pipelining where its buffers do not fit in
    shared memory (wide heads with fp32 inputs: remembered, so the failing form is tried once); stages
    change timing only, never results."""
    def key():
        return (kernel, *[a.dtype for a in args if isinstance(a, torch.Tensor)], *meta.items())

    # the key is built only once some form has failed (a few microseconds of every launch otherwise)
    if not _SINGLE_STAGE or key() not in _SINGLE_STAGE:
        try:
            return triton_launch(kernel, grid, *args, **meta)
        except triton.runtime.OutOfResources:
            _SINGLE_STAGE.add(key())
    triton_launch(kernel, grid, *args, **dict(meta, num_stages=1))


def group_width(NG: int) -> int:
    """NGP, the compiled width of the fold over group maps: one width on the GPU (one compile for
    every length), the smallest power of two in the interpreter (it walks every row)."""
    if NG == 1:
        return 1
    return next_power_of_2(NG) if math_mode(False) == 0 else MAX_GROUPS


def rglru_fwd(x, w_a, b_a, w_x, b_x, a_param, h0, c: float, *, K: int, WC: int, G: int, fast: bool = False,
              words=None, n_seqs=None, want_final: bool = True):
    """Chunked RG-LRU forward.

    x: [B, L, D] bf16/fp16/fp32 contiguous; w_a, w_x: [H, n, n] fp32; b_a, b_x, a_param: [D] fp32;
    h0: [B, D] fp32 or None. K: chunk length (a power of two; WC * K >= 16); WC: chunks per
    program step, one per warp; G: steps per group (one program each; at most MAX_GROUPS groups).
    fast: hardware approximations of exp, reciprocal and sqrt (MATH = 2). Packed (``words``, those
    of packing_triton.chunk_boundaries with this K, and ``n_seqs`` = N, B = 1): h0 and h_last are [N, D].
    Returns y [B, L, D] x.dtype, h_last [B, D] fp32 (None unless ``want_final``), states [B, ceil(L/K), D] fp32
    (the state entering every chunk; the backward replays from it) and w3, the weights' bf16 parts (split_weights;
    the backward's too).
    """
    B, L, D = x.shape
    varlen = words is not None
    NC = cdiv(L, K)
    dev = x.device
    w3 = split_weights(w_a, w_x)
    grid, meta = chunk_launch(x, w_a.shape[0], K, WC, G, MATH=math_mode(fast))
    NG = grid[0]
    cums, gsums = carve(new_flat, dev, (2, B, NC, D), (2, B, NG, D))
    states = new_buffer((B, NC, D), torch.float32, dev)
    y = new_buffer((B, L, D), x.dtype, dev)
    h_last = new_buffer((n_seqs if varlen else B, D), torch.float32, dev) if want_final else None
    # the pointers a kernel never reads are given as states
    fin = new_buffer((2, n_seqs, D), torch.float32, dev) if varlen and want_final else (states, states)
    out = h_last if want_final else states
    args = (x, w3, b_a, b_x, a_param, h0 if h0 is not None else states, cums, gsums, states, y, out,
            words if varlen else states, fin[0], fin[1], L, NC, G, NG, float(c), 1)
    meta.update(NGP=group_width(NG), HAS_H0=h0 is not None, Y_ORDER=out_order(x.dtype), VARLEN=varlen,
                HAS_FINAL=want_final)
    launch_staged(_rglru_chunk_kernel, grid, *args, SUMMARY=True, **leaner("summary", meta, x.dtype))
    launch_staged(_rglru_chunk_kernel, grid, *args, SUMMARY=False, **leaner("output", meta, x.dtype))
    return y, h_last, states, w3


# 16-bit launch options by pass and head dim: four programs a multiprocessor, or fewer spills (README.md)
LEANER = {
    "summary": {64: "cap", 96: "cap"},
    "output": {64: "cap", 96: "cap", 128: "cap"},
    "bwd_summary": {128: "stage", 160: "cap"},
    "dw": {96: "stage", 128: "stage"},
}


def leaner(kernel_pass: str, meta: dict, dtype: torch.dtype) -> dict:
    """``meta`` with the LEANER options of ``kernel_pass`` at its head dim meta["n"] (16-bit inputs only): "stage" is
    num_stages=1, "cap" that and maxnreg=128."""
    how = LEANER[kernel_pass].get(meta["n"]) if dtype in (torch.bfloat16, torch.float16) else None
    if how is None:
        return meta
    return dict(meta, num_stages=1, **({"maxnreg": 128} if how == "cap" else {}))
