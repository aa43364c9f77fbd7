"""Public functional API of the two mixers (spec §5): validation, then the chosen backend."""

from __future__ import annotations

import torch

from samu import reference
from samu.ops import dispatch
from samu.ops.checks import check_rglru_inputs, check_samu_inputs, check_state
from samu.ops.packing import device_offsets, per_sequence, sequence_offsets
from samu.ops.rglru.torch import rglru_mixer_torch
from samu.ops.samu.torch import samu_mixer_torch
from samu.ops.scan import state_dtype


def _finish(y, h, x, output_final_state):
    """Outputs in the input dtype, contiguous (the chunked paths' y is a slice of a padded buffer); the final state
    in fp32 (float64 for float64 input)."""
    y = y.to(x.dtype).contiguous()
    return y, (h.to(state_dtype(x.dtype)) if output_final_state else None)


def _final(variant, output_final_state) -> dict:
    """The keyword that spares a variant the final state when the caller drops it."""
    return {"final": output_final_state} if variant.drops_final else {}


def _packed(op, backend, heads, native, run, x, initial_state, output_final_state, cu_seqlens):
    """A packed call (samu.ops.packing): in one call of a Triton variant that packs where dispatch picks
    one, native(variant, x, h0, offsets on the device) -> (y, h); else run(x_n, h0_n) -> (y_n, h_n) for
    each sequence, concatenated."""
    offsets = sequence_offsets(cu_seqlens, x)
    check_state(initial_state, len(offsets) - 1, x.shape[-1], x.device, "initial_state")
    B, L, D = x.shape
    choice = dispatch.choose(op, B, L, D, x.dtype, x.device, backend, heads=heads, packed=True)
    if choice.backend == "triton":
        y, h = native(choice.variant, x.contiguous(), initial_state, device_offsets(offsets, x.device))
        return _finish(y, h, x, output_final_state)
    return per_sequence(run, x, offsets, initial_state, output_final_state)


def samu_mixer(x, nu, theta_log, directions, amplitudes, *, initial_state=None, output_final_state=False,
               radial_bound=2.0, backend="auto", cu_seqlens=None):
    """SAMU mixer: a complex diagonal recurrence steered per token by a low-rank controller.

    Args:
        x: [B, L, D] bf16, fp16 or fp32 (float64 for the reference and torch backends); D even.
            Columns 0..N-1 are real parts, N..D-1 imaginary parts of N = D/2 complex inputs.
        nu: [N] fp32, log-log base decay rate (base radius exp(-exp(nu))).
        theta_log: [N] fp32, log base angle.
        directions: [2, D] fp32, the two controller directions (normalised inside).
        amplitudes: [2, 2] fp32, signed controller amplitudes.
        initial_state: [B, D] (fused coordinates) or None for zeros; differentiable. With ``cu_seqlens``,
            [N, D]: one row per packed sequence.
        output_final_state: also return the state after the last token (of each packed sequence).
        radial_bound: kappa of the bounded radial map, m = exp(kappa tanh(c0 / kappa)).
        backend: "auto", "reference", "torch", "triton" or a named Triton variant
            (``samu.dispatch.variants("samu")``).
        cu_seqlens: None, or the N + 1 offsets (int32 or int64 tensor, or ints) of N sequences packed
            along L of a batch-1 x (samu.ops.packing): no state crosses a boundary.

    Returns:
        y: [B, L, D] in x's dtype; h: [B, D] ([N, D] packed) fp32 (float64 for float64 x) or None.
    """
    check_samu_inputs(x, nu, theta_log, directions, amplitudes, None if cu_seqlens is not None else initial_state,
                      radial_bound)

    def run(x, h0):
        B, L, D = x.shape
        choice = dispatch.choose("samu", B, L, D, x.dtype, x.device, backend)
        if choice.backend == "reference":
            # inputs are checked above; the unchecked body avoids a second finiteness sync
            y = reference.samu_serial(x, nu, theta_log, directions, amplitudes, h0, radial_bound, torch.float64)
            h = y[:, -1].clone()
        elif choice.backend == "torch":
            y, h = samu_mixer_torch(x, nu, theta_log, directions, amplitudes, h0, radial_bound)
        else:
            y, h = choice.variant.run(x.contiguous(), nu, theta_log, directions, amplitudes, h0, radial_bound,
                                      **_final(choice.variant, output_final_state))
        return _finish(y, h, x, output_final_state)

    def native(variant, x, h0, offsets):
        return variant.run(x, nu, theta_log, directions, amplitudes, h0, radial_bound, cu_seqlens=offsets,
                           **_final(variant, output_final_state))

    if cu_seqlens is None:
        return run(x, initial_state)
    return _packed("samu", backend, 16, native, run, x, initial_state, output_final_state, cu_seqlens)


def rglru_mixer(x, w_a, b_a, w_x, b_x, a_param, *, initial_state=None, output_final_state=False,
                c=8.0, backend="auto", cu_seqlens=None):
    """RG-LRU mixer (Griffin's Real-Gated Linear Recurrent Unit) with block-diagonal gates.

    Args:
        x: [B, L, D] bf16, fp16 or fp32 (float64 for the reference and torch backends).
        w_a, w_x: [H, D/H, D/H] fp32 block-diagonal gate weights (x_{t,h} @ w[h]).
        b_a, b_x: [D] fp32 gate biases.
        a_param: [D] fp32; base decay exp(-softplus(a_param)).
        initial_state: [B, D] or None for zeros; differentiable. With ``cu_seqlens``, [N, D].
        output_final_state: also return the state after the last token (of each packed sequence).
        c: the decay exponent scale (8 in Griffin).
        backend: "auto", "reference", "torch", "triton" or a named Triton variant.
        cu_seqlens: None, or the N + 1 offsets (int32 or int64 tensor, or ints) of N sequences packed
            along L of a batch-1 x (samu.ops.packing): no state crosses a boundary.

    Returns:
        y: [B, L, D] in x's dtype; h: [B, D] ([N, D] packed) fp32 (float64 for float64 x) or None.
    """
    check_rglru_inputs(x, w_a, b_a, w_x, b_x, a_param, None if cu_seqlens is not None else initial_state, c)

    def run(x, h0):
        B, L, D = x.shape
        choice = dispatch.choose("rglru", B, L, D, x.dtype, x.device, backend, heads=w_a.shape[0])
        if choice.backend == "reference":
            y = reference.rglru_serial(x, w_a, b_a, w_x, b_x, a_param, h0, c, torch.float64)
            h = y[:, -1].clone()
        elif choice.backend == "torch":
            y, h = rglru_mixer_torch(x, w_a, b_a, w_x, b_x, a_param, h0, c)
        else:
            y, h = choice.variant.run(x.contiguous(), w_a, b_a, w_x, b_x, a_param, h0, c,
                                      **_final(choice.variant, output_final_state))
        return _finish(y, h, x, output_final_state)

    def native(variant, x, h0, offsets):
        return variant.run(x, w_a, b_a, w_x, b_x, a_param, h0, c, cu_seqlens=offsets,
                           **_final(variant, output_final_state))

    if cu_seqlens is None:
        return run(x, initial_state)
    return _packed("rglru", backend, w_a.shape[0], native, run, x, initial_state, output_final_state, cu_seqlens)
