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
