"""Where packed sequences open, chunk by chunk, for the mixers' Triton kernels (one launch, no synchronisation).

A mixer kernel walks chunks of K tokens. For each chunk it needs which of its tokens open a sequence and
which sequence its tokens belong to; a per-token sequence index costs loads per token (two per token in
SAMU's walks: +7.6% of its kernels' time, `results/dev/issue15/packed_profile_1.json`).
``chunk_boundaries`` gives instead three int32 words per chunk c, from the offsets alone:

  bits[c]   bit k set where token c K + k opens a sequence (K <= 32; bit 31 makes the word negative)
  first[c]  the sequence of token c K
  last[c]   the sequence of the chunk's last token before L

so a kernel loads a few words a chunk and finds the rest by shifts (the jit helpers below, which both
mixers' kernels use): token k opens where bit k is set, closes where bit k + 1 (bit 0 of the next chunk at
k = K - 1) is set or it is token L - 1, and belongs to first[c] plus the bits set in (0, k].
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from samu.ops.triton_utils import cdiv, launch


@triton.jit(do_not_specialize=["N", "NC", "steps"])
def _chunk_boundaries_kernel(cu, words, N, NC, steps, K: tl.constexpr, BC: tl.constexpr):
    """Rows bits, first and last of ``words`` [3, NC] for BC chunks (module docstring); cu [N + 1] int32."""
    o_c = tl.program_id(0) * BC + tl.arange(0, BC)                                   # [BC] chunks
    m_c = o_c < NC
    t0 = o_c * K                                                                     # [BC] first tokens
    # first: the largest n < N with cu[n] <= t0 (cu[0] = 0 <= t0 < L = cu[N]), by bisection of [lo, hi)
    lo = tl.zeros([BC], dtype=tl.int32)
    hi = tl.zeros([BC], dtype=tl.int32) + N
    for _ in range(steps):
        mid = (lo + hi) // 2
        below = tl.load(cu + mid, mask=m_c, other=0) <= t0
        lo = tl.where(below, mid, lo)
        hi = tl.where(below, hi, mid)
    b_bits = tl.where(tl.load(cu + lo, mask=m_c, other=-1) == t0, 1, 0)
    b_count = tl.zeros([BC], dtype=tl.int32)
    # the chunk's other opening tokens are the starts of sequences first + 1, first + 2, ... (offsets rise)
    for i in range(1, K):
        idx = lo + i
        b_s = tl.load(cu + idx, mask=m_c & (idx < N), other=0)
        inside = (idx < N) & (b_s > t0) & (b_s < t0 + K)
        b_bits = b_bits | tl.where(inside, 1 << tl.where(inside, b_s - t0, 0), 0)
        b_count += tl.where(inside, 1, 0)
    tl.store(words + o_c, b_bits, mask=m_c)
    tl.store(words + NC + o_c, lo, mask=m_c)
    tl.store(words + 2 * NC + o_c, lo + b_count, mask=m_c)


@triton.jit
def chunk_word(words, i_c, NC, K: tl.constexpr):
    """The opening bits of chunk i_c (a scalar or a tensor of chunks, clamped into [0, NC)) as one int64 word:
    bits 0..K-1 its own, bit K that of the next chunk's first token (0 past the last). With it a token's test is
    one shift (opens_in) for every k in [0, K], not a select between two words per token: that select cost
    SAMU's packed dx walk 55 registers (127 -> 182 on sm_90; docs/performance.md, "Session 18")."""
    w = tl.load(words + tl.minimum(i_c, NC - 1)).to(tl.int64) & ((1 << K) - 1)
    w_next = tl.where(i_c + 1 < NC, tl.load(words + tl.minimum(i_c + 1, NC - 1)), 0)
    return w | ((w_next & 1).to(tl.int64) << K)


@triton.jit
def step_opens(words, c0, NC, WC: tl.constexpr):
    """Whether a sequence opens in chunks c0 .. c0 + WC - 1 (clamped into [0, NC)), a scalar: where none does, the
    walk's restarts are identities, so RG-LRU's kernels skip them (a branch the same in every thread)."""
    w = tl.load(words + tl.minimum(c0, NC - 1))
    for i in tl.static_range(1, WC):
        w |= tl.load(words + tl.minimum(c0 + i, NC - 1))
    return w != 0


@triton.jit
def first_sequence(words, i_c, NC):
    """The sequence of chunk i_c's first token."""
    return tl.load(words + NC + tl.minimum(i_c, NC - 1))


@triton.jit
def last_sequence(words, i_c, NC):
    """The sequence of chunk i_c's last token before L."""
    return tl.load(words + 2 * NC + tl.minimum(i_c, NC - 1))


@triton.jit
def opens_in(word, k):
    """Whether token k of a chunk opens a sequence (k = K: the next chunk's first token), from its chunk_word;
    k a scalar or a tensor broadcast against it, in [0, K]."""
    return ((word >> k) & 1) != 0


@triton.jit
def sequence_after(n, opens, k):
    """Walking a chunk left to right: the sequence of token k from that of token k - 1 (at k = 0, the
    chunk's first_sequence already)."""
    return n + (opens & (k > 0)).to(tl.int32)


@triton.jit
def sequence_before(n, opens, k):
    """Walking a chunk right to left: the sequence of token k - 1 from that of token k (``opens``: token k's)."""
    return n - (opens & (k > 0)).to(tl.int32)


def chunk_boundaries(cu_seqlens: torch.Tensor, L: int, K: int) -> torch.Tensor:
    """int32 [3, ceil(L / K)]: per chunk of K tokens (K <= 32) its opening bits, the sequence of its first
    token and that of its last (module docstring), from checked offsets ``cu_seqlens`` (int32 [N + 1] on the
    kernels' device: strictly rising from 0 to L)."""
    assert 1 <= K <= 32, "one int32 word of opening bits a chunk"
    N = cu_seqlens.shape[0] - 1
    NC = cdiv(L, K)
    words = torch.empty(3, NC, dtype=torch.int32, device=cu_seqlens.device)
    BC = 128
    launch(_chunk_boundaries_kernel, (cdiv(NC, BC),), cu_seqlens, words, N, NC, max(1, N.bit_length()), K=K, BC=BC,
           num_warps=4)
    return words
