"""Decoding's one-row products in Triton: y = W pro(x) + b (+ residual) for a single row x, one launch each.

At batch 1 a decoding step is ~100 small kernels, each bound by its fixed cost (launch, ramp, tail) rather than
by the bytes it reads. These products fold the work between them into their prologues and epilogues, so a
layer is five launches (the in-projection with its RMSNorm, the block's step, the out-projection onto the
residual, gate_up with its RMSNorm, down with its GeGLU onto the residual) instead of eight, and on Hopper
(sm_90) and later they launch with programmatic dependent launch (PDL): a product may launch while the kernel
before it runs and waits (``gdc_wait``) only before it reads its input. Kernels of this shape measured alone
(results/dev/session9/scripts/pdl.py) took 12 such layers in 0.438 ms against 0.813 ms as PyTorch ops; this
kernel's first form, which loaded the weight tile after the prologue, made a real decode slower (0.739 against
0.568 ms a token, docs/performance.md "Decoding", v6).

A program owns BN output rows and walks the input in BK columns (``tiles``, timed for the 400m preset's four
products: results/dev/session11/call4). Its first weight tile is loaded before the wait for the kernel before
(under PDL that load overlaps the other kernel's tail; so no kernel just before a product may write its
weights: decoding's products follow other decoding kernels), and each later tile while the one before it is
used; the prologue's values are rounded to x's dtype where the unfused ops round (the norm's output, GeLU and
the gate's product), and the sum, bias and residual are rounded once. No PDL in Triton's interpreter, which runs
the same code.

Two variants lost in a graphed decode on an H100 (results/dev/session28/decode/) and were removed; they live at
commit a80780c: an L2 prefetch of each program's weight rows before its wait (0.531 against 0.475 ms a token at
batch 1), and tensor-core products above one row (2.478 ms a step at batch 8 against 0.652 on the forward's
cuBLAS products, 2.565 against 0.688 at batch 64), so decoding takes these products at batch 1 only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import cuda as tlc

from samu.ops.triton_utils import (_PDL_WAIT, NO_WAIT, PDL_WAIT, cast_to, cdiv, gelu_gate, inv_rms, launch,
                                   next_power_of_2, pdl)

WARPS = 4
PLAIN, NORM, GEGLU = 0, 1, 2


@triton.jit
def _row_product(w, b, x, res, nw, y, N, K, eps, BN: tl.constexpr, BK: tl.constexpr, KP: tl.constexpr,
                 PRO: tl.constexpr, HAS_RES: tl.constexpr, WAIT: tl.constexpr):
    """y[rows] = W[rows] @ pro(x) + b[rows] (+ res[rows]) for one row x and this program's BN rows of W. PRO:
    PLAIN x [K]; NORM RMSNorm(x) * nw, x [K]; GEGLU gelu_tanh(gate) * up, x = [gate | up] [2K]. What x and res
    come from is waited for after the first weight tile's load (WAIT: triton_utils.NO_WAIT or PDL_WAIT)."""
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    mask_n = rows < N
    p_w = w + rows[:, None].to(tl.int64) * K
    # the first weight tile before the wait: weights do not depend on the work before, so their loads overlap it
    cols = tl.arange(0, BK)
    wt = tl.load(p_w + cols[None, :], mask=mask_n[:, None] & (cols < K)[None, :], other=0.0)
    if WAIT == _PDL_WAIT:
        tlc.gdc_wait()               # the kernel before this one has finished and its writes are seen
        tlc.gdc_launch_dependents()  # the next one may launch now (it waits the same way)
    dt = y.dtype.element_ty
    rstd = 1.0
    if PRO == 1:
        ck = tl.arange(0, KP)
        whole = tl.load(x + ck, mask=ck < K, other=0.0).to(tl.float32)
        rstd = inv_rms(whole, K, eps)
    acc = tl.zeros([BN, BK], dtype=tl.float32)
    for k0 in range(0, K, BK):
        cols = k0 + tl.arange(0, BK)
        mk = cols < K
        # the next weight tile in flight while this one is used (past K: masked, no traffic)
        w_cur = wt
        wt = tl.load(p_w + (cols + BK)[None, :], mask=mask_n[:, None] & (cols + BK < K)[None, :], other=0.0)
        if PRO == 2:
            gate = tl.load(x + cols, mask=mk, other=0.0).to(tl.float32)
            up = tl.load(x + K + cols, mask=mk, other=0.0).to(tl.float32)
            xv = gelu_gate(gate, up, dt)
        elif PRO == 1:
            v = tl.load(x + cols, mask=mk, other=0.0).to(tl.float32)
            xv = cast_to(v * rstd * tl.load(nw + cols, mask=mk, other=0.0).to(tl.float32), dt).to(tl.float32)
        else:
            xv = tl.load(x + cols, mask=mk, other=0.0).to(tl.float32)
        acc += w_cur.to(tl.float32) * xv[None, :]
    out = tl.sum(acc, axis=1) + tl.load(b + rows, mask=mask_n, other=0.0).to(tl.float32)
    if HAS_RES:
        out += tl.load(res + rows, mask=mask_n, other=0.0).to(tl.float32)
    tl.store(y + rows, cast_to(out, dt), mask=mask_n)


def tiles(N: int, K: int, pro: int) -> tuple:
    """(BN, BK) of a product of N outputs over K inputs with prologue ``pro``. Timed in a graphed batch-1 decode
    of the 400m preset, each product's 9 tilings with the others at [8, 512] (results/dev/session11/call4,
    rowsweep.py): the out-projection (plain, N = K = 1664) 9.5 µs a token less at [8, 1024] (and at [4, 1024]);
    down (GeGLU, N = 1664, K = 4992) 41 µs less at [8, 1024]; gate_up (RMSNorm, N = 9984 = 6 K) 18 µs less at
    [16, 256]; the in-projection (RMSNorm, N = 2 K) within 1 µs at [8, 512] and [4, 512]. The sweep's best four
    together took 0.411 against 0.483 ms a token; this rule's four (two of them the ties) are yet to be timed."""
    if pro != NORM:
        return 8, 1024
    return (16, 256) if N >= 4 * K else (8, 512)


def row_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, *, norm=None, geglu: bool = False,
                residual: torch.Tensor | None = None) -> torch.Tensor:
    """[1, N] = W pro(x) + bias (+ residual) for one row x [1, K] ([1, 2K] with ``geglu``), weight [N, K]:
    ``norm`` = (norm weight [K], eps) applies RMSNorm to x first, ``geglu`` GeLU_tanh(gate) * up of x's two
    halves; everything contiguous and in one dtype (unchecked: ResidualLayer.takes_one_row decides)."""
    N, K = weight.shape
    if x.shape[0] != 1:
        raise ValueError(f"x must have one row, got {x.shape[0]}")
    y = x.new_empty(1, N)
    pro = GEGLU if geglu else NORM if norm is not None else PLAIN
    nw, eps = norm if norm is not None else (None, 0.0)
    BN, BK = tiles(N, K, pro)
    options = pdl(x.device)
    launch(_row_product, (cdiv(N, BN),), w=weight, b=bias, x=x, res=residual, nw=nw, y=y, N=N, K=K, eps=float(eps),
           BN=BN, BK=BK, KP=next_power_of_2(K) if pro == NORM else 1, PRO=pro, HAS_RES=residual is not None,
           WAIT=PDL_WAIT if options else NO_WAIT, num_warps=WARPS, **options)
    return y
