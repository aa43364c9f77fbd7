"""Triton kernels of the clipped AdamW step (samu.ops.adamw): every parameter tensor of the step is one row of a
table (int64: the element offsets of the parameter, its gradient, its two moments and its step counter from one base
address, its size, the bf16 element offset of its low copy (a multiple of 8) plus 1, or 0 where it has none, and
its group's hyperparameters as float64 bits), and every program takes one chunk of one row
(``chunks``: [row, first element] pairs, a row's chunks of CHUNK elements and a shorter last one).

``_sum_squares`` writes each chunk's sum of squared gradient elements; ``_clip`` adds those sums in chunk order (one
program: the same order, so the same bits, in every run) and writes the norm and the divisor of the gradients;
``_adamw`` updates a chunk's parameters and moments from its gradients divided by it, as torch's AdamW does, and
writes the parameters' low copies (bf16, rounded to nearest even as ``.to(torch.bfloat16)`` rounds) where a row has
one.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from samu.ops.triton_utils import cast_to, launch

# elements a pass of a program (4 warps: 8 fp32 a thread, two 16-byte accesses of each tensor), passes a chunk
BLOCK, PASSES = 1024, 8
CHUNK = BLOCK * PASSES
WARPS = 4
# the table's columns
P, G, M, V, STEP, NUMEL, LOW, LR, DECAY, BETA1, BETA2, EPS = range(12)
COLUMNS = 12
_P, _G, _M, _V, _STEP, _NUMEL, _LOW = (tl.constexpr(c) for c in (P, G, M, V, STEP, NUMEL, LOW))
_LR, _DECAY, _BETA1, _BETA2, _EPS, _COLUMNS = (tl.constexpr(c) for c in (LR, DECAY, BETA1, BETA2, EPS, COLUMNS))


@triton.jit
def _row(table, chunks, CHUNK: tl.constexpr):
    """This program's row of the table, its first element and the row's size."""
    pid = tl.program_id(0).to(tl.int64)
    row = table + tl.load(chunks + 2 * pid) * _COLUMNS
    start = tl.multiple_of(tl.load(chunks + 2 * pid + 1), CHUNK)
    return row, start, tl.load(row + _NUMEL)


@triton.jit
def _tensor(base, row, column: tl.constexpr):
    # every tensor but the step counter starts on a 16-byte boundary (clipped_step checks): 4 fp32 elements
    return base + tl.multiple_of(tl.load(row + column), 4)


@triton.jit
def _sum_squares(base, table, chunks, partial, BLOCK: tl.constexpr, PASSES: tl.constexpr):
    row, start, n = _row(table, chunks, BLOCK * PASSES)
    g = _tensor(base, row, _G)
    acc = tl.zeros([BLOCK], tl.float32)
    if start + BLOCK * PASSES <= n:   # a whole chunk: unmasked, so each thread's loads are 16 bytes wide
        for i in tl.static_range(PASSES):
            x = tl.load(g + start + i * BLOCK + tl.arange(0, BLOCK))
            acc += x * x
    else:
        for i in tl.static_range(PASSES):
            idx = start + i * BLOCK + tl.arange(0, BLOCK)
            x = tl.load(g + idx, mask=idx < n, other=0.0)
            acc += x * x
    tl.store(partial + tl.program_id(0), tl.sum(acc))


@triton.jit
def _clip(partial, C, out, max_norm, BLOCK: tl.constexpr):
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(0, C, BLOCK):
        j = i + tl.arange(0, BLOCK)
        acc += tl.load(partial + j, mask=j < C, other=0.0)
    norm = tl.sqrt(tl.sum(acc))
    tl.store(out, norm)
    # the gradients' divisor: (norm + 1e-6) / max_norm where that exceeds 1 (a nan norm stays nan)
    q = (norm + 1e-6) / max_norm
    tl.store(out + 1, tl.where(q < 1.0, 1.0, q))


@triton.jit
def _update(p, g, m, v, low, has_low, idx, ok, zero, scale, decay, b1, c1, b2, c2, step_size, bc2_sqrt, eps):
    grad = tl.load(g + idx, mask=ok, other=zero) / scale
    param = tl.load(p + idx, mask=ok, other=zero) * decay
    exp_avg = b1 * tl.load(m + idx, mask=ok, other=zero) + c1 * grad
    exp_avg_sq = b2 * tl.load(v + idx, mask=ok, other=zero) + c2 * grad * grad
    param -= step_size * exp_avg / (tl.sqrt(exp_avg_sq) / bc2_sqrt + eps)
    tl.store(m + idx, exp_avg, mask=ok)
    tl.store(v + idx, exp_avg_sq, mask=ok)
    tl.store(p + idx, param, mask=ok)
    tl.store(low + idx, cast_to(param, tl.bfloat16), mask=has_low if ok is None else ok & has_low)


@triton.jit
def _adamw(base, table, chunks, clip, BLOCK: tl.constexpr, PASSES: tl.constexpr):
    row, start, n = _row(table, chunks, BLOCK * PASSES)
    p = _tensor(base, row, _P)
    g = _tensor(base, row, _G)
    m = _tensor(base, row, _M)
    v = _tensor(base, row, _V)
    # the low copy: its offset in bf16 elements from base, a multiple of 8 (16 bytes), plus 1; 0 where the row has
    # none (then nothing is stored)
    low_word = tl.load(row + _LOW)
    has_low = low_word != 0
    low = base.to(tl.pointer_type(tl.bfloat16)) + tl.multiple_of(tl.where(has_low, low_word - 1, 0), 8)
    # the group's hyperparameters and the bias corrections in float64, as torch's fused AdamW forms them
    lr = tl.load(row + _LR).to(tl.float64, bitcast=True)
    beta1 = tl.load(row + _BETA1).to(tl.float64, bitcast=True)
    beta2 = tl.load(row + _BETA2).to(tl.float64, bitcast=True)
    step = tl.load(base + tl.load(row + _STEP)).to(tl.float64)   # already counted for this step
    bc1 = 1.0 - tl.exp(step * tl.log(beta1))
    step_size = (lr / bc1).to(tl.float32)
    bc2_sqrt = tl.sqrt(1.0 - tl.exp(step * tl.log(beta2))).to(tl.float32)
    decay = tl.load(row + _DECAY).to(tl.float64, bitcast=True).to(tl.float32)
    eps = tl.load(row + _EPS).to(tl.float64, bitcast=True).to(tl.float32)
    b1, c1 = beta1.to(tl.float32), (1.0 - beta1).to(tl.float32)
    b2, c2 = beta2.to(tl.float32), (1.0 - beta2).to(tl.float32)
    scale = tl.load(clip + 1)
    if start + BLOCK * PASSES <= n:
        for i in tl.static_range(PASSES):
            _update(p, g, m, v, low, has_low, start + i * BLOCK + tl.arange(0, BLOCK), None, None, scale, decay, b1,
                    c1, b2, c2, step_size, bc2_sqrt, eps)
    else:
        for i in tl.static_range(PASSES):
            idx = start + i * BLOCK + tl.arange(0, BLOCK)
            _update(p, g, m, v, low, has_low, idx, idx < n, 0.0, scale, decay, b1, c1, b2, c2, step_size, bc2_sqrt,
                    eps)


def clipped_adamw(base: torch.Tensor, table: torch.Tensor, chunks: torch.Tensor, max_norm: float) -> torch.Tensor:
    """The clipped step over the table's rows (samu.ops.adamw builds it, step counters already advanced): returns
    [norm, divisor] (fp32, on base's device)."""
    C = chunks.shape[0]
    partial = base.new_empty(C)
    out = base.new_empty(2)
    launch(_sum_squares, (C,), base=base, table=table, chunks=chunks, partial=partial, BLOCK=BLOCK, PASSES=PASSES,
           num_warps=WARPS)
    launch(_clip, (1,), partial=partial, C=C, out=out, max_norm=float(max_norm), BLOCK=BLOCK, num_warps=WARPS)
    launch(_adamw, (C,), base=base, table=table, chunks=chunks, clip=out, BLOCK=BLOCK, PASSES=PASSES, num_warps=WARPS)
    return out
