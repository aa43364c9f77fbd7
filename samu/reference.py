"""Serial references of the SAMU and RG-LRU mixers (spec §3 and §4): the ground truth.

Every quantity is evaluated in ``dtype`` (float64 by default) with plain PyTorch ops; the
recurrence runs one token at a time. Outputs are returned in ``dtype``. Both functions are
differentiable: the pointwise parts through autograd, the recurrence through a serial linear
scan whose backward is the serial adjoint recurrence (checked against autograd in the tests).

Passing ``dtype=torch.float32`` gives the "serial fp32 evaluation of the same definition" that
the correctness gates (spec §7) scale their thresholds by.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from samu.ops.checks import check_rglru_inputs, check_samu_inputs, check_state
from samu.ops.packing import per_sequence, sequence_offsets

__all__ = ["samu_mixer", "rglru_mixer", "samu_serial", "rglru_serial", "linear_scan", "samu_controls",
           "samu_transitions", "rglru_gate", "rglru_gates", "sqrt_bound_derivative"]


class _SerialScan(torch.autograd.Function):
    """h_t = a_t * h_{t-1} + b_t, one token at a time, time-major [L, B, ...]."""

    @staticmethod
    def forward(ctx, a, b, h0):
        h = torch.empty_like(b)
        prev = h0
        for t in range(b.shape[0]):
            prev = torch.addcmul(b[t], a[t], prev, out=h[t])
        ctx.save_for_backward(a, h, h0)
        return h

    @staticmethod
    def backward(ctx, dh):
        a, h, h0 = ctx.saved_tensors
        # Adjoint: delta_t = dh_t + conj(a_{t+1}) delta_{t+1}; conj is a no-op for real a.
        a_conj = a.conj()
        delta = torch.empty_like(dh)
        nxt = None
        for t in range(dh.shape[0] - 1, -1, -1):
            if nxt is None:
                nxt = delta[t].copy_(dh[t])
            else:
                nxt = torch.addcmul(dh[t], a_conj[t + 1], nxt, out=delta[t])
        h_prev = torch.cat([h0.unsqueeze(0), h[:-1]], dim=0)
        da = delta * h_prev.conj()
        dh0 = a_conj[0] * delta[0]
        return da, delta, dh0


def linear_scan(a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
    """Serial diagonal linear recurrence h_t = a_t h_{t-1} + b_t.

    a, b: [B, L, ...] (real or complex, same dtype); h0: [B, ...]. Returns h: [B, L, ...].
    """
    h = _SerialScan.apply(a.transpose(0, 1).contiguous(), b.transpose(0, 1).contiguous(), h0)
    return h.transpose(0, 1)


def samu_controls(x, directions, amplitudes, radial_bound):
    """Controller of spec §3 steps 1-5: returns p [B, L, 2], m [B, L], phi [B, L]."""
    u_hat = directions / directions.norm(dim=1, keepdim=True)
    p = x @ u_hat.t()
    c = p @ amplitudes.t()
    m = torch.exp(radial_bound * torch.tanh(c[..., 0] / radial_bound))
    return p, m, c[..., 1]


def samu_transitions(m, phi, nu, theta_log):
    """Mode transitions of spec §3 step 6: lambda (complex) and gamma (real), [B, L, N]."""
    w = m.unsqueeze(-1) * torch.exp(nu)
    rho = torch.exp(-w)
    psi = torch.exp(theta_log) + phi.unsqueeze(-1)
    lam = torch.polar(rho, psi)
    gamma = torch.sqrt(-torch.expm1(-2.0 * w))
    return lam, gamma


def _serial_call(run, x, initial_state, output_final_state, backend, cu_seqlens, dtype):
    """(y, final state or None) from run(x, h0) -> y, one call per packed sequence with ``cu_seqlens``
    (samu.ops.packing; states [N, D]); ``backend`` is the public functions' keyword, here only "reference";
    ``dtype`` the one the reference evaluates in."""
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype: the serial reference evaluates in torch.float64 or torch.float32, got {dtype!r}")
    if backend != "reference":
        raise ValueError(f"backend: samu.reference runs the serial reference only, got {backend!r} (call "
                         f"samu.samu_mixer / samu.rglru_mixer for the other backends)")

    def with_final(x_n, h0):
        y_n = run(x_n, h0).contiguous()
        return y_n, y_n[:, -1].clone()

    if cu_seqlens is None:
        y, h = with_final(x, initial_state)
        return y, (h if output_final_state else None)
    offsets = sequence_offsets(cu_seqlens, x)
    check_state(initial_state, len(offsets) - 1, x.shape[-1], x.device, "initial_state")
    return per_sequence(with_final, x, offsets, initial_state, output_final_state)


def samu_mixer(x, nu, theta_log, directions, amplitudes, *, initial_state=None,
               output_final_state=False, radial_bound=2.0, backend="reference", cu_seqlens=None,
               dtype=torch.float64):
    """Serial SAMU mixer (spec §3), with samu.samu_mixer's signature.

    x: [B, L, D] (D even); nu, theta_log: [N]; directions: [2, D]; amplitudes: [2, 2];
    initial_state: [B, D] in fused coordinates (real parts, then imaginary parts) or None ([N, D] with
    ``cu_seqlens``, the N + 1 offsets of sequences packed along L of a batch-1 x).
    Returns (y [B, L, D], final_state [B, D] ([N, D] packed) or None), both in ``dtype``.
    """
    check_samu_inputs(x, nu, theta_log, directions, amplitudes, None if cu_seqlens is not None else initial_state,
                      radial_bound)
    return _serial_call(lambda x, h0: samu_serial(x, nu, theta_log, directions, amplitudes, h0, radial_bound, dtype),
                        x, initial_state, output_final_state, backend, cu_seqlens, dtype)


def samu_serial(x, nu, theta_log, directions, amplitudes, initial_state, radial_bound, dtype):
    """The unchecked body of ``samu_mixer``: returns y [B, L, D] in ``dtype``."""
    cplx = torch.complex128 if dtype == torch.float64 else torch.complex64
    x, nu, theta_log, directions, amplitudes = (
        t.to(dtype) for t in (x, nu, theta_log, directions, amplitudes))
    B, L, D = x.shape
    n = D // 2
    _, m, phi = samu_controls(x, directions, amplitudes, radial_bound)
    lam, gamma = samu_transitions(m, phi, nu, theta_log)
    z = torch.complex(x[..., :n], x[..., n:])
    if initial_state is None:
        h0 = torch.zeros(B, n, dtype=cplx, device=x.device)
    else:
        s = initial_state.to(dtype)
        h0 = torch.complex(s[:, :n], s[:, n:])
    h = linear_scan(lam, gamma * z, h0)
    return torch.cat([h.real, h.imag], dim=-1)


class _SqrtBoundDerivative(torch.autograd.Function):
    """sqrt(u) whose derivative is 1 / sqrt(max(4u, 1/1000^2)) (Griffin's bounded derivative)."""

    @staticmethod
    def forward(ctx, u):
        ctx.save_for_backward(u)
        return torch.sqrt(u)

    @staticmethod
    def backward(ctx, grad):
        (u,) = ctx.saved_tensors
        return grad / torch.sqrt(torch.clamp(4.0 * u, min=1e-6))


def sqrt_bound_derivative(u: torch.Tensor) -> torch.Tensor:
    return _SqrtBoundDerivative.apply(u)


def rglru_gate(x, w, b):
    """One block-diagonal gate of spec §4, sigmoid(x_h @ w[h] + b), [B, L, D]."""
    B, L, D = x.shape
    H = w.shape[0]
    return torch.sigmoid(torch.einsum("blhi,hij->blhj", x.reshape(B, L, H, D // H), w).reshape(B, L, D) + b)


def rglru_gates(x, w_a, b_a, w_x, b_x, a_param, c):
    """Gates of spec §4: returns a_t and the scan input multiplier_t * gate_x_t * x_t, [B, L, D]."""
    gate_a = rglru_gate(x, w_a, b_a)
    gate_x = rglru_gate(x, w_x, b_x)
    log_a = -c * gate_a * F.softplus(a_param)
    a = torch.exp(log_a)
    # 1 - a^2 as -expm1(2 log a): the same quantity, without cancellation as a -> 1
    multiplier = sqrt_bound_derivative(-torch.expm1(2.0 * log_a))
    return a, multiplier * gate_x * x


def rglru_mixer(x, w_a, b_a, w_x, b_x, a_param, *, initial_state=None, output_final_state=False,
                c=8.0, backend="reference", cu_seqlens=None, dtype=torch.float64):
    """Serial RG-LRU mixer (spec §4), with samu.rglru_mixer's signature.

    x: [B, L, D]; w_a, w_x: [H, D/H, D/H]; b_a, b_x, a_param: [D]; initial_state: [B, D] or None ([N, D]
    with ``cu_seqlens``, as samu_mixer's).
    Returns (y [B, L, D], final_state [B, D] ([N, D] packed) or None), both in ``dtype``.
    """
    check_rglru_inputs(x, w_a, b_a, w_x, b_x, a_param, None if cu_seqlens is not None else initial_state, c)
    return _serial_call(lambda x, h0: rglru_serial(x, w_a, b_a, w_x, b_x, a_param, h0, c, dtype),
                        x, initial_state, output_final_state, backend, cu_seqlens, dtype)


def rglru_serial(x, w_a, b_a, w_x, b_x, a_param, initial_state, c, dtype):
    """The unchecked body of ``rglru_mixer``: returns y [B, L, D] in ``dtype``."""
    x, w_a, b_a, w_x, b_x, a_param = (t.to(dtype) for t in (x, w_a, b_a, w_x, b_x, a_param))
    B, L, D = x.shape
    a, b = rglru_gates(x, w_a, b_a, w_x, b_x, a_param, c)
    h0 = (torch.zeros(B, D, dtype=dtype, device=x.device) if initial_state is None
          else initial_state.to(dtype))
    return linear_scan(a, b, h0)
