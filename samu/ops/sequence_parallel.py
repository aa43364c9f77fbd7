"""Sequence parallelism for both mixers: one sequence split along L across the ranks of a process group.

Each rank holds one shard x_r [B, L_r, D] of the sequence, in rank order (shards may differ in length).
Either mixer's state is affine in the state h_in its shard is entered with:

    h_t = h0_t + P_t * h_in,    P_t = prod_{s <= t} lambda_s    (per mode, complex, for SAMU; per channel for RG-LRU)

where h0_t is the state reached from a zero state. So every rank, at once:

1. scans its shard from a zero state (the mixer itself, with any backend): y0 and its end state e_r;
2. forms P_t from cumulative sums of its log transitions, in float64 (the derivations: "Sequence
   parallelism" in samu/ops/samu/README.md and samu/ops/rglru/README.md), then in the state dtype;
3. all-gathers the summaries (A_r = P at its last token, e_r): O(B D) per rank;
4. folds them in rank order from the initial state: h_in(r) = A_{r-1} h_in(r-1) + e_{r-1}, in float64;
5. corrects its output, y = y0 + P * h_in(r) (the correction is elementwise: no second scan; SAMU's runs as
   one Triton kernel each way where its mixer runs a Triton variant, samu/ops/samu/triton_shift.py). The
   final state, the fold over every rank, is the same on every rank.

Autograd runs through all of it: the gather's backward all-reduces the cotangents of the summaries, so
each rank's x gets its exact gradient, and each parameter (and ``initial_state``) gets this rank's share of
its gradient: summed over the group, as data parallelism's all-reduce does, it is the one-process gradient.
Exact within the gates' fp32 rule, not to the bit: y0 is rounded to the input dtype before its correction
is added (one more rounding for low-precision inputs), and the fold composes the shards' maps in another
order than one process's scan.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

from samu.ops import dispatch
from samu.ops.checks import check_input, check_state
from samu.ops.functional import rglru_mixer, samu_mixer
from samu.ops.scan import state_dtype
from samu.reference import rglru_gate, samu_controls


def _samu_step(A, h, e):
    """A h + e for SAMU's states in fused coordinates (real parts, then imaginary): complex per mode."""
    n = h.shape[-1] // 2
    ar, ai, hr, hi = A[..., :n], A[..., n:], h[..., :n], h[..., n:]
    return torch.cat([ar * hr - ai * hi, ar * hi + ai * hr], -1) + e


def _rglru_step(A, h, e):
    return A * h + e


def _fold(rows, h, rank: int, step):
    """(the state entering shard ``rank``, the state after the last shard) from every rank's (A, e) ``rows``
    [world, 2, B, D], folded in rank order from ``h``."""
    entering = h
    for s in range(len(rows)):
        if s == rank:
            entering = h
        h = step(rows[s, 0], h, rows[s, 1])
    return entering, h


class _Exchange(torch.autograd.Function):
    """Gathers every rank's shard summary (A, e) [2, B, D] and folds them: (the state entering this rank's
    shard, the final state). The backward refolds the gathered rows, all-reduces their cotangents (every
    backend has all-reduce) and returns this rank's: a node of every rank's graph whether or not its
    output depends on another rank, so every rank's backward takes part in the collective."""

    @staticmethod
    def forward(ctx, summary, h, group, step):
        rows = [torch.empty_like(summary) for _ in range(dist.get_world_size(group))]
        dist.all_gather(rows, summary.contiguous(), group=group)
        rows = torch.stack(rows)
        ctx.save_for_backward(rows, h)
        ctx.group, ctx.step = group, step
        entering, final = _fold(rows, h, dist.get_rank(group), step)
        return entering.clone(), final   # rank 0's is h itself: an output must not be an input

    @staticmethod
    def backward(ctx, d_entering, d_final):
        rows, h = ctx.saved_tensors
        rank = dist.get_rank(ctx.group)
        with torch.enable_grad():
            rows, h = rows.detach().requires_grad_(), h.detach().requires_grad_()
            d_rows, d_h = torch.autograd.grad(_fold(rows, h, rank, ctx.step), [rows, h], [d_entering, d_final],
                                              allow_unused=True)
        d_rows = torch.zeros_like(rows) if d_rows is None else d_rows.contiguous()
        dist.all_reduce(d_rows, group=ctx.group)
        return d_rows[rank], d_h, None, None


def _samu_sums(x, directions, amplitudes, radial_bound, sdt):
    """The cumulative sums of SAMU's controller over the shard x, [B, L] float64: mass (of m) and drift (of phi,
    reduced mod 2 pi). With the turns t e^theta_log they give P_t (samu/ops/samu/README.md)."""
    _, m, phi = samu_controls(x.to(sdt), directions.to(sdt), amplitudes.to(sdt), radial_bound)
    return m.double().cumsum(1), torch.remainder(phi.double().cumsum(1), 2 * math.pi)


def _samu_turns(steps, theta_log):
    """(t e^theta_log) mod 2 pi, float64, for the steps t [T] (1-based): [T, N]."""
    return torch.remainder(steps.double()[:, None] * torch.exp(theta_log.double()), 2 * math.pi)


def _samu_map(mass, drift, nu, theta_log):
    """The shard's whole map A = P at its last token [B, D] (float64, fused coordinates)."""
    L = mass.shape[1]
    radius = torch.exp(-mass[:, -1:] * torch.exp(nu.double()))
    phase = _samu_turns(torch.full((1,), L, device=mass.device), theta_log)[0] + drift[:, -1:]
    return torch.cat([radius * torch.cos(phase), radius * torch.sin(phase)], -1)


def _samu_shift_torch(y0, mass, drift, nu, theta_log, h, sdt):
    """y0 + P h by PyTorch ops: P [B, L, N] complex of the state dtype ``sdt``, formed from the float64 sums
    (the phase's two terms reduced mod 2 pi on their own, [L, N] and [B, L])."""
    n = h.shape[-1] // 2
    turns = _samu_turns(torch.arange(1, y0.shape[1] + 1, device=y0.device), theta_log)
    p = torch.polar(torch.exp(-mass.to(sdt).unsqueeze(-1) * torch.exp(nu.double()).to(sdt)),
                    turns.to(sdt) + drift.to(sdt).unsqueeze(-1))
    shift = p * torch.complex(h[:, :n], h[:, n:]).to(p.dtype).unsqueeze(1)
    return (y0.to(sdt) + torch.cat([shift.real, shift.imag], -1)).to(y0.dtype)


def _fused_shift(x, backend) -> bool:
    """Whether SAMU's correction runs as its Triton kernels (samu/ops/samu/triton_shift.py): where the mixer's
    backend is not a PyTorch one, for bf16, fp16 and fp32, on CUDA or in the Triton interpreter."""
    return (backend not in ("torch", "reference") and x.dtype != torch.float64 and dispatch.triton_available()
            and (x.is_cuda or dispatch.interpreting()))


def _rglru_log_products(x, w_a, b_a, a_param, c, sdt):
    """log P_t [B, L, D] (float64) for RG-LRU's shard x."""
    gate_a = rglru_gate(x.to(sdt), w_a.to(sdt), b_a.to(sdt))
    return -c * F.softplus(a_param.double()) * gate_a.double().cumsum(1)


def _group_of(group):
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("group: sequence parallelism needs an initialised torch.distributed process group")
    return group if group is not None else dist.group.WORLD


def samu_mixer_sequence_parallel(x, nu, theta_log, directions, amplitudes, *, group=None, initial_state=None,
                                 output_final_state=False, radial_bound=2.0, backend="auto"):
    """``samu_mixer`` on one shard of a sequence split along L across ``group`` (default: the world), shards
    in rank order: (y_r [B, L_r, D], the whole sequence's final state [B, D], or None).

    Every rank must take part (and backpropagate through its y_r). ``initial_state`` is the sequence's and
    must be the same on every rank. The final state comes back on every rank: let one rank's loss use it
    (each use adds its gradient). Gradients of the parameters and of ``initial_state`` are this rank's share;
    their sum over the group is the one-process gradient. Autocast does not reach the transitions' products
    (as in the mixers' own paths)."""
    group = _group_of(group)
    B, L, D = check_input(x)
    check_state(initial_state, B, D, x.device, "initial_state")
    y0, e = samu_mixer(x, nu, theta_log, directions, amplitudes, output_final_state=True,
                       radial_bound=radial_bound, backend=backend)
    sdt = state_dtype(x.dtype)
    with torch.autocast(x.device.type, enabled=False):
        mass, drift = _samu_sums(x, directions, amplitudes, radial_bound, sdt)
        h = x.new_zeros(B, D, dtype=torch.float64) if initial_state is None else initial_state.double()
        entering, final = _Exchange.apply(torch.stack([_samu_map(mass, drift, nu, theta_log), e.double()]), h,
                                          group, _samu_step)
        if _fused_shift(x, backend):
            from samu.ops.samu.triton_shift import SamuShift

            y = SamuShift.apply(y0, mass, drift, nu, theta_log, entering)
        else:
            y = _samu_shift_torch(y0, mass, drift, nu, theta_log, entering, sdt)
    return y, (final.to(sdt) if output_final_state else None)


def rglru_mixer_sequence_parallel(x, w_a, b_a, w_x, b_x, a_param, *, group=None, initial_state=None,
                                  output_final_state=False, c=8.0, backend="auto"):
    """``rglru_mixer`` on one shard of a sequence split along L across ``group`` (default: the world), shards
    in rank order: (y_r [B, L_r, D], the whole sequence's final state [B, D], or None). The conventions
    of ``samu_mixer_sequence_parallel`` (every rank takes part; the same ``initial_state`` everywhere; the
    final state on every rank, its gradient counted once per use; gradient shares)."""
    group = _group_of(group)
    B, _, D = check_input(x)
    check_state(initial_state, B, D, x.device, "initial_state")
    y0, e = rglru_mixer(x, w_a, b_a, w_x, b_x, a_param, output_final_state=True, c=c, backend=backend)
    sdt = state_dtype(x.dtype)
    with torch.autocast(x.device.type, enabled=False):
        log_p = _rglru_log_products(x, w_a, b_a, a_param, c, sdt)
        h = e.new_zeros(e.shape, dtype=torch.float64) if initial_state is None else initial_state.double()
        entering, final = _Exchange.apply(torch.stack([torch.exp(log_p[:, -1]), e.double()]), h, group,
                                          _rglru_step)
        y = (y0.to(sdt) + torch.exp(log_p).to(sdt) * entering.to(sdt).unsqueeze(1)).to(x.dtype)
    return y, (final.to(sdt) if output_final_state else None)


class _Halo(torch.autograd.Function):
    """The last K - 1 inputs of the previous rank's shard (zeros on the first rank): the Conv1D state a
    shard starts from. The backward sends each rank's cotangent to the rank it came from (an all-reduce)."""

    @staticmethod
    def forward(ctx, tail, group):
        rows = [torch.empty_like(tail) for _ in range(dist.get_world_size(group))]
        dist.all_gather(rows, tail.contiguous(), group=group)
        rank = dist.get_rank(group)
        ctx.group = group
        return torch.zeros_like(tail) if rank == 0 else rows[rank - 1]

    @staticmethod
    def backward(ctx, grad):
        rank, world = dist.get_rank(ctx.group), dist.get_world_size(ctx.group)
        rows = grad.new_zeros(world, *grad.shape)
        if rank > 0:
            rows[rank - 1] = grad
        dist.all_reduce(rows, group=ctx.group)
        return rows[rank], None


def conv_halo(x: torch.Tensor, width: int, group=None) -> torch.Tensor:
    """The causal Conv1D's state for this rank's shard x [B, L_r, E] of a sequence split along L across
    ``group`` (default: the world): the previous shard's last ``width`` - 1 inputs, differentiable (zeros on
    the first rank). Every shard must hold at least ``width`` - 1 tokens."""
    group = _group_of(group)
    if x.shape[1] < width - 1:
        raise ValueError(f"x: a sequence-parallel shard needs at least {width - 1} tokens (the Conv1D's reach), "
                         f"got {x.shape[1]}")
    return _Halo.apply(x[:, x.shape[1] - (width - 1):], group)

