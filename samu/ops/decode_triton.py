"""A decoded token's every layer in one launch at batch 1: the whole-token kernel.

At batch 1 each of a layer's five launches (samu.ops.rowprod_triton: the in-projection with its RMSNorm, the block's
step, the out-projection onto the residual, gate_up with its RMSNorm, down with the GeGLU gate onto the residual)
costs a few µs whatever it reads, and every product's weight stream starts and drains with its kernel: session 11
measured the 400m preset's products at 2.3 TB/s in a chain where 3,000 tokens/s needs them near 3.5
(docs/performance.md, "Decoding"). Here a fixed grid of programs takes the token's work as a queue of tasks, in the
order the launches ran: per layer the in-projection's row tiles, SAMU's step (STEP_MODES modes a task, each task
with the controller's sums over every mode), the out-projection's tiles (which shift the Conv1D state once the
step's tasks have read it), gate_up's, down's. A program claims the next task (an atomic counter), loads its first
weight tile, waits until the work its input comes from is done (a per-layer, per-piece counter of finished tasks,
``triton_utils.wait_for``), then computes and counts its task done (``signal``). So the next piece's weights stream
while the one before ends, with no launch between them.

A task waits only for tasks handed out before it, to programs that are running, so the queue cannot deadlock,
however many programs the GPU holds at once; in Triton's interpreter, where programs run one after another, the
first program takes every task in order and never waits. Each task runs the same device code as the per-layer
launches (``row_tile``, ``samu_row_step``), so a token has the same arithmetic as there; only the SAMU step's sums
over the modes may be split across a different number of warps. The last program to finish zeroes the counters for
the next launch.

Tensors reach the kernel as element offsets from two base pointers (one in the model's dtype, one fp32), a row of
``FIELDS`` a layer, each on a 16-byte boundary (``multiple_of``) so the weight loads stay 16-byte vectors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from samu.ops.rowprod_triton import GEGLU, NORM, PLAIN, WARPS, row_tile, tiles
from samu.ops.step_triton import conv_shift, samu_row_step
from samu.ops.triton_utils import _COUNT_WAIT, arrive, cdiv, launch, next_power_of_2, signal

# a layer's row of the table: offsets in the model's dtype (the products, norms, Conv1D and its state), then in fp32
# (SAMU's parameters and state)
(IN_W, IN_B, TN_W, CONV_W, CONV_B, CONV_S, OUT_W, OUT_B, MN_W, GU_W, GU_B, DN_W, DN_B,
 NU, THETA, DIRS, AMPS, H) = range(18)
FIELDS = 18
# the pieces of a layer's work, in the order they run: each has a counter of finished tasks a layer
PIECES = 5
# programs a multiprocessor (192 registers a thread at 4 warps, offline for sm_90: two fit)
PER_SM = 2
# SAMU modes a task of the step updates (the 400m preset's 832 in 7 tasks)
STEP_MODES = 128
(_IN_W, _IN_B, _TN_W, _CONV_W, _CONV_B, _CONV_S, _OUT_W, _OUT_B, _MN_W, _GU_W, _GU_B, _DN_W, _DN_B, _NU, _THETA, _DIRS,
 _AMPS, _H) = (tl.constexpr(f) for f in range(FIELDS))
_FIELDS, _PIECES = tl.constexpr(FIELDS), tl.constexpr(PIECES)
_PLAIN, _NORM, _GEGLU = (tl.constexpr(c) for c in (PLAIN, NORM, GEGLU))


@triton.jit
def _at(base, row, field, ALIGN: tl.constexpr):
    """base + the table row's offset for ``field``: ALIGN elements make 16 bytes, which every offset is a multiple
    of (so loads through it stay 16-byte vectors)."""
    return base + tl.multiple_of(tl.load(row + field), ALIGN)


@triton.jit
def _token_kernel(low, fp, table, xs, zs, gs, xas, hs, counts, NL, W, E, F, eps_t, eps_m, radial_bound,
                  T_IN: tl.constexpr, T_ST: tl.constexpr, T_OUT: tl.constexpr, T_GU: tl.constexpr, T_DN: tl.constexpr,
                  BN_IN: tl.constexpr, BK_IN: tl.constexpr, BN_OUT: tl.constexpr, BK_OUT: tl.constexpr,
                  BN_GU: tl.constexpr, BK_GU: tl.constexpr, BN_DN: tl.constexpr, BK_DN: tl.constexpr,
                  KP: tl.constexpr, BM: tl.constexpr, MB: tl.constexpr, SH: tl.constexpr, CK: tl.constexpr,
                  CP: tl.constexpr, LA: tl.constexpr):
    """Layer l reads xs[l] [W] and writes xs[l + 1]; zs [NL, 2E] (the in-projection), gs [NL, E] (the step),
    xas [NL, W] (after the out-projection), hs [NL, 2F] (gate_up) hold its pieces. counts [NL * PIECES + 2] int32:
    the finished tasks of each layer's pieces, then the queue's next task and the programs done."""
    queue = counts + NL * _PIECES
    per_layer = T_IN + T_ST + T_OUT + T_GU + T_DN
    t = tl.atomic_add(queue, 1, sem="relaxed", scope="gpu")
    while t < NL * per_layer:
        layer = t // per_layer
        r = t - layer * per_layer
        row = table + layer.to(tl.int64) * _FIELDS
        done = counts + layer * _PIECES
        x = xs + layer.to(tl.int64) * W
        xa = xas + layer.to(tl.int64) * W
        z = zs + layer.to(tl.int64) * 2 * E
        g = gs + layer.to(tl.int64) * E
        hh = hs + layer.to(tl.int64) * 2 * F
        if r < T_IN:
            # the layer's input is the layer before's down projection (layer 0's, the embedded token, is there)
            before = counts + tl.maximum(layer * _PIECES - 1, 0)
            w, b, nw = _at(low, row, _IN_W, LA), _at(low, row, _IN_B, LA), _at(low, row, _TN_W, LA)
            row_tile(w, b, x, None, nw, z, r, 2 * E, W, eps_t, BN_IN, BK_IN, KP, _NORM, False, _COUNT_WAIT, before,
                     tl.where(layer > 0, T_DN, 0))
            signal(done)
        elif r < T_IN + T_ST:
            # SAMU's step, MB modes a task, each with the controller's sums over all the modes (the same code and bits)
            nu, theta, dirs, amps = (_at(fp, row, _NU, 4), _at(fp, row, _THETA, 4), _at(fp, row, _DIRS, 4),
                                     _at(fp, row, _AMPS, 4))
            cw, cb, cs = _at(low, row, _CONV_W, LA), _at(low, row, _CONV_B, LA), _at(low, row, _CONV_S, LA)
            h = _at(fp, row, _H, 4)
            samu_row_step(z, nu, theta, dirs, amps, h, g, h, cw, cb, cs, 0, E // 2, 2 * E, radial_bound, BM, CK,
                          _COUNT_WAIT, done, T_IN, (r - T_IN) * MB, MB, False)
            signal(done + 1)
        elif r < T_IN + T_ST + T_OUT:
            t_out = r - T_IN - T_ST
            w, b = _at(low, row, _OUT_W, LA), _at(low, row, _OUT_B, LA)
            row_tile(w, b, g, x, None, xa, t_out, W, E, 0.0, BN_OUT, BK_OUT, 1, _PLAIN, True, _COUNT_WAIT, done + 1,
                     T_ST)
            # the step's tasks are done reading the Conv1D state: this task shifts SH channels of it
            ch = t_out * SH + tl.arange(0, SH)
            conv_shift(z, _at(low, row, _CONV_S, LA), 0, ch, ch < E, E, CK)
            signal(done + 2)
        elif r < T_IN + T_ST + T_OUT + T_GU:
            w, b, nw = _at(low, row, _GU_W, LA), _at(low, row, _GU_B, LA), _at(low, row, _MN_W, LA)
            row_tile(w, b, xa, None, nw, hh, r - T_IN - T_ST - T_OUT, 2 * F, W, eps_m, BN_GU, BK_GU, KP, _NORM, False,
                     _COUNT_WAIT, done + 2, T_OUT)
            signal(done + 3)
        else:
            w, b = _at(low, row, _DN_W, LA), _at(low, row, _DN_B, LA)
            row_tile(w, b, hh, xa, None, x + W, r - T_IN - T_ST - T_OUT - T_GU, W, F, 0.0, BN_DN, BK_DN, 1, _GEGLU,
                     True, _COUNT_WAIT, done + 3, T_GU)
            signal(done + 4)
        t = tl.atomic_add(queue, 1, sem="relaxed", scope="gpu")
    # every task is handed out; the last program out zeroes the counters (all the others have stopped reading them)
    if arrive(counts + NL * _PIECES + 1, tl.num_programs(0)):
        o = tl.arange(0, CP)
        tl.store(counts + o, tl.zeros([CP], dtype=tl.int32), mask=o < NL * _PIECES + 2)


def _offsets(tensors, base: torch.Tensor) -> list[int] | None:
    """Each tensor's element offset from ``base`` (all of base's dtype and device, contiguous), or None when base or
    one of them is not on a 16-byte boundary (the kernel's vector loads assume it)."""
    size = base.element_size()
    if base.data_ptr() % 16:
        return None
    out = []
    for t in tensors:
        gap = t.data_ptr() - base.data_ptr()
        if t.dtype != base.dtype or t.device != base.device or not t.is_contiguous() or gap % 16:
            return None
        out.append(gap // size)
    return out


class TokenKernel:
    """The whole-token kernel over one model's layers and one decoding state at batch 1 (module docstring).

    Made by ``make`` (None where it does not apply), over ``layers``: per layer its FIELDS tensors in the table's
    order (IN_W ... DN_B in the embedding's dtype, NU ... H fp32), each contiguous; ``eps``: the two norms'
    (temporal, MLP); ``radial_bound``: SAMU's; ``state``: what the state tensors among the fields came from, kept as
    ``state``. It binds those tensors: parameters replaced, moved or cast later need a new kernel (the Decoder's key
    holds every tensor's address). Called with a token [1], it writes the token's embedding, runs every layer
    (updating the state tensors in place) and returns the last layer's output [1, W], a view of a buffer the next
    call overwrites. ``grid``: its programs (one takes every task in order: the same bits, for tests)."""

    def __init__(self, embed: torch.Tensor, layers, table: torch.Tensor, eps, radial_bound: float, state=None):
        self.embed, self.layers, self.table, self.state = embed.detach(), layers, table, state
        w_in, w_gu = layers[0][IN_W], layers[0][GU_W]
        NL, W, E, F = len(layers), w_in.shape[1], w_in.shape[0] // 2, w_gu.shape[0] // 2
        kw = dict(dtype=embed.dtype, device=embed.device)
        self.xs = torch.empty(NL + 1, W, **kw)
        self.zs = torch.empty(NL, 2 * E, **kw)
        self.gs = torch.empty(NL, E, **kw)
        self.xas = torch.empty(NL, W, **kw)
        self.hs = torch.empty(NL, 2 * F, **kw)
        self.counts = torch.zeros(NL * PIECES + 2, dtype=torch.int32, device=embed.device)
        if embed.device.type == "cuda":
            self.grid = torch.cuda.get_device_properties(embed.device).multi_processor_count * PER_SM
        else:
            self.grid = 2
        (bn_in, bk_in), (bn_out, bk_out) = tiles(2 * E, W, NORM), tiles(W, E, PLAIN)
        (bn_gu, bk_gu), (bn_dn, bk_dn) = tiles(2 * F, W, NORM), tiles(W, F, GEGLU)
        bm = next_power_of_2(E // 2)
        mb, t_out = min(STEP_MODES, bm), cdiv(W, bn_out)
        self.args = dict(
            low=self.embed, fp=layers[0][NU], table=table, xs=self.xs, zs=self.zs, gs=self.gs, xas=self.xas,
            hs=self.hs, counts=self.counts, NL=NL, W=W, E=E, F=F, eps_t=float(eps[0]), eps_m=float(eps[1]),
            radial_bound=float(radial_bound), T_IN=cdiv(2 * E, bn_in), T_ST=cdiv(E // 2, mb), T_OUT=t_out,
            T_GU=cdiv(2 * F, bn_gu), T_DN=cdiv(W, bn_dn), BN_IN=bn_in, BK_IN=bk_in, BN_OUT=bn_out, BK_OUT=bk_out,
            BN_GU=bn_gu, BK_GU=bk_gu, BN_DN=bn_dn, BK_DN=bk_dn, KP=next_power_of_2(W), BM=bm, MB=mb,
            SH=next_power_of_2(cdiv(E, t_out)), CK=layers[0][CONV_W].shape[0], CP=next_power_of_2(NL * PIECES + 2),
            LA=16 // embed.element_size(), num_warps=WARPS)

    @classmethod
    def make(cls, embed: torch.Tensor, layers, eps, radial_bound: float, state=None) -> "TokenKernel | None":
        """The kernel over these layers, or None where it does not apply: one tensor off a 16-byte boundary or not
        contiguous, a dtype other than the embedding's (fp32 for SAMU's), layers of different sizes, a Conv1D
        wider than 4."""
        first = layers[0]
        if first[CONV_W].shape[0] > 4 or any(tuple(t.shape) != tuple(f.shape) for layer in layers
                                             for t, f in zip(layer, first)):
            return None
        fp_base = first[NU]
        low = _offsets([t for layer in layers for t in layer[:NU]], embed)
        fp = _offsets([t for layer in layers for t in layer[NU:]], fp_base)
        if low is None or fp is None or fp_base.dtype != torch.float32:
            return None
        per = FIELDS - NU
        rows = [low[i * NU:(i + 1) * NU] + fp[i * per:(i + 1) * per] for i in range(len(layers))]
        return cls(embed, layers, torch.tensor(rows, dtype=torch.int64, device=embed.device), eps, radial_bound, state)

    def __call__(self, token: torch.Tensor) -> torch.Tensor:
        torch.index_select(self.embed, 0, token, out=self.xs[:1])
        launch(_token_kernel, (self.grid,), **self.args)
        return self.xs[-1:]
