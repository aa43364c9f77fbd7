"""Chunked two-level linear scan in plain PyTorch (the ``backend="torch"`` building block).

The sequence is cut into nC chunks of K tokens, laid out as [B, nC, K, ...]. A scan
h_t = a_t h_{t-1} + b_t then runs in three vectorised stages:

1. chunk summaries: for every chunk at once, K steps build (prod a, local end state);
2. prefix: nC steps compose the summaries into the state entering each chunk;
3. replay: K steps rerun every chunk from its entering state and hand each state to ``emit``.

Each stage works on one token per chunk at a time ([B, nC, ...]), so no per-token tensor beyond
what the caller keeps is created, and the Python loop is 2K + nC steps long instead of L.
``reverse=True`` runs the same recurrence from the last token to the first (adjoint scans).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

Coef = Callable[[int], "tuple[torch.Tensor, torch.Tensor]"]


def state_dtype(dtype: torch.dtype) -> torch.dtype:
    """Recurrent state and accumulation dtype of the torch path: fp32, float64 for float64 input."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def chunk_size(length: int) -> int:
    """Chunk length for the torch path: a power of two near sqrt(L), in [8, 256]."""
    return int(min(256, max(8, 2 ** math.ceil(0.5 * math.log2(max(length, 1))))))


def to_chunks(t: torch.Tensor, K: int, value: float = 0.0) -> torch.Tensor:
    """[B, L, ...] -> [B, nC, K, ...], padding the tail with ``value``."""
    B, L = t.shape[:2]
    pad = -L % K
    if pad:
        widths = [0, 0] * (t.dim() - 2) + [0, pad]
        t = F.pad(t, widths, value=value)
    return t.reshape(B, (L + pad) // K, K, *t.shape[2:])


def from_chunks(t: torch.Tensor, L: int) -> torch.Tensor:
    """[B, nC, K, ...] -> [B, L, ...], dropping the padded tail."""
    return t.reshape(t.shape[0], -1, *t.shape[3:])[:, :L]


def scan(coef: Coef, h0: torch.Tensor, K: int, emit: Callable[[int, torch.Tensor], None],
         reverse: bool = False) -> torch.Tensor:
    """Two-level scan of h = a h_prev + b over chunked coefficients.

    coef(k) returns (a, b), each [B, nC, ...], for token k of every chunk; h0: [B, ...] is the state
    before the first token (after the last one when ``reverse``). emit(k, h) receives the states of
    token k of every chunk, [B, nC, ...]. Returns the entering state of every chunk, [B, nC, ...]
    (for ``reverse``: the state entering each chunk from its right).
    """
    steps = range(K - 1, -1, -1) if reverse else range(K)
    a, b = coef(steps[0])
    n_chunks = b.shape[1]
    starts = torch.empty_like(b)
    if n_chunks == 1:
        starts[:, 0] = h0
    else:
        prod, end = a.clone(), b.clone()
        for k in steps[1:]:
            a, b = coef(k)
            end = torch.addcmul(b, a, end)
            prod = prod * a
        state = h0
        for c in (range(n_chunks - 1, -1, -1) if reverse else range(n_chunks)):
            starts[:, c] = state
            state = torch.addcmul(end[:, c], prod[:, c], state)
    h = starts
    for k in steps:
        a, b = coef(k)
        h = torch.addcmul(b, a, h)
        emit(k, h)
    return starts


class _ChunkedLinearScan(torch.autograd.Function):

    @staticmethod
    def forward(ctx, a, b, h0):
        B, L = b.shape[:2]
        K = chunk_size(L)
        a_c, b_c = to_chunks(a, K, 1.0), to_chunks(b, K)
        h_c = torch.empty_like(b_c)

        def emit(k, h):
            h_c[:, :, k] = h

        scan(lambda k: (a_c[:, :, k], b_c[:, :, k]), h0, K, emit)
        h = from_chunks(h_c, L)
        ctx.save_for_backward(a, h, h0)
        return h

    @staticmethod
    def backward(ctx, dh):
        a, h, h0 = ctx.saved_tensors
        B, L = dh.shape[:2]
        K = chunk_size(L)
        # delta_t = dh_t + conj(a_{t+1}) delta_{t+1}; a past the end is 0.
        a_next = torch.cat([a[:, 1:], torch.zeros_like(a[:, :1])], dim=1).conj()
        a_c, g_c = to_chunks(a_next, K), to_chunks(dh, K)
        delta_c = torch.empty_like(g_c)

        def keep(k, d):
            delta_c[:, :, k] = d

        scan(lambda k: (a_c[:, :, k], g_c[:, :, k]), torch.zeros_like(h0), K, keep, reverse=True)
        delta = from_chunks(delta_c, L)
        h_prev = torch.cat([h0.unsqueeze(1), h[:, :-1]], dim=1)
        return delta * h_prev.conj(), delta, a[:, 0].conj() * delta[:, 0]


def linear_scan(a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
    """Chunked h_t = a_t h_{t-1} + b_t with an adjoint-scan backward.

    a, b: [B, L, ...] (real or complex, one dtype); h0: [B, ...]. Returns h: [B, L, ...].
    """
    return _ChunkedLinearScan.apply(a.contiguous(), b.contiguous(), h0)
