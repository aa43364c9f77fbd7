"""Small @triton.jit helpers shared by the SAMU and RG-LRU kernels."""

import triton
import triton.language as tl


@triton.jit
def expm1(x):
    """exp(x) - 1 to a few ulp (the Triton interpreter has no libdevice).

    Near 0, Kahan's (u - 1) x / log(u) with u = exp(x) cancels the rounding of u; elsewhere u - 1
    has no cancellation.
    """
    u = tl.exp(x)
    near = (tl.abs(x) < 0.5) & (u != 1.0)
    safe = tl.where(near, u, 2.0)
    kahan = (safe - 1.0) * x / tl.log(safe)
    return tl.where(near, kahan, tl.where(u == 1.0, x, u - 1.0))


@triton.jit
def one_minus_exp_neg(x):
    """1 - exp(-x) for x >= 0, to ~2 ulp: a Taylor polynomial below 0.5, where 1 - exp(-x) cancels."""
    p = 1.0 / 362880.0
    p = p * x - 1.0 / 40320.0
    p = p * x + 1.0 / 5040.0
    p = p * x - 1.0 / 720.0
    p = p * x + 1.0 / 120.0
    p = p * x - 1.0 / 24.0
    p = p * x + 1.0 / 6.0
    p = p * x - 0.5
    p = p * x + 1.0
    return tl.where(x < 0.5, p * x, 1.0 - tl.exp(-x))


@triton.jit
def tanh(x):
    """tanh from one_minus_exp_neg: accurate near 0 and saturating cleanly."""
    e = one_minus_exp_neg(2.0 * tl.abs(x))
    t = e / (2.0 - e)
    return tl.where(x < 0, -t, t)


@triton.jit
def cast_to(x, dtype: tl.constexpr):
    """x (fp32) to the storage dtype with round-to-nearest-even.

    Triton's interpreter truncates fp32 -> bf16, so bf16 is rounded here by hand: the same bits as the
    GPU's conversion for every finite value, and in the interpreter too.
    """
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + (((bits >> 16) & 1) + 0x7FFF)
        rounded = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        return tl.where(x == x, rounded, x.to(tl.bfloat16))
    else:
        return x.to(dtype)
