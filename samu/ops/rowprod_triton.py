"""Decoding's row products in Triton: y = pro(x) W^T + b (+ residual) for one row x, or a few (up to 64), one
launch each.

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

Above one row (``_rows_product``) a program owns BN outputs of every row and multiplies on tensor cores: the
prologue's values and the weights in their dtype, the products summed in fp32. Decoding takes it up to MAX_ROWS
rows, 1 as committed: it is exact in the interpreter and compiles for sm_90 without a spill, but is untimed on a
GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import cuda as tlc

from samu.ops.triton_utils import (_PDL_WAIT, NO_WAIT, PDL_WAIT, cast_to, cdiv, dot_exact, gelu_gate, inv_rms,
                                   launch, next_power_of_2, pdl, prefetch_l2)

WARPS = 4
PLAIN, NORM, GEGLU = 0, 1, 2
# whether a program asks L2 for all its weight rows before the wait (_row_product's PF): off until timed on a GPU
PREFETCH = False
LINE_BYTES = 128   # an L2 cache line
# the most rows decoding runs on these products (ResidualLayer.takes_row_products): above one row, _rows_product
# on tensor cores, which is untimed on a GPU, so 1 until a run shows it faster than cuBLAS's products at 8 and 64 rows
MAX_ROWS = 1
ROWS_LIMIT = 64    # what _rows_product is built and tested for (its [BM, BK] tiles of x)


@triton.jit
def line_offsets(rows, N, K, PF: tl.constexpr, LINE: tl.constexpr):
    """[BN, PF] int64 offsets into an [N, K] weight of one element in each LINE-element cache line of ``rows``, for
    a prefetch, which takes no mask: clamped to each row's last element and to the last row."""
    lines = tl.minimum(tl.arange(0, PF) * LINE, K - 1)
    return tl.minimum(rows, N - 1)[:, None].to(tl.int64) * K + lines[None, :]


@triton.jit
def _prologue(x, c, mask, nw, c_nw, mask_nw, rstd, K, PRO: tl.constexpr, dt: tl.constexpr):
    """pro(x) in fp32 at offsets c from x (GEGLU: the gate half, the up half K further on), rounded to dt where
    the unfused ops round: PLAIN x; NORM RMSNorm(x) * nw (scale rstd, the norm weight nw at offsets c_nw); GEGLU
    gelu_tanh(gate) * up (gelu_gate). Any shape: the one-row kernel's [BK] tile, or [BM, BK] rows (x a [BM, 1]
    pointer) with c_nw and rstd broadcast."""
    if PRO == 2:
        gate = tl.load(x + c, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x + K + c, mask=mask, other=0.0).to(tl.float32)
        return gelu_gate(gate, up, dt)
    elif PRO == 1:
        v = tl.load(x + c, mask=mask, other=0.0).to(tl.float32)
        return cast_to(v * rstd * tl.load(nw + c_nw, mask=mask_nw, other=0.0).to(tl.float32), dt).to(tl.float32)
    else:
        return tl.load(x + c, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _row_product(w, b, x, res, nw, y, N, K, eps, BN: tl.constexpr, BK: tl.constexpr, KP: tl.constexpr,
                 PRO: tl.constexpr, HAS_RES: tl.constexpr, WAIT: tl.constexpr, PF: tl.constexpr, LINE: tl.constexpr):
    """y[rows] = W[rows] @ pro(x) + b[rows] (+ res[rows]) for one row x and this program's BN rows of W. PRO:
    PLAIN x [K]; NORM RMSNorm(x) * nw, x [K]; GEGLU gelu_tanh(gate) * up, x = [gate | up] [2K]. What x and res
    come from is waited for after the first weight tile's load (WAIT: triton_utils.NO_WAIT or PDL_WAIT). With
    PF > 0 the program first asks L2 for its rows' PF cache lines of LINE elements each (a power of two >= the
    lines of a row), so that under PDL its whole share of the weights streams in while the kernel before
    finishes: no value changes."""
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    mask_n = rows < N
    p_w = w + rows[:, None].to(tl.int64) * K
    # the first weight tile before the wait: weights do not depend on the work before, so their loads overlap it
    cols = tl.arange(0, BK)
    wt = tl.load(p_w + cols[None, :], mask=mask_n[:, None] & (cols < K)[None, :], other=0.0)
    if PF > 0:
        prefetch_l2(w + line_offsets(rows, N, K, PF, LINE))
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
        xv = _prologue(x, cols, mk, nw, cols, mk, rstd, K, PRO, dt)
        acc += w_cur.to(tl.float32) * xv[None, :]
    out = tl.sum(acc, axis=1) + tl.load(b + rows, mask=mask_n, other=0.0).to(tl.float32)
    if HAS_RES:
        out += tl.load(res + rows, mask=mask_n, other=0.0).to(tl.float32)
    tl.store(y + rows, cast_to(out, dt), mask=mask_n)


@triton.jit
def _rows_product(w, b, x, res, nw, y, M, N, K, eps, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                  PRO: tl.constexpr, HAS_RES: tl.constexpr, WAIT: tl.constexpr):
    """_row_product for M <= BM rows on tensor cores: y[:M, cols] = pro(x) W[cols]^T + b[cols] (+ res[:M, cols]) for
    this program's BN outputs ``cols``, x [M, K] ([M, 2K] with GEGLU), res and y [M, N]. The same waits, prologues
    and roundings, but each row's RMSNorm scale is summed in BK-wide pieces (a first pass over its K entries), so
    a row's bits may differ from the one-row kernel's by the order of that sum."""
    cols = tl.program_id(0) * BN + tl.arange(0, BN)
    mask_n = cols < N
    p_w = w + cols[:, None].to(tl.int64) * K
    ks = tl.arange(0, BK)
    wt = tl.load(p_w + ks[None, :], mask=mask_n[:, None] & (ks < K)[None, :], other=0.0)   # [BN, BK]
    if WAIT == _PDL_WAIT:
        tlc.gdc_wait()
        tlc.gdc_launch_dependents()
    dt = y.dtype.element_ty
    r = tl.arange(0, BM)
    mask_m = r < M
    p_x = x + r[:, None].to(tl.int64) * (2 * K if PRO == 2 else K)   # [BM, 1]
    rstd = tl.full([BM], 1.0, tl.float32)
    if PRO == 1:
        squares = tl.zeros([BM], dtype=tl.float32)
        for k0 in range(0, K, BK):
            c = k0 + ks
            v = tl.load(p_x + c[None, :], mask=mask_m[:, None] & (c < K)[None, :], other=0.0).to(tl.float32)
            squares += tl.sum(v * v, axis=1)
        rstd = 1.0 / tl.sqrt(squares / K + eps)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        c = k0 + ks
        mk = c < K
        m2 = mask_m[:, None] & mk[None, :]
        w_cur = wt
        wt = tl.load(p_w + (c + BK)[None, :], mask=mask_n[:, None] & (c + BK < K)[None, :], other=0.0)
        xv = _prologue(p_x, c[None, :], m2, nw, c[None, :], mk[None, :], rstd[:, None], K, PRO, dt).to(dt)
        # x' and W in their dtype, their products summed in fp32
        acc = dot_exact(xv, tl.trans(w_cur), acc)   # [BM, BN]
    out = acc + tl.load(b + cols, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    at = r[:, None].to(tl.int64) * N + cols[None, :]   # [BM, BN]
    m_out = mask_m[:, None] & mask_n[None, :]
    if HAS_RES:
        out += tl.load(res + at, mask=m_out, other=0.0).to(tl.float32)
    tl.store(y + at, cast_to(out, dt), mask=m_out)


def rows_tiles(M: int, N: int, K: int) -> tuple:
    """(BM, BN, BK, warps) of a product of M rows (2 to ROWS_LIMIT), N outputs, K inputs on tensor cores: all the
    rows in one tile of at least 16, BN = 16 outputs a program (32 for the widest products at 64 rows), BK = 64 at
    64 rows. At the 400m preset's products they take 40-108 registers and no stack on sm_90
    (results/dev/session27/offline/rowprod_regs.txt). A first guess, untimed: every program re-reads x from L2
    (one [M, K] each), which at 64 rows outweighs the weights it streams."""
    BM = max(16, next_power_of_2(M))
    BN = 16 if BM <= 16 or N < 4096 else 32
    return BM, BN, 64 if BM >= 64 else 128, WARPS


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
    """[M, N] = pro(x) W^T + bias (+ residual) for M <= ROWS_LIMIT rows x [M, K] ([M, 2K] with ``geglu``), weight
    [N, K]: ``norm`` = (norm weight [K], eps) applies RMSNorm to each row first, ``geglu`` GeLU_tanh(gate) * up of
    x's two halves; everything contiguous and in one dtype (unchecked: ResidualLayer.takes_row_products decides)."""
    N, K = weight.shape
    M = x.shape[0]
    if not 1 <= M <= ROWS_LIMIT:
        raise ValueError(f"x must have 1 to {ROWS_LIMIT} rows, got {M}")
    y = x.new_empty(M, N)
    pro = GEGLU if geglu else NORM if norm is not None else PLAIN
    nw, eps = norm if norm is not None else (None, 0.0)
    options = pdl(x.device)
    if M > 1:
        BM, BN, BK, warps = rows_tiles(M, N, K)
        launch(_rows_product, (cdiv(N, BN),), w=weight, b=bias, x=x, res=residual, nw=nw, y=y, M=M, N=N, K=K,
               eps=float(eps), BM=BM, BN=BN, BK=BK, PRO=pro, HAS_RES=residual is not None,
               WAIT=PDL_WAIT if options else NO_WAIT, num_warps=warps, **options)
        return y
    BN, BK = tiles(N, K, pro)
    line = LINE_BYTES // weight.element_size()
    launch(_row_product, (cdiv(N, BN),), w=weight, b=bias, x=x, res=residual, nw=nw, y=y, N=N, K=K, eps=float(eps),
           BN=BN, BK=BK, KP=next_power_of_2(K) if pro == NORM else 1, PRO=pro, HAS_RES=residual is not None,
           WAIT=PDL_WAIT if options else NO_WAIT, PF=next_power_of_2(cdiv(K, line)) if PREFETCH else 0, LINE=line,
           num_warps=WARPS, **options)
    return y
