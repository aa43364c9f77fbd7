"""Where packed sequences open, chunk by chunk, for the mixers' Triton kernels (one launch, no synchronisation).

A mixer kernel walks chunks of K tokens. For each chunk it needs which of its tokens open a sequence and
which sequence its tokens belong to; reading a per-token sequence index costs a load per token (and, in
the RG-LRU kernels, a [WC, K] load whose layout the compiler lays out across lanes). ``chunk_boundaries``
gives instead three int32 words per chunk c, from the offsets alone:

  bits[c]   bit k set where token c K + k opens a sequence (K <= 32; bit 31 makes the word negative)
  first[c]  the sequence of token c K
  last[c]   the sequence of the chunk's last token before L

so a kernel loads three scalars a chunk and finds the rest by shifts: token k opens where bit k is set,
closes where bit k + 1 (bit 0 of the next chunk at k = K - 1) is set or it is token L - 1, and belongs to
first[c] plus the bits set in (0, k].
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from samu.ops.triton_utils import cdiv, launch


@triton.jit(do_not_specialize=["N", "NC", "steps"])
def _chunk_boundaries_kernel(cu, out, N, NC, steps, K: tl.constexpr, BC: tl.constexpr):
    """Rows bits, first and last of ``out`` [3, NC] for BC chunks (module docstring); cu [N + 1] int32."""
    o_c = tl.program_id(0) * BC + tl.arange(0, BC)
    m_c = o_c < NC
    t0 = o_c * K
    # first: the largest n < N with cu[n] <= t0 (cu[0] = 0 <= t0 < L = cu[N]), by bisection of [lo, hi)
    lo = tl.zeros([BC], dtype=tl.int32)
    hi = tl.zeros([BC], dtype=tl.int32) + N
    for _ in range(steps):
        mid = (lo + hi) // 2
        below = tl.load(cu + mid, mask=m_c, other=0) <= t0
        lo = tl.where(below, mid, lo)
        hi = tl.where(below, hi, mid)
    bits = tl.where(tl.load(cu + lo, mask=m_c, other=-1) == t0, 1, 0)
    count = tl.zeros([BC], dtype=tl.int32)
    # the chunk's other opening tokens are the starts of sequences first + 1, first + 2, ... (offsets rise)
    for i in range(1, K):
        idx = lo + i
        s = tl.load(cu + idx, mask=m_c & (idx < N), other=0)
        inside = (idx < N) & (s > t0) & (s < t0 + K)
        bits = bits | tl.where(inside, 1 << (s - t0), 0)
        count += tl.where(inside, 1, 0)
    tl.store(out + o_c, bits, mask=m_c)
    tl.store(out + NC + o_c, lo, mask=m_c)
    tl.store(out + 2 * NC + o_c, lo + count, mask=m_c)


def chunk_boundaries(cu_seqlens: torch.Tensor, L: int, K: int) -> torch.Tensor:
    """int32 [3, ceil(L / K)]: per chunk of K tokens (K <= 32) its opening bits, the sequence of its first
    token and that of its last (module docstring), from checked offsets ``cu_seqlens`` (int32 [N + 1] on the
    kernels' device: strictly rising from 0 to L)."""
    assert 1 <= K <= 32, "one int32 word of opening bits a chunk"
    N = cu_seqlens.shape[0] - 1
    NC = cdiv(L, K)
    out = torch.empty(3, NC, dtype=torch.int32, device=cu_seqlens.device)
    BC = 128
    launch(_chunk_boundaries_kernel, (cdiv(NC, BC),), cu_seqlens, out, N, NC, max(1, N.bit_length()), K=K, BC=BC,
           num_warps=4)
    return out
