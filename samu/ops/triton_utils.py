"""Small helpers shared by the SAMU and RG-LRU kernels: @triton.jit device functions, and two host
integer helpers (``triton.cdiv`` and ``triton.next_power_of_2`` are constexpr functions that cost
several microseconds a call on the host; a forward + backward calls them a dozen times)."""

import os

import triton
import triton.language as tl


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive integers (host code)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n, for n >= 1 (host code)."""
    return 1 << (n - 1).bit_length()


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
def one_minus_exp_neg_small(x):
    """1 - exp(-x) for 0 <= x < 0.5 by its Taylor polynomial (where 1 - exp(-x) would cancel)."""
    p = 1.0 / 362880.0
    p = p * x - 1.0 / 40320.0
    p = p * x + 1.0 / 5040.0
    p = p * x - 1.0 / 720.0
    p = p * x + 1.0 / 120.0
    p = p * x - 1.0 / 24.0
    p = p * x + 1.0 / 6.0
    p = p * x - 0.5
    p = p * x + 1.0
    return p * x


@triton.jit
def one_minus_exp_neg(x):
    """1 - exp(-x) for x >= 0, to ~2 ulp."""
    return tl.where(x < 0.5, one_minus_exp_neg_small(x), 1.0 - tl.exp(-x))


@triton.jit
def tanh(x):
    """tanh from one_minus_exp_neg: accurate near 0 and saturating cleanly."""
    e = one_minus_exp_neg(2.0 * tl.abs(x))
    t = e / (2.0 - e)
    return tl.where(x < 0, -t, t)


_SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)
_GELU_CUBIC = tl.constexpr(0.044715)


@triton.jit
def gelu_tanh(v):
    """GeLU, tanh approximation (PyTorch's approximate="tanh"), in fp32."""
    return 0.5 * v * (1.0 + tanh(_SQRT_2_OVER_PI * (v + _GELU_CUBIC * v * v * v)))


@triton.jit
def gelu_tanh_grad(v):
    """d gelu_tanh(v) / dv."""
    t = tanh(_SQRT_2_OVER_PI * (v + _GELU_CUBIC * v * v * v))
    return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_CUBIC * v * v)


# Triton's interpreter truncates fp32 -> bf16 (the GPU rounds to nearest even); kernels run in the
# interpreter exactly when this is set at import, as Triton decides that when it decorates them.
_INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def cast_to(x, dtype: tl.constexpr):
    """x (fp32) to the storage dtype, rounding to nearest even (by hand in the interpreter)."""
    if _INTERPRETED and dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + (((bits >> 16) & 1) + 0x7FFF)
        rounded = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        return tl.where(x == x, rounded, x.to(tl.bfloat16))
    else:
        return x.to(dtype)
