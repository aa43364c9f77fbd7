"""SAMU Triton variants: torch.library custom ops, autograd, and their dispatch entries.

The forward and backward are registered as ``samu::samu_fwd`` / ``samu::samu_bwd`` with fake
implementations, so torch.compile traces a model through the mixer without a graph break and
CUDA graphs can capture it (no host synchronisation inside; packed calls, whose offsets the public op
reads on the host, are refused under capture).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from samu.ops import dispatch
from samu.ops.packing import state_rows
from samu.ops.packing_triton import chunk_boundaries
from samu.ops.samu.triton_bwd import CONTROLLER_TOKENS, bwd, multiprocessors, slot_count
from samu.ops.samu.triton_fwd import CTL, fwd, prefix_counters
from samu.ops.triton_utils import cdiv, next_power_of_2

_empty = torch.empty


def set_allocator(empty) -> None:
    """Allocate kernel outputs with ``empty`` (tests pass one that fills NaN)."""
    global _empty
    _empty = empty


@dataclass(frozen=True)
class Config:
    """One launch configuration: chunk K, mode tile BN, chunks per group G (1: serial prefix), warps
    per program, programs per multiprocessor of the persistent main backward kernel, the unroll
    factor of every token walk (independent tokens in flight: instruction-level parallelism), and the
    main backward's own mode tile (0: BN)."""

    K: int
    BN: int
    G: int
    num_warps: int = 1
    slots_per_sm: int = 16
    unroll: int = 2
    main_BN: int = 0

    def as_list(self) -> list[int]:
        return [self.K, self.BN, self.G, self.num_warps, self.slots_per_sm, self.unroll, self.main_BN]


def _fwd(x, nu, theta_log, directions, amplitudes, initial_state, cu_seqlens, radial_bound, config, want_final):
    """The forward's outputs; without ``want_final`` the final state is an empty [0, D] tensor (an op returns
    tensors), and the kernels skip it."""
    c = Config(*config)
    words, n_seqs = (None, None) if cu_seqlens is None else (chunk_boundaries(cu_seqlens, x.shape[1], c.K),
                                                             len(cu_seqlens) - 1)
    y, final, ctl, rnorm, bound, count = fwd(x, nu, theta_log, directions, amplitudes, initial_state, radial_bound,
                                             K=c.K, BN=c.BN, G=c.G, num_warps=c.num_warps, unroll=c.unroll,
                                             empty=_empty, words=words, n_seqs=n_seqs, want_final=want_final)
    if final is None:
        final = x.new_empty(0, x.shape[2], dtype=torch.float32)
    return y, final, ctl, rnorm, bound, count


def _bwd(dy, dfinal, x, nu, theta_log, directions, amplitudes, has_h0, ctl, rnorm, bound, count, cu_seqlens,
         initial_state, radial_bound, config):
    c = Config(*config)
    words = None if cu_seqlens is None else chunk_boundaries(cu_seqlens, x.shape[1], c.K)
    return bwd(dy, dfinal, x, nu, theta_log, directions, amplitudes, has_h0, ctl, rnorm, bound, count, radial_bound,
               K=c.K, BN=c.BN, G=c.G, main_BN=c.main_BN, num_warps=c.num_warps, slots_per_sm=c.slots_per_sm,
               unroll=c.unroll, empty=_empty, words=words, h0=initial_state)


@torch.library.custom_op("samu::samu_fwd", mutates_args=())
def samu_fwd(x: torch.Tensor, nu: torch.Tensor, theta_log: torch.Tensor, directions: torch.Tensor,
             amplitudes: torch.Tensor, initial_state: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor],
             radial_bound: float, config: list[int], want_final: bool
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _fwd(x, nu, theta_log, directions, amplitudes, initial_state, cu_seqlens, radial_bound, config, want_final)


@samu_fwd.register_fake
def _(x, nu, theta_log, directions, amplitudes, initial_state, cu_seqlens, radial_bound, config, want_final):
    B, L, D = x.shape
    f32 = dict(device=x.device, dtype=torch.float32)
    c = Config(*config)
    return (x.new_empty(B, L, D), x.new_empty(state_rows(x, cu_seqlens) if want_final else 0, D, **f32),
            x.new_empty(B, CTL.value, L, **f32), x.new_empty(2, **f32), x.new_empty(B, cdiv(L, c.K), D, **f32),
            prefix_counters(B, L, D, K=c.K, BN=c.BN, G=c.G, device=x.device, empty=x.new_empty))


@torch.library.custom_op("samu::samu_bwd", mutates_args=())
def samu_bwd(dy: torch.Tensor, dfinal: Optional[torch.Tensor], x: torch.Tensor, nu: torch.Tensor,
             theta_log: torch.Tensor, directions: torch.Tensor, amplitudes: torch.Tensor, has_h0: bool,
             ctl: torch.Tensor, rnorm: torch.Tensor, bound: torch.Tensor, count: torch.Tensor,
             cu_seqlens: Optional[torch.Tensor], initial_state: Optional[torch.Tensor], radial_bound: float,
             config: list[int]
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    # the prefix counters go back to zero within the backward's launch: not a mutation seen from outside, as long as
    # one launch at a time uses them (triton_fwd.prefix_counters)
    dx, dnu, dtheta, ddir, damp, dh0 = _bwd(dy, dfinal, x, nu, theta_log, directions, amplitudes, has_h0, ctl,
                                            rnorm, bound, count, cu_seqlens, initial_state, radial_bound, config)
    return dx, dnu, dtheta, ddir, damp, dh0 if has_h0 else x.new_empty(0, dtype=torch.float32)


@samu_bwd.register_fake
def _(dy, dfinal, x, nu, theta_log, directions, amplitudes, has_h0, ctl, rnorm, bound, count, cu_seqlens,
      initial_state, radial_bound, config):
    B, L, D = x.shape
    f32 = dict(device=x.device, dtype=torch.float32)
    return (x.new_empty(B, L, D), x.new_empty(D // 2, **f32), x.new_empty(D // 2, **f32),
            x.new_empty(2, D, **f32), x.new_empty(2, 2, **f32),
            x.new_empty(state_rows(x, cu_seqlens), D, **f32) if has_h0 else x.new_empty(0, **f32))


def _save(ctx, x, nu, theta_log, directions, amplitudes, initial_state, cu_seqlens, radial_bound, config, ctl, rnorm,
          bound, count):
    # packed, the backward restarts each sequence from its initial state, so it is kept (else it is in bound)
    kept = () if cu_seqlens is None else (cu_seqlens,) + (() if initial_state is None else (initial_state,))
    # an output the caller drops (training drops the final state) gets None, not zeros: the backward
    # then skips its cotangent (packed, a gather per token the kernels would do for nothing)
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(x, nu, theta_log, directions, amplitudes, ctl, rnorm, bound, count, *kept)
    ctx.radial_bound, ctx.config = radial_bound, config
    ctx.has_h0 = initial_state is not None


def _gradients(ctx, dy, dfinal, backward):
    """Input and parameter gradients from the saved context, with ``backward`` = the op or ``_bwd``."""
    x, nu, theta_log, directions, amplitudes, ctl, rnorm, bound, count, *kept = ctx.saved_tensors
    cu_seqlens, initial_state = (kept + [None, None])[:2]
    dy = torch.zeros_like(x) if dy is None else dy.contiguous()
    dfinal = None if dfinal is None else dfinal.float().contiguous()
    dx, dnu, dtheta, ddir, damp, dh0 = backward(dy, dfinal, x, nu, theta_log, directions, amplitudes, ctx.has_h0,
                                                ctl, rnorm, bound, count, cu_seqlens, initial_state, ctx.radial_bound,
                                                ctx.config)
    return dx, dnu, dtheta, ddir, damp, (dh0 if ctx.has_h0 else None), None, None, None, None


def _setup_context(ctx, inputs, output):
    _, _, ctl, rnorm, bound, count = output
    _save(ctx, *inputs[:-1], ctl, rnorm, bound, count)
    ctx.mark_non_differentiable(ctl, rnorm, bound, count)


def _backward(ctx, dy, dfinal, _dctl, _drnorm, _dbound, _dcount):
    return _gradients(ctx, dy, dfinal, samu_bwd)


samu_fwd.register_autograd(_backward, setup_context=_setup_context)


class _Eager(torch.autograd.Function):
    """The custom ops' forward and backward without their dispatch layers, which cost eager calls
    ~0.2 ms of host time each; torch.compile traces the custom ops instead."""

    @staticmethod
    def forward(ctx, x, nu, theta_log, directions, amplitudes, initial_state, cu_seqlens, radial_bound, config,
                want_final):
        y, final, ctl, rnorm, bound, count = _fwd(x, nu, theta_log, directions, amplitudes, initial_state,
                                                  cu_seqlens, radial_bound, config, want_final)
        _save(ctx, x, nu, theta_log, directions, amplitudes, initial_state, cu_seqlens, radial_bound, config, ctl,
              rnorm, bound, count)
        return y, final

    @staticmethod
    def backward(ctx, dy, dfinal):
        return _gradients(ctx, dy, dfinal, _bwd)


def run(x, nu, theta_log, directions, amplitudes, initial_state, radial_bound, config: Config, cu_seqlens=None,
        final: bool = True):
    """Differentiable SAMU forward with one Triton configuration: (y, final_state fp32, or None without
    ``final``). ``cu_seqlens``: a checked int32 device tensor of packed offsets (B = 1; states [N, D])."""
    params = [p.float().contiguous() for p in (nu, theta_log, directions, amplitudes)]
    h0 = None if initial_state is None else initial_state.float().contiguous()
    args = (x.contiguous(), *params, h0, cu_seqlens, float(radial_bound), config.as_list(), bool(final))
    if torch.compiler.is_compiling():
        y, h, *_ = samu_fwd(*args)
    else:
        y, h = _Eager.apply(*args)
    return y, (h if final else None)


def _tile(D: int) -> tuple[int, int]:
    """Modes per program: up to 128 on one warp, four a thread (independent chains a token hide its
    latency; the per-token scalar work is shared), and up to 64 in the main backward, whose 128 registers
    at 64 let 16 programs share a multiprocessor (at 128 modes it takes 224 registers, 9 programs, and ran
    43% slower: docs/performance.md, "SAMU v3.5")."""
    modes = next_power_of_2(max(D // 2, 1))
    return min(128, modes), min(64, modes)


def serial_config(B: int, L: int, D: int) -> Config:
    BN, main_BN = _tile(D)
    return Config(K=32, BN=BN, G=1, main_BN=main_BN)


def grouped_config(B: int, L: int, D: int) -> Config:
    BN, main_BN = _tile(D)
    n_chunks = cdiv(L, 32)
    # about sqrt(nC) chunks per group balances the group-local and outer serial walks
    return Config(K=32, BN=BN, G=max(2, next_power_of_2(int(n_chunks ** 0.5))), main_BN=main_BN)


def _scratch(config_of):
    """Analytic scratch of one forward + backward, in bytes (4-byte words: fp32 buffers and the int32 prefix counters;
    README.md, "What is saved, and scratch")."""
    def scratch(B, L, D):
        c = config_of(B, L, D)
        BM = c.main_BN or c.BN  # the main backward's tile: its slots and the partial sums' tiles
        n_chunks, n_tiles = cdiv(L, c.K), cdiv(D // 2, BM)
        n_groups = cdiv(n_chunks, c.G)
        sms = multiprocessors(torch.device("cuda", 0)) if torch.cuda.is_available() else 132
        n_slots = slot_count(B * n_chunks * n_tiles, sms, c.slots_per_sm)
        grouped = c.G > 1
        words = (B * D * (8 * n_chunks + grouped * (4 * n_chunks + 4 * n_groups) + 2 * n_groups)
                 + B * L * (8 + 2 * n_tiles) + n_slots * c.K * 2 * BM + 4 * B * cdiv(L, CONTROLLER_TOKENS)
                 + B * cdiv(D // 2, c.BN) * (grouped * n_groups + 1))
        formula = (f"4*(B*D*(8*nC + [G>1]*(4*nC + 4*nG) + 2*nG) + B*L*(8 + 2*ceil(D/(2*BM))) + n_slots*K*2*BM"
                   f" + 4*B*ceil(L/{CONTROLLER_TOKENS}) + B*ceil(D/(2*BN))*([G>1]*nG + 1)) with K={c.K}, BN={c.BN},"
                   f" BM={BM}, G={c.G}, n_slots={n_slots}")
        return formula, 4 * words
    return scratch


def _variant(name, config_of, preference, description):
    return dispatch.register(dispatch.Variant(
        op="samu", name=name,
        run=lambda x, nu, th, u, a, h0, kappa, cu_seqlens=None, final=True: run(x, nu, th, u, a, h0, kappa,
                                                                               config_of(*x.shape), cu_seqlens, final),
        packs=True, drops_final=True,
        preference=lambda B, L, D, H: preference(B, L, D), scratch=_scratch(config_of), description=description,
        settings=lambda B, L, D, H, dtype: str(config_of(B, L, D)),
        numerics=lambda B, L, D, H, dtype: _numerics(config_of(B, L, D))))


def _numerics(c: Config) -> str:
    # chunk length, group size, the main backward's mode tile and its warps (its sums over modes) fix the
    # parenthesisation, slots do not (the walks' tile BN is named too, though each walk is per mode); the unroll
    # factor changes which products the compiler contracts into fused multiply-adds; v, the kernels' numerics
    # version, changes with any kernel change that moves a bit, so that no gate record of earlier kernels covers
    # these (session 16's prefix inside the summary kernels moved none: the same bits at 18 cases on an H200, before
    # its review's mends in results/dev/session16/call3/same.txt and after them in
    # results/dev/session17/call1/w/same_o17.txt). Warps are named only where they are not 1 (dispatch runs one)
    warps = "" if c.num_warps == 1 else f",W={c.num_warps}"
    return f"v=6,K={c.K},BN={c.BN},BM={c.main_BN or c.BN},G={c.G},U={c.unroll}{warps}"


_variant("triton_serial", serial_config, lambda B, L, D: 0.0 if cdiv(L, 32) <= 64 else 2.0,
         "chunks of 32 tokens, serial prefix over all chunks")
_variant("triton_grouped", grouped_config, lambda B, L, D: 1.0,
         "chunks of 32 tokens in groups of ~sqrt(#chunks): group-local prefix, outer prefix, correction in replay")
