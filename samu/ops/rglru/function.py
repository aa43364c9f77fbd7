"""RG-LRU Triton variants: torch.library custom ops, autograd, and their dispatch entries.

The forward and backward are registered as ``samu::rglru_fwd`` / ``samu::rglru_bwd`` with fake
implementations, so torch.compile traces a model through the mixer without a graph break and CUDA
graphs can capture it (the host code only allocates and launches; it never synchronises). Eager
calls go through ``_Eager``, the same kernels without the custom-op dispatch layers (host time).

The forward saves for the backward only x (held by autograd anyway), the parameters, the state
entering every chunk, [B, ceil(L/K), D] fp32, and the gate weights' bf16 parts (split_weights, 12·H·NPW² bytes, so that
the backward splits nothing again); packed calls also the offsets and the initial state. Gates are recomputed from x.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from samu.ops import dispatch
from samu.ops.packing import state_rows
from samu.ops.packing_triton import chunk_boundaries
from samu.ops.rglru.triton_bwd import rglru_bwd
from samu.ops.rglru.triton_fwd import MAX_GROUPS, channel_block, rglru_fwd, weight_width
from samu.ops.triton_utils import cdiv

Tensor = torch.Tensor


def _fwd_positional(x, w_a, b_a, w_x, b_x, a_param, initial_state, cu_seqlens, c, K, WC, G, fast, want_final):
    """(y, h, states, w3); without ``want_final`` h is an empty [0, D] tensor (an op returns tensors), and the kernels
    skip the final state."""
    words, n_seqs = (None, None) if cu_seqlens is None else (chunk_boundaries(cu_seqlens, x.shape[1], K),
                                                             len(cu_seqlens) - 1)
    y, h, states, w3 = rglru_fwd(x, w_a, b_a, w_x, b_x, a_param, initial_state, c, K=K, WC=WC, G=G, fast=fast,
                                 words=words, n_seqs=n_seqs, want_final=want_final)
    return y, (h if h is not None else x.new_empty(0, x.shape[2], dtype=torch.float32)), states, w3


@torch.library.custom_op("samu::rglru_fwd", mutates_args=())
def rglru_fwd_op(x: Tensor, w_a: Tensor, b_a: Tensor, w_x: Tensor, b_x: Tensor, a_param: Tensor,
                 initial_state: Optional[Tensor], cu_seqlens: Optional[Tensor], c: float, K: int, WC: int, G: int,
                 G_dx: int, WC_dx: int, fast: bool, want_final: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Forward with chunks of K tokens, WC chunks per step, G steps per program; returns the states and the weights'
    bf16 parts too (the backward's)."""
    return _fwd_positional(x, w_a, b_a, w_x, b_x, a_param, initial_state, cu_seqlens, c, K, WC, G, fast, want_final)


@rglru_fwd_op.register_fake
def _(x, w_a, b_a, w_x, b_x, a_param, initial_state, cu_seqlens, c, K, WC, G, G_dx, WC_dx, fast, want_final):
    B, L, D = x.shape
    H, n = w_a.shape[0], w_a.shape[1]
    f32 = dict(dtype=torch.float32)
    return (x.new_empty(B, L, D), x.new_empty(state_rows(x, cu_seqlens) if want_final else 0, D, **f32),
            x.new_empty(B, cdiv(L, K), D, **f32),
            x.new_empty(2, 3, H, weight_width(n), weight_width(n), dtype=torch.bfloat16))


def _bwd_positional(dy, dh_last, x, w_a, b_a, w_x, b_x, a_param, has_h0, states, w3, cu_seqlens, initial_state, c,
                    K, WC, G, G_dx, WC_dx, fast):
    words = None if cu_seqlens is None else chunk_boundaries(cu_seqlens, x.shape[1], K)
    return rglru_bwd(dy, dh_last, x, w_a, b_a, w_x, b_x, a_param, has_h0, states, c, K=K, WC=WC, G=G, G_dx=G_dx,
                     WC_dx=WC_dx, fast=fast, words=words, h0=initial_state, w3=w3)


@torch.library.custom_op("samu::rglru_bwd", mutates_args=())
def rglru_bwd_op(dy: Tensor, dh_last: Optional[Tensor], x: Tensor, w_a: Tensor, b_a: Tensor, w_x: Tensor,
                 b_x: Tensor, a_param: Tensor, has_h0: bool, states: Tensor, w3: Tensor, cu_seqlens: Optional[Tensor],
                 initial_state: Optional[Tensor], c: float, K: int, WC: int, G: int, G_dx: int, WC_dx: int,
                 fast: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Backward with the forward's chunking (``states`` holds the state entering every chunk, ``w3`` the weights'
    bf16 parts)."""
    dx, dw_a, db_a, dw_x, db_x, da, dh0 = _bwd_positional(dy, dh_last, x, w_a, b_a, w_x, b_x, a_param, has_h0,
                                                          states, w3, cu_seqlens, initial_state, c, K, WC, G, G_dx,
                                                          WC_dx, fast)
    return dx, dw_a, db_a, dw_x, db_x, da, (dh0 if has_h0 else x.new_empty(0, dtype=torch.float32))


@rglru_bwd_op.register_fake
def _(dy, dh_last, x, w_a, b_a, w_x, b_x, a_param, has_h0, states, w3, cu_seqlens, initial_state, c, K, WC, G, G_dx,
      WC_dx, fast):
    B, L, D = x.shape
    f32 = dict(dtype=torch.float32)
    return (x.new_empty(B, L, D), torch.empty_like(w_a), torch.empty_like(b_a), torch.empty_like(w_x),
            torch.empty_like(b_x), torch.empty_like(a_param),
            x.new_empty(state_rows(x, cu_seqlens), D, **f32) if has_h0 else x.new_empty(0, **f32))


def _save(ctx, x, w_a, b_a, w_x, b_x, a_param, initial_state, cu_seqlens, config, states, w3):
    # packed, the backward restarts each sequence from its initial state, so it is kept (else it is in states)
    kept = () if cu_seqlens is None else (cu_seqlens,) + (() if initial_state is None else (initial_state,))
    # an output the caller drops (training drops the final state) gets None, not zeros: the backward
    # then skips its cotangent (packed, a gather per token the kernels would do for nothing)
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(x, w_a, b_a, w_x, b_x, a_param, states, w3, *kept)
    ctx.has_h0 = initial_state is not None
    ctx.config = config


def _gradients(ctx, dy, dh_last, backward):
    """Input and parameter gradients from the saved context, with ``backward`` = the op or ``_bwd_positional``."""
    x, w_a, b_a, w_x, b_x, a_param, states, w3, *kept = ctx.saved_tensors
    cu_seqlens, initial_state = (kept + [None, None])[:2]
    dy = torch.zeros_like(x) if dy is None else dy.contiguous()
    dh_last = None if dh_last is None else dh_last.float().contiguous()
    dx, dw_a, db_a, dw_x, db_x, da, dh0 = backward(dy, dh_last, x, w_a, b_a, w_x, b_x, a_param, ctx.has_h0, states,
                                                   w3, cu_seqlens, initial_state, *ctx.config)
    return dx, dw_a, db_a, dw_x, db_x, da, (dh0 if ctx.has_h0 else None), None


def _setup_context(ctx, inputs, output):
    *tensors, cu_seqlens, c, K, WC, G, G_dx, WC_dx, fast, _ = inputs
    _save(ctx, *tensors, cu_seqlens, (c, K, WC, G, G_dx, WC_dx, fast), output[2], output[3])
    ctx.mark_non_differentiable(output[2], output[3])


def _backward(ctx, dy, dh_last, _dstates, _dw3):
    return _gradients(ctx, dy, dh_last, rglru_bwd_op) + (None,) * 8


rglru_fwd_op.register_autograd(_backward, setup_context=_setup_context)


class _Eager(torch.autograd.Function):
    """The custom ops' forward and backward without their dispatch layers (host time per eager
    call); torch.compile traces the custom ops instead."""

    @staticmethod
    def forward(ctx, x, w_a, b_a, w_x, b_x, a_param, initial_state, cu_seqlens, c, K, WC, G, G_dx, WC_dx, fast,
                want_final):
        y, h, states, w3 = _fwd_positional(x, w_a, b_a, w_x, b_x, a_param, initial_state, cu_seqlens, c, K, WC, G,
                                           fast, want_final)
        _save(ctx, x, w_a, b_a, w_x, b_x, a_param, initial_state, cu_seqlens, (c, K, WC, G, G_dx, WC_dx, fast),
              states, w3)
        return y, h

    @staticmethod
    def backward(ctx, dy, dh_last):
        return _gradients(ctx, dy, dh_last, _bwd_positional) + (None,) * 8


@dataclass(frozen=True)
class Config:
    """Launch settings of one variant; K, WC and the steps per group (from target_programs and the
    shape) fix its numerics, and so do the dx kernel's warps (they choose its tensor-core instruction).

    K: chunk length (the tokens one thread walks; a power of two, WC * K >= 16); WC: chunks per
    program step, one per warp; WC_dx: the same for the dx kernel (0: see ``dx_chunks``). Programs take whole
    steps; the chunk-parallel kernels aim at ``target_programs`` programs in all. fast: hardware
    approximations of exp, reciprocal and square root (a few ulp) instead of libdevice.
    """

    K: int = 16
    WC: int = 4
    WC_dx: int = 0
    target_programs: int = 528
    fast: bool = True

    def __post_init__(self):
        # the gate products are tensor-core dots over a step's tokens, at least 16 deep on the GPU (the
        # interpreter would take fewer)
        for name, chunks in (("WC", self.WC), ("WC_dx", self.WC_dx or self.WC)):
            if self.K * chunks < 16:
                raise ValueError(f"{name}: K * {name} must be at least 16 (a step's tokens), got K = {self.K}, "
                                 f"{name} = {chunks}")

    def steps_per_program(self, B: int, L: int, tiles: int, grouped: bool = True, WC: int = 0) -> int:
        """Steps of WC chunks (default self.WC) per program when ``tiles`` programs share each batch
        row's steps; grouped programs (those that carry compositions) are at most MAX_GROUPS per row
        and tile. Groups are counted with a floor, so a launch has at most target_programs programs
        (528 = two whole waves where two programs fit a multiprocessor, of 132) rather than a partial
        third wave (results/dev/issue13/ncu_1), or one group per row and tile where B * tiles exceeds
        target_programs."""
        n_steps = cdiv(cdiv(L, self.K), WC or self.WC)
        n_groups = max(1, min(n_steps, self.target_programs // (B * tiles)))
        if grouped:
            n_groups = min(n_groups, MAX_GROUPS)
        return cdiv(n_steps, n_groups)


def dx_chunks(config: Config, n: int, dtype: torch.dtype) -> int:
    """Chunks per step (= warps) of the dx kernel: config.WC_dx, else WC, except 2 for fp32 inputs
    at head dims above 128. There Triton 3.6 miscompiles the 4-warp (wgmma) form of the fp32 input
    gradient's mid x mid part product: dx came out wrong by 190% at (1, 2100, 2560) and memcheck
    finds an out-of-range shared read at that tl.dot, while 2 warps (mma.sync) are exact (H200,
    scripts/gpu_diag.py, results/dev/gpu_diag_1.json)."""
    if config.WC_dx:
        return config.WC_dx
    return 2 if dtype == torch.float32 and n > 128 else config.WC


def run(x, w_a, b_a, w_x, b_x, a_param, initial_state, c, config: Config, cu_seqlens=None, final: bool = True):
    """Differentiable RG-LRU forward with one Triton configuration: (y [B, L, D] x.dtype, h [B, D] fp32, or None
    without ``final``). ``cu_seqlens``: a checked int32 device tensor of packed offsets (B = 1; states [N, D])."""
    B, L, D = x.shape
    H = w_a.shape[0]
    n = D // H
    params = [p.float().contiguous() for p in (w_a, b_a, w_x, b_x, a_param)]
    h0 = None if initial_state is None else initial_state.float().contiguous()
    G = config.steps_per_program(B, L, H * cdiv(n, channel_block(n)))
    WC_dx = dx_chunks(config, n, x.dtype)
    G_dx = config.steps_per_program(B, L, H, grouped=False, WC=WC_dx)
    args = (x.contiguous(), *params, h0, cu_seqlens, float(c), config.K, config.WC, G, G_dx, WC_dx, config.fast,
            bool(final))
    if torch.compiler.is_compiling():
        y, h, *_ = rglru_fwd_op(*args)
    else:
        y, h = _Eager.apply(*args)
    return y, (h if final else None)


def _group_steps(config: Config, B: int, L: int, D: int, H: int) -> int:
    """Steps per group of the chunk-parallel kernels at this shape: with K and WC, what fixes the
    variant's parenthesisation. (The number of groups only lengthens the sequence of groups: the
    folds over group maps run on a fixed width, where groups not present are exact identities.)"""
    n = D // H
    return config.steps_per_program(B, L, H * cdiv(n, channel_block(n)))


def _groups(config: Config, B: int, L: int, D: int, H: int) -> int:
    """Groups of steps per batch row (and channel tile) at this shape."""
    return cdiv(cdiv(cdiv(L, config.K), config.WC), _group_steps(config, B, L, D, H))


def scratch(config: Config):
    """Analytic transient scratch of one forward+backward, excluding y, dx and the gradients.

    The dispatch table gives (B, L, D) only; H = 16 heads unless given.
    """
    def formula(B: int, L: int, D: int, H: int = 16):
        n = D // H
        NPW = weight_width(n)
        NC = cdiv(L, config.K)
        NG = _groups(config, B, L, D, H)
        words = (2 * B * NC * D                    # states (forward) and adjoint states (backward)
                 + 2 * B * NC * D                  # per-chunk maps from the group's start (one pass at a time)
                 + 2 * B * NG * D                  # per-group maps
                 + B * NG * (2 * H * n * n + 3 * D)  # weight-gradient partials
                 + 3 * H * NPW * NPW)              # bf16 weight parts (6 x 2 bytes per padded weight)
        text = (f"16*B*D*ceil(L/{config.K}) + 8*B*D*NG + 4*B*NG*(2*D^2/H + 3*D) + 12*H*NPW^2"
                f" with H={H}, NPW={NPW}, NG={NG} groups per batch row")
        return text, 4 * words
    return formula


# the run that gated every class of the current numerics (the p records, 44417dd; the same bits since)
GATED_SINCE = "2026-12-04T17:25:57Z"
# the run that gated the packed classes after steps without an opening took the unpacked code (session 23: packed
# bits moved, unpacked ones the same; results/gates/2026-12-05-h200-gates-r-rglru-*-packed.json)
PACKED_GATED_SINCE = "2026-12-05T03:13:02Z"


def _register(name, config, score, description):
    return dispatch.register(dispatch.Variant(
        op="rglru", name=name,
        run=lambda x, w_a, b_a, w_x, b_x, a_param, h0, c, cu_seqlens=None, final=True: run(
            x, w_a, b_a, w_x, b_x, a_param, h0, c, config, cu_seqlens, final),
        packs=True, drops_final=True, gated_since=GATED_SINCE, packed_gated_since=PACKED_GATED_SINCE,
        preference=lambda B, L, D, H: score if D % H == 0 else None,
        scratch=lambda B, L, D: scratch(config)(B, L, D), description=description,
        settings=lambda B, L, D, H, dtype: (f"{config}, H={H}, {_groups(config, B, L, D, H)} groups of "
                                            f"{_group_steps(config, B, L, D, H)} steps per batch row, "
                                            f"{dx_chunks(config, D // H, dtype)} chunks per dx step"),
        numerics=lambda B, L, D, H, dtype: _numerics(config, B, L, D, H, dtype)))


def _numerics(config: Config, B: int, L: int, D: int, H: int, dtype: torch.dtype) -> str:
    # chunk length, chunks per step, the head dim (tile shapes, weight parts), the steps per group
    # and, where they differ from WC, the dx kernel's warps
    text = f"K={config.K},WC={config.WC},n={D // H},G={_group_steps(config, B, L, D, H)}"
    WC_dx = dx_chunks(config, D // H, dtype)
    return text + (f",WCdx={WC_dx}" if WC_dx != config.WC else "")


CHUNKED = Config()
CHUNKED_PRECISE = Config(fast=False)

_register("triton_chunked", CHUNKED, 1.0,
          "chunks of 16 tokens, 4 per step (one per warp), up to 64 groups of steps: group maps, a fold "
          "over groups, replay; the backward mirrors it and splits weight and input gradients; fast math")
_register("triton_chunked_precise", CHUNKED_PRECISE, 2.0,
          "as triton_chunked with libdevice exp/expm1 and correctly rounded division and square root")
