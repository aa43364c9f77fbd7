"""RG-LRU Triton variants: torch.library custom ops, autograd, and their dispatch entries.

The forward and backward are registered as ``samu::rglru_fwd`` / ``samu::rglru_bwd`` with fake
implementations, so torch.compile traces a model through the mixer without a graph break and CUDA
graphs can capture it (the host code only allocates and launches; it never synchronises).

The forward saves for the backward only x (held by autograd anyway), the parameters and the
state entering every chunk, [B, ceil(L/K), D] fp32; gates are recomputed from x.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import triton

from samu.ops import dispatch
from samu.ops.rglru.triton_bwd import rglru_bwd
from samu.ops.rglru.triton_fwd import head_block, rglru_fwd

Tensor = torch.Tensor


@torch.library.custom_op("samu::rglru_fwd", mutates_args=())
def rglru_fwd_op(x: Tensor, w_a: Tensor, b_a: Tensor, w_x: Tensor, b_x: Tensor, a_param: Tensor,
                 initial_state: Optional[Tensor], c: float, K: int, G: int, num_warps: int, bwd_warps: int,
                 save_states: bool) -> tuple[Tensor, Tensor, Tensor]:
    return rglru_fwd(x, w_a, b_a, w_x, b_x, a_param, initial_state, c, K=K, G=G, save_states=save_states,
                     num_warps=num_warps)


@rglru_fwd_op.register_fake
def _(x, w_a, b_a, w_x, b_x, a_param, initial_state, c, K, G, num_warps, bwd_warps, save_states):
    B, L, D = x.shape
    f32 = dict(dtype=torch.float32)
    states = x.new_empty(B, triton.cdiv(L, K), D, **f32) if save_states else x.new_empty(0, **f32)
    return x.new_empty(B, L, D), x.new_empty(B, D, **f32), states


@torch.library.custom_op("samu::rglru_bwd", mutates_args=())
def rglru_bwd_op(dy: Tensor, dh_last: Optional[Tensor], x: Tensor, w_a: Tensor, b_a: Tensor, w_x: Tensor,
                 b_x: Tensor, a_param: Tensor, has_h0: bool, states: Tensor, c: float, K: int, G: int,
                 num_warps: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    dx, dw_a, db_a, dw_x, db_x, da, dh0 = rglru_bwd(dy, dh_last, x, w_a, b_a, w_x, b_x, a_param, has_h0, states,
                                                    c, K=K, G=G, num_warps=num_warps)
    return dx, dw_a, db_a, dw_x, db_x, da, (dh0 if has_h0 else x.new_empty(0, dtype=torch.float32))


@rglru_bwd_op.register_fake
def _(dy, dh_last, x, w_a, b_a, w_x, b_x, a_param, has_h0, states, c, K, G, num_warps):
    B, L, D = x.shape
    f32 = dict(dtype=torch.float32)
    return (x.new_empty(B, L, D), torch.empty_like(w_a), torch.empty_like(b_a), torch.empty_like(w_x),
            torch.empty_like(b_x), torch.empty_like(a_param),
            x.new_empty(B, D, **f32) if has_h0 else x.new_empty(0, **f32))


def _setup_context(ctx, inputs, output):
    x, w_a, b_a, w_x, b_x, a_param, initial_state, c, K, G, num_warps, bwd_warps, save_states = inputs
    ctx.save_for_backward(x, w_a, b_a, w_x, b_x, a_param, output[2])
    ctx.has_h0 = initial_state is not None
    ctx.config = (save_states, c, K, G, bwd_warps)
    ctx.mark_non_differentiable(output[2])


def _backward(ctx, dy, dh_last, _dstates):
    x, w_a, b_a, w_x, b_x, a_param, states = ctx.saved_tensors
    save_states, c, K, G, bwd_warps = ctx.config
    if not save_states:
        raise RuntimeError("samu::rglru_fwd ran with save_states=False (no input required grad); "
                           "it kept no chunk states to differentiate")
    dy = torch.zeros_like(x) if dy is None else dy.contiguous()
    dh_last = None if dh_last is None else dh_last.float().contiguous()
    dx, dw_a, db_a, dw_x, db_x, da, dh0 = rglru_bwd_op(dy, dh_last, x, w_a, b_a, w_x, b_x, a_param, ctx.has_h0,
                                                       states, c, K, G, bwd_warps)
    return dx, dw_a, db_a, dw_x, db_x, da, (dh0 if ctx.has_h0 else None), None, None, None, None, None, None


rglru_fwd_op.register_autograd(_backward, setup_context=_setup_context)


@dataclass(frozen=True)
class Config:
    """Launch settings of one variant; K and the grouping rule fix its numerics.

    K: chunk length (a power of two >= 16). grouped=False: one program per (batch row, head) sweeps
    every chunk in order (no summaries). grouped=True: the chunks are split into NG groups, one
    program each; group summaries, a prefix over groups folded into the replay, and the same in
    reverse for the backward. NG aims at ``target_programs`` programs, at most ``max_groups``.
    """

    K: int = 64
    grouped: bool = True
    target_programs: int = 264
    max_groups: int = 64
    fwd_warps: int = 4
    bwd_warps: int = 8

    def chunks_per_program(self, B: int, H: int, L: int) -> int:
        n_chunks = triton.cdiv(L, self.K)
        if not self.grouped:
            return n_chunks
        n_groups = min(n_chunks, self.max_groups, max(1, triton.cdiv(self.target_programs, B * H)))
        return triton.cdiv(n_chunks, n_groups)


def run(x, w_a, b_a, w_x, b_x, a_param, initial_state, c, config: Config):
    """Differentiable RG-LRU forward with one Triton configuration: (y [B, L, D] x.dtype, h [B, D] fp32)."""
    params = [p.float().contiguous() for p in (w_a, b_a, w_x, b_x, a_param)]
    h0 = None if initial_state is None else initial_state.float().contiguous()
    needs_grad = torch.is_grad_enabled() and any(
        t.requires_grad for t in (x, *params, h0) if t is not None)
    B, L, _ = x.shape
    G = config.chunks_per_program(B, w_a.shape[0], L)
    y, h, _ = rglru_fwd_op(x.contiguous(), *params, h0, float(c), config.K, G, config.fwd_warps, config.bwd_warps,
                           needs_grad)
    return y, h


def scratch(config: Config):
    """Analytic transient scratch of one forward+backward, excluding y, dx and the gradients."""
    def formula(B: int, L: int, D: int, H: int = 16):
        n = D // H
        BN = head_block(n)
        NC = triton.cdiv(L, config.K)
        NG = triton.cdiv(NC, config.chunks_per_program(B, H, L))
        words = (B * NC * D                                    # chunk-entering states, fp32
                 + (4 * B * NG * D if NG > 1 else 0)           # group summaries, forward and reverse
                 + B * NG * (2 * H * n * n + 3 * D)            # parameter-gradient partials
                 + 3 * (4 * H * BN * BN // 2 + 2 * H * BN))    # split weights (fwd, bwd, bwd^T)
        text = (f"4*B*D*ceil(L/{config.K}) + 16*B*D*NG + 4*B*NG*(2*D^2/H + 3*D) + 24*H*BN^2 + 24*H*BN"
                f" with NG={NG}, BN={BN}" + ("" if NG > 1 else " (no summaries at NG=1)"))
        return text, 4 * words
    return formula


SERIAL = Config(K=64, grouped=False)
GROUPED = Config(K=64, grouped=True)


def _serial_preference(B: int, L: int, D: int) -> float:
    # a sweep per (batch row, head) fills the GPU only with many rows, or has little to walk
    return 0.5 if B * 16 >= 256 or triton.cdiv(L, SERIAL.K) <= 2 else 2.0


def _register(name, config, preference, description):
    return dispatch.register(dispatch.Variant(
        op="rglru", name=name,
        run=lambda x, w_a, b_a, w_x, b_x, a_param, h0, c: run(x, w_a, b_a, w_x, b_x, a_param, h0, c, config),
        preference=preference, scratch=lambda B, L, D: scratch(config)(B, L, D), description=description))


_register("triton_serial", SERIAL, _serial_preference,
          "chunks of 64 tokens; one program per (batch row, head) sweeps all chunks in order")
_register("triton_grouped", GROUPED, lambda B, L, D: 1.0,
          "chunks of 64 tokens in up to 64 groups: group summaries, prefix over groups, replay; "
          "reverse summaries and prefix for the adjoint")
