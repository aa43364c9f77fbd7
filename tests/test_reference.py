"""The references themselves: their scan, the SAMU definition step by step, RTU degeneration."""

import math

import pytest
import torch

from samu import reference
from tests.helpers import assert_float64_matches_reference, randn, rel_err, rglru_params, samu_params


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_serial_scan_gradcheck(dtype):
    g = torch.Generator().manual_seed(0)
    a = (0.9 * torch.rand(2, 7, 3, generator=g, dtype=torch.float64)).to(dtype).requires_grad_()
    b = torch.randn(2, 7, 3, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    h0 = torch.randn(2, 3, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    assert torch.autograd.gradcheck(reference.linear_scan, (a, b, h0))


def _samu_by_definition(x, nu, theta_log, directions, amplitudes, h0, kappa=2.0):
    """spec §3 written out token by token with real arithmetic, differentiated by autograd."""
    B, L, D = x.shape
    n = D // 2
    u_hat = [directions[j] / directions[j].norm() for j in range(2)]
    hr, hi = h0[:, :n], h0[:, n:]
    ys = []
    for t in range(L):
        xt = x[:, t]
        p = [xt @ u_hat[0], xt @ u_hat[1]]
        c0 = amplitudes[0, 0] * p[0] + amplitudes[0, 1] * p[1]
        c1 = amplitudes[1, 0] * p[0] + amplitudes[1, 1] * p[1]
        m = torch.exp(kappa * torch.tanh(c0 / kappa))
        w = m[:, None] * torch.exp(nu)
        rho = torch.exp(-w)
        psi = torch.exp(theta_log) + c1[:, None]
        gamma = torch.sqrt(1.0 - rho ** 2)
        lr, li = rho * torch.cos(psi), rho * torch.sin(psi)
        hr, hi = lr * hr - li * hi + gamma * xt[:, :n], lr * hi + li * hr + gamma * xt[:, n:]
        ys.append(torch.cat([hr, hi], dim=-1))
    return torch.stack(ys, dim=1)


def test_samu_reference_matches_definition():
    B, L, D = 2, 23, 10
    x = randn((B, L, D), 1, dtype=torch.float64)
    params = [p.detach().double().requires_grad_() for p in samu_params(D, 2)]
    h0 = randn((B, D), 3, dtype=torch.float64)
    y, h = reference.samu_mixer(x, *params, initial_state=h0, output_final_state=True)
    y_def = _samu_by_definition(x, *params, h0)
    assert rel_err(y, y_def) < 1e-13
    assert torch.equal(h, y[:, -1])
    gy = torch.randn_like(y)
    inputs = [x, h0, *params]
    g_ref = torch.autograd.grad((y * gy).sum(), inputs)
    g_def = torch.autograd.grad((y_def * gy).sum(), inputs)
    for a, b in zip(g_ref, g_def):
        assert rel_err(a, b) < 1e-12


def test_samu_reference_rtu_degeneration():
    """A = 0: lambda_k = r_k exp(i theta_k), gamma_k = sqrt(1 - r_k^2), exactly (float64 rounding)."""
    B, L, D = 2, 31, 12
    n = D // 2
    x = randn((B, L, D), 4, dtype=torch.float64, requires_grad=False)
    nu, theta_log, directions, _ = [p.detach().double() for p in samu_params(D, 5)]
    y, _ = reference.samu_mixer(x, nu, theta_log, directions, torch.zeros(2, 2, dtype=torch.float64))
    r = torch.exp(-torch.exp(nu))
    lam = torch.polar(r, torch.exp(theta_log))
    gamma = torch.sqrt(1.0 - r * r)
    h = torch.zeros(B, n, dtype=torch.complex128)
    for t in range(L):
        h = lam * h + gamma * torch.complex(x[:, t, :n], x[:, t, n:])
        assert rel_err(y[:, t], torch.cat([h.real, h.imag], -1)) < 1e-14


def _bounded_sqrt(u):
    """sqrt(u) whose derivative is Griffin's 1 / sqrt(max(4u, 1e-6)) (spec §4), written as a detached tangent."""
    u0 = u.detach()
    return torch.sqrt(u0) + (u - u0) / torch.sqrt(torch.clamp(4.0 * u0, min=1e-6))


def _rglru_by_definition(x, w_a, b_a, w_x, b_x, a_param, *, initial_state, output_final_state=True):
    """RG-LRU token by token as spec §4 writes it (c = 8), float64: (y, final state)."""
    B, L, D = x.shape
    H = w_a.shape[0]
    hd = D // H
    state, ys = initial_state, []
    for t in range(L):
        xt = x[:, t]
        pre_a = torch.cat([xt[:, i * hd:(i + 1) * hd] @ w_a[i] for i in range(H)], dim=-1) + b_a
        pre_x = torch.cat([xt[:, i * hd:(i + 1) * hd] @ w_x[i] for i in range(H)], dim=-1) + b_x
        log_a = -8.0 * torch.sigmoid(pre_a) * torch.nn.functional.softplus(a_param)
        a = torch.exp(log_a)
        # 1 - a^2 as -expm1(2 log a): 1 - a * a would lose about 8 of its digits on the slow channels
        state = a * state + _bounded_sqrt(-torch.expm1(2.0 * log_a)) * torch.sigmoid(pre_x) * xt
        ys.append(state)
    return torch.stack(ys, dim=1), state


@pytest.mark.parametrize("slow_channels", [False, True])
def test_rglru_reference_matches_definition(slow_channels):
    """slow_channels: a_param = -20 on half the channels puts u = 1 - a^2 below 3.3e-8, where the bound holds."""
    B, L, D, H = 2, 19, 12, 3
    x = randn((B, L, D), 6, dtype=torch.float64)
    w_a, b_a, w_x, b_x, a_param = [p.detach().double() for p in rglru_params(D, H, 7)]
    if slow_channels:
        a_param[::2] = -20.0
    params = [p.requires_grad_() for p in (w_a, b_a, w_x, b_x, a_param)]
    h0 = randn((B, D), 8, dtype=torch.float64)
    y, h = reference.rglru_mixer(x, *params, initial_state=h0, output_final_state=True)
    assert torch.equal(h, y[:, -1])
    # outputs, final state and every gradient, the definition's against the reference's
    assert_float64_matches_reference(_rglru_by_definition, reference.rglru_mixer, x, params, h0)


def test_bounded_sqrt_derivative():
    u = torch.tensor([0.0, 1e-12, 0.25, 1.0], dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(reference.sqrt_bound_derivative(u).sum(), u)
    assert torch.allclose(g, torch.tensor([1000.0, 1000.0, 1.0, 0.5], dtype=torch.float64))
    assert math.isfinite(float(g.sum()))


@pytest.mark.parametrize("op", ["samu", "rglru"])
def test_references_take_the_public_signature(op):
    """samu.reference's mixers take the public functions' arguments (spec §5): backend (only "reference"),
    and cu_seqlens, which packs as one serial call per sequence from its own row of initial_state."""
    import samu

    D = 8
    x = randn((1, 9, D), 1, dtype=torch.float64)
    params = [p.detach().double() for p in (samu_params(D, 2) if op == "samu" else rglru_params(D, 2))]
    h0 = randn((3, D), 3, dtype=torch.float64)
    ref, public = getattr(reference, f"{op}_mixer"), getattr(samu, f"{op}_mixer")
    offsets = [0, 2, 3, 9]
    y, h = ref(x, *params, initial_state=h0, output_final_state=True, backend="reference", cu_seqlens=offsets)
    y_pub, h_pub = public(x, *params, initial_state=h0, output_final_state=True, backend="reference",
                          cu_seqlens=torch.tensor(offsets, dtype=torch.int32))
    assert torch.equal(y, y_pub) and torch.equal(h, h_pub)
    for n, (a, b) in enumerate(zip(offsets, offsets[1:])):
        y_n, h_n = ref(x[:, a:b], *params, initial_state=h0[n:n + 1], output_final_state=True)
        assert torch.equal(y[:, a:b], y_n) and torch.equal(h[n:n + 1], h_n)
    with pytest.raises(ValueError, match="backend"):
        ref(x, *params, backend="auto")
    with pytest.raises(ValueError, match="initial_state"):
        ref(x, *params, initial_state=h0[:2], cu_seqlens=offsets)
