"""RG-LRU Triton variants: torch.library custom ops, autograd, and their dispatch entries.

The forward and backward are registered as ``samu::rglru_fwd`` / ``samu::rglru_bwd`` with fake
implementations, so torch.compile traces a model through the mixer without a graph break and CUDA
graphs can capture it (the host code only allocates and launches; it never synchronises).

The forward saves for the backward only x (held by autograd anyway), the parameters and the
state entering every backward chunk, [B, ceil(L/K_bwd), D] fp32; gates are recomputed from x.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import torch
import triton

from samu.ops import dispatch
from samu.ops.rglru.triton_bwd import rglru_bwd
from samu.ops.rglru.triton_fwd import MAX_GROUPS, head_block, rglru_fwd

Tensor = torch.Tensor


@torch.library.custom_op("samu::rglru_fwd", mutates_args=())
def rglru_fwd_op(x: Tensor, w_a: Tensor, b_a: Tensor, w_x: Tensor, b_x: Tensor, a_param: Tensor,
                 initial_state: Optional[Tensor], c: float, K: int, S: int, G: int, num_warps: int,
                 G_bwd: int, bwd_warps: int, fast: bool, save_states: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Forward with chunk K, G chunks per program; saves the state every S tokens (the backward's chunk)."""
    return rglru_fwd(x, w_a, b_a, w_x, b_x, a_param, initial_state, c, K=K, G=G, save_states=save_states,
                     state_every=S, fast=fast, num_warps=num_warps)


@rglru_fwd_op.register_fake
def _(x, w_a, b_a, w_x, b_x, a_param, initial_state, c, K, S, G, num_warps, G_bwd, bwd_warps, fast, save_states):
    B, L, D = x.shape
    f32 = dict(dtype=torch.float32)
    states = x.new_empty(B, triton.cdiv(L, S), D, **f32) if save_states else x.new_empty(0, **f32)
    return x.new_empty(B, L, D), x.new_empty(B, D, **f32), states


@torch.library.custom_op("samu::rglru_bwd", mutates_args=())
def rglru_bwd_op(dy: Tensor, dh_last: Optional[Tensor], x: Tensor, w_a: Tensor, b_a: Tensor, w_x: Tensor,
                 b_x: Tensor, a_param: Tensor, has_h0: bool, states: Tensor, c: float, K: int, G: int,
                 num_warps: int, fast: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Backward with chunk K (the spacing of ``states``), G chunks per program."""
    dx, dw_a, db_a, dw_x, db_x, da, dh0 = rglru_bwd(dy, dh_last, x, w_a, b_a, w_x, b_x, a_param, has_h0, states,
                                                    c, K=K, G=G, fast=fast, num_warps=num_warps)
    return dx, dw_a, db_a, dw_x, db_x, da, (dh0 if has_h0 else x.new_empty(0, dtype=torch.float32))


@rglru_bwd_op.register_fake
def _(dy, dh_last, x, w_a, b_a, w_x, b_x, a_param, has_h0, states, c, K, G, num_warps, fast):
    B, L, D = x.shape
    f32 = dict(dtype=torch.float32)
    return (x.new_empty(B, L, D), torch.empty_like(w_a), torch.empty_like(b_a), torch.empty_like(w_x),
            torch.empty_like(b_x), torch.empty_like(a_param),
            x.new_empty(B, D, **f32) if has_h0 else x.new_empty(0, **f32))


def _setup_context(ctx, inputs, output):
    (x, w_a, b_a, w_x, b_x, a_param, initial_state, c, K, S, G, num_warps, G_bwd, bwd_warps, fast,
     save_states) = inputs
    ctx.save_for_backward(x, w_a, b_a, w_x, b_x, a_param, output[2])
    ctx.has_h0 = initial_state is not None
    ctx.config = (save_states, c, S, G_bwd, bwd_warps, fast)
    ctx.mark_non_differentiable(output[2])


def _backward(ctx, dy, dh_last, _dstates):
    x, w_a, b_a, w_x, b_x, a_param, states = ctx.saved_tensors
    save_states, c, S, G_bwd, bwd_warps, fast = ctx.config
    if not save_states:
        raise RuntimeError("samu::rglru_fwd ran with save_states=False (no input required grad); "
                           "it kept no chunk states to differentiate")
    dy = torch.zeros_like(x) if dy is None else dy.contiguous()
    dh_last = None if dh_last is None else dh_last.float().contiguous()
    dx, dw_a, db_a, dw_x, db_x, da, dh0 = rglru_bwd_op(dy, dh_last, x, w_a, b_a, w_x, b_x, a_param, ctx.has_h0,
                                                       states, c, S, G_bwd, bwd_warps, fast)
    return (dx, dw_a, db_a, dw_x, db_x, da, (dh0 if ctx.has_h0 else None)) + (None,) * 9


rglru_fwd_op.register_autograd(_backward, setup_context=_setup_context)


MAX_HEAD_BLOCK = 128


@dataclass(frozen=True)
class Config:
    """Launch settings of one variant; they fix its numerics.

    K, K_bwd: chunk lengths of the forward and the backward (powers of two >= 16; the forward saves
    the state every K_bwd tokens); 0 picks by the head's register tile BN (``resolve``).
    grouped=False: one program per (batch row, head) sweeps every chunk in order, no summaries.
    grouped=True: the chunks are split into up to MAX_GROUPS groups, one program each, aiming at
    ``target_programs`` programs: group summaries, a prefix over groups folded into the replay, and
    the same in reverse for the backward. fast: hardware approximations of exp, reciprocal and
    square root (a few ulp) instead of libdevice.
    """

    K: int = 64
    K_bwd: int = 0
    grouped: bool = True
    target_programs: int = 264
    fast: bool = True
    fwd_warps: int = 8
    bwd_warps: int = 0

    def resolve(self, BN: int) -> "Config":
        """Concrete settings for head tile BN: at BN = 128 the backward needs 64-row chunks (wgmma
        reads the transposed weights from the same shared-memory tiles) and 16 warps (the two
        [BN, BN] fp32 weight-gradient accumulators)."""
        return replace(self, K_bwd=self.K_bwd or (32 if BN <= 64 else 64),
                       bwd_warps=self.bwd_warps or (8 if BN <= 64 else 16))

    def chunks_per_program(self, B: int, H: int, L: int, K: int) -> int:
        n_chunks = triton.cdiv(L, K)
        if not self.grouped:
            return n_chunks
        n_groups = min(n_chunks, MAX_GROUPS, max(1, triton.cdiv(self.target_programs, B * H)))
        return triton.cdiv(n_chunks, n_groups)


def check_head_dim(n: int) -> None:
    if head_block(n) > MAX_HEAD_BLOCK:
        raise ValueError(f"the Triton RG-LRU kernels support head dims up to {MAX_HEAD_BLOCK} (D/H); got {n}. "
                         "Larger heads need weights and weight-gradient accumulators beyond one SM's "
                         "shared memory and registers; use backend='torch'")


def run(x, w_a, b_a, w_x, b_x, a_param, initial_state, c, config: Config):
    """Differentiable RG-LRU forward with one Triton configuration: (y [B, L, D] x.dtype, h [B, D] fp32)."""
    B, L, D = x.shape
    H = w_a.shape[0]
    check_head_dim(D // H)
    cfg = config.resolve(head_block(D // H))
    params = [p.float().contiguous() for p in (w_a, b_a, w_x, b_x, a_param)]
    h0 = None if initial_state is None else initial_state.float().contiguous()
    needs_grad = torch.is_grad_enabled() and any(
        t.requires_grad for t in (x, *params, h0) if t is not None)
    G = cfg.chunks_per_program(B, H, L, cfg.K)
    G_bwd = cfg.chunks_per_program(B, H, L, cfg.K_bwd)
    y, h, _ = rglru_fwd_op(x.contiguous(), *params, h0, float(c), cfg.K, cfg.K_bwd, G, cfg.fwd_warps,
                           G_bwd, cfg.bwd_warps, cfg.fast, needs_grad)
    return y, h


def scratch(config: Config):
    """Analytic transient scratch of one forward+backward, excluding y, dx and the gradients.

    The dispatch table gives (B, L, D) only; H = 16 heads unless given.
    """
    def formula(B: int, L: int, D: int, H: int = 16):
        n = D // H
        BN = head_block(n)
        config_ = config.resolve(BN)
        NS = triton.cdiv(L, config_.K_bwd)
        NGf = triton.cdiv(triton.cdiv(L, config_.K), config_.chunks_per_program(B, H, L, config_.K))
        NGb = triton.cdiv(NS, config_.chunks_per_program(B, H, L, config_.K_bwd))
        words = (B * NS * D                                    # states every K_bwd tokens, fp32
                 + (2 * B * NGf * D if NGf > 1 else 0)         # forward group summaries
                 + (2 * B * NGb * D if NGb > 1 else 0)         # reverse group summaries
                 + B * NGb * (2 * H * n * n + 3 * D)           # parameter-gradient partials
                 + 2 * (2 * H * BN * BN + 2 * H))              # split weights, forward and backward
        text = (f"4*B*D*ceil(L/{config_.K_bwd}) + 8*B*D*(NGf + NGb) + 4*B*NGb*(2*D^2/H + 3*D) + 16*H*BN^2 + 16*H"
                f" with H={H}, BN={BN}, NGf={NGf}, NGb={NGb} (no summaries where a count is 1)")
        return text, 4 * words
    return formula


SERIAL = Config(grouped=False)
GROUPED = Config(grouped=True)


def _fits(D: int, H: int = 16) -> bool:
    # dispatch sees (B, L, D); the modules' default is 16 heads
    return D % H == 0 and head_block(D // H) <= MAX_HEAD_BLOCK


def _serial_preference(B: int, L: int, D: int):
    if not _fits(D):
        return None
    # a sweep per (batch row, head) fills the GPU only with many rows, or has little to walk
    return 0.5 if B * 16 >= 256 or triton.cdiv(L, SERIAL.K) <= 2 else 2.0


def _grouped_preference(B: int, L: int, D: int):
    return 1.0 if _fits(D) else None


def _register(name, config, preference, description):
    return dispatch.register(dispatch.Variant(
        op="rglru", name=name,
        run=lambda x, w_a, b_a, w_x, b_x, a_param, h0, c: run(x, w_a, b_a, w_x, b_x, a_param, h0, c, config),
        preference=preference, scratch=lambda B, L, D: scratch(config)(B, L, D), description=description))


_register("triton_serial", SERIAL, _serial_preference,
          "forward chunks of 64 tokens, backward chunks of 32 (64 at head dims > 64); one program per "
          "(batch row, head) sweeps all chunks in order; head dims <= 128")
_register("triton_grouped", GROUPED, _grouped_preference,
          "forward chunks of 64 tokens, backward chunks of 32 (64 at head dims > 64), in up to 64 groups: "
          "group summaries, prefix over groups, replay; reverse summaries and prefix for the adjoint; "
          "head dims <= 128")
