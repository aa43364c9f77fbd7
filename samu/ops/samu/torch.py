"""SAMU mixer in chunked PyTorch with the hand-written backward of spec §3.1.

This is the structure the Triton kernels follow, written with torch ops: the forward saves only
p, (m, phi) and the chunk-boundary states; the backward replays states from those boundaries,
runs the conjugated adjoint scan and reduces the controller and parameter gradients. Mode
transitions are computed for one token per chunk at a time and never stored for all tokens.
State and accumulation are fp32 (float64 for float64 input). On CUDA the forward controller (p, m, phi)
and every transition are evaluated in float64 and rounded once to the state dtype (see _wide); the
backward's controller derivatives stay in the state dtype.
"""

from __future__ import annotations

import torch

from samu.ops.scan import chunk_size, from_chunks, scan, state_dtype, to_chunks
from samu.reference import samu_controls


def _complex(dtype: torch.dtype) -> torch.dtype:
    return torch.complex128 if dtype == torch.float64 else torch.complex64


def _wide(device: torch.device, sdt: torch.dtype) -> torch.dtype:
    """The dtype the controller and transitions are evaluated in: float64 on CUDA, where this path is
    the exact fallback for classes no Triton variant passed (its H200 gates need it: fp16 dx and
    d_theta_log at long L); the state dtype elsewhere, where it is the fast path (float64 cost the
    CPU demo a third more time)."""
    return torch.float64 if device.type == "cuda" else sdt


def _split(t: torch.Tensor) -> torch.Tensor:
    """Fused coordinates [..., D] -> complex [..., D/2]."""
    n = t.shape[-1] // 2
    return torch.complex(t[..., :n], t[..., n:])


class _Transitions:
    """lambda and gamma for token k of every chunk, from chunked (m, phi).

    On CUDA each transition is evaluated in float64 and rounded once to the state dtype. A rounded
    theta (or rate) is the same error at every token, and a slow mode's state compounds it over its
    memory: on the gate inputs dx was 10x further off the float64 reference with them in fp32.
    """

    def __init__(self, m_c, phi_c, nu, theta_log):
        self.m_c, self.phi_c = m_c, phi_c
        self.wide = _wide(m_c.device, m_c.dtype)
        self.rate = torch.exp(nu.to(self.wide))
        self.theta = torch.exp(theta_log.to(self.wide))
        self.sdt, self.cplx = m_c.dtype, _complex(m_c.dtype)

    def __call__(self, k):
        """(w, rho, exp(i psi), lambda, gamma) of token k, [B, n_chunks, N]."""
        w = self.m_c[:, :, k, None].to(self.wide) * self.rate
        rho = torch.exp(-w)
        unit = torch.polar(torch.ones_like(w), self.theta + self.phi_c[:, :, k, None].to(self.wide))
        gamma = torch.sqrt(-torch.expm1(-2.0 * w))
        return (w.to(self.sdt), rho.to(self.sdt), unit.to(self.cplx), (rho * unit).to(self.cplx),
                gamma.to(self.sdt))


def _setup(xs, m, phi, nu, theta_log):
    """Chunk length, the chunked transitions and the complex inputs, for x already in the state dtype."""
    K = chunk_size(xs.shape[1])
    trans = _Transitions(to_chunks(m, K, 1.0), to_chunks(phi, K), nu.to(xs.dtype), theta_log.to(xs.dtype))
    return K, trans, _split(to_chunks(xs, K))


class SAMUTorchFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, nu, theta_log, directions, amplitudes, initial_state, radial_bound):
        with torch.autocast(x.device.type, enabled=False):
            B, L, D = x.shape
            n = D // 2
            sdt = state_dtype(x.dtype)
            xs = x.to(sdt)
            # the controller in float64 too, rounded once (its fp32 projection was the largest error left)
            wide = _wide(x.device, sdt)
            p, m, phi = (t.to(sdt) for t in samu_controls(xs.to(wide), directions.to(wide), amplitudes.to(wide),
                                                           radial_bound))
            K, trans, z_c = _setup(xs, m, phi, nu, theta_log)
            h0 = (torch.zeros(B, n, dtype=_complex(sdt), device=x.device) if initial_state is None
                  else _split(initial_state.to(sdt)))

            def coef(k):
                _, _, _, lam, gamma = trans(k)
                return lam, gamma * z_c[:, :, k]

            y_c = torch.empty(B, z_c.shape[1], K, D, dtype=x.dtype, device=x.device)

            final = torch.empty(B, D, dtype=sdt, device=x.device)

            def emit(k, h):
                y_c[:, :, k, :n] = h.real
                y_c[:, :, k, n:] = h.imag
                if k == (L - 1) % K:
                    final[:, :n] = h[:, -1].real
                    final[:, n:] = h[:, -1].imag

            starts = scan(coef, h0, K, emit)

        ctx.save_for_backward(x, nu, theta_log, directions, amplitudes, p, m, phi, starts)
        ctx.radial_bound = radial_bound
        ctx.has_initial = initial_state is not None
        ctx.initial_dtype = None if initial_state is None else initial_state.dtype
        return from_chunks(y_c, L), final

    @staticmethod
    def backward(ctx, dy, dfinal):
        x, nu, theta_log, directions, amplitudes, p, m, phi, starts = ctx.saved_tensors
        kappa = ctx.radial_bound
        with torch.autocast(x.device.type, enabled=False):
            B, L, D = x.shape
            n = D // 2
            sdt = state_dtype(x.dtype)
            xs = x.to(sdt)
            K, trans, z_c = _setup(xs, m, phi, nu, theta_log)
            g = _split(dy.to(sdt) if dy is not None else torch.zeros_like(xs))
            if dfinal is not None:
                g[:, L - 1] += _split(dfinal.to(sdt))
            g_c = to_chunks(g, K)
            n_chunks = g_c.shape[1]

            # Adjoint: delta_t = g_t + conj(lambda_{t+1}) delta_{t+1}; beyond the end lambda := 0.
            lam_first_next = torch.zeros_like(g_c[:, :, 0])
            if n_chunks > 1:
                lam_first_next[:, :-1] = trans(0)[3][:, 1:]

            def rcoef(k):
                lam_next = trans(k + 1)[3] if k + 1 < K else lam_first_next
                return lam_next.conj(), g_c[:, :, k]

            delta_c = torch.empty_like(g_c)

            def keep(k, d):
                delta_c[:, :, k] = d

            scan(rcoef, torch.zeros_like(g_c[:, 0, 0]), K, keep, reverse=True)

            dx_c = torch.empty(B, n_chunks, K, D, dtype=sdt, device=x.device)
            dm_c = torch.empty(B, n_chunks, K, dtype=sdt, device=x.device)
            dphi_c = torch.empty_like(dm_c)
            dnu = torch.zeros(n, dtype=sdt, device=x.device)
            dpsi_sum = torch.zeros_like(dnu)
            m_c = trans.m_c
            h_prev = starts
            for k in range(K):
                w, rho, unit, lam, gamma = trans(k)
                d = delta_c[:, :, k]
                zk = z_c[:, :, k]
                g_lam_conj = d.conj() * h_prev
                dpsi = (g_lam_conj * lam * 1j).real
                drho = (g_lam_conj * unit).real
                dgamma = (d.conj() * zk).real
                # w dL/dw = -w rho dL/drho + (w / gamma) rho^2 dL/dgamma; w / gamma -> 0 as w -> 0
                # (w itself is 0 where exp(nu) underflows)
                w_gamma = torch.where(w > 0, w / torch.where(w > 0, gamma, 1.0), 0.0)
                w_dw = w * rho * (-drho) + w_gamma * (rho * rho) * dgamma
                dnu += w_dw.sum(dim=(0, 1))
                dpsi_sum += dpsi.sum(dim=(0, 1))
                dm_c[:, :, k] = w_dw.sum(-1) / m_c[:, :, k]
                dphi_c[:, :, k] = dpsi.sum(-1)
                gd = gamma * d
                dx_c[:, :, k, :n] = gd.real
                dx_c[:, :, k, n:] = gd.imag
                h_prev = torch.addcmul(gamma * zk, lam, h_prev)

            dx = from_chunks(dx_c, L)
            dm, dphi = from_chunks(dm_c, L), from_chunks(dphi_c, L)
            d_initial = None
            if ctx.has_initial and ctx.needs_input_grad[5]:
                di = trans(0)[3][:, 0].conj() * delta_c[:, 0, 0]
                d_initial = torch.cat([di.real, di.imag], dim=-1).to(ctx.initial_dtype)

            # Controller (all [B, L, 2]-sized): c = A p, m = exp(k tanh(c0 / k)), phi = c1.
            A = amplitudes.to(sdt)
            u = directions.to(sdt)
            r = torch.rsqrt((u * u).sum(dim=1, keepdim=True))
            u_hat = u * r
            c0 = p @ A[0]
            dc = torch.stack([dm * m * (1.0 - torch.tanh(c0 / kappa) ** 2), dphi], dim=-1)
            dA = torch.einsum("bli,blj->ij", dc, p)
            dp = dc @ A
            dx = dx + dp @ u_hat
            # dL/du_j = r_j sum_t dp_{t,j} (x_t - p_{t,j} u_hat_j)
            du = r * (torch.einsum("blj,bld->jd", dp, xs) - (dp * p).sum(dim=(0, 1))[:, None] * u_hat)
            dtheta_log = torch.exp(theta_log.to(sdt)) * dpsi_sum

        return (dx.to(x.dtype), dnu.to(nu.dtype), dtheta_log.to(theta_log.dtype), du.to(directions.dtype),
                dA.to(amplitudes.dtype), d_initial, None)


def samu_mixer_torch(x, nu, theta_log, directions, amplitudes, initial_state=None, radial_bound=2.0):
    """Chunked SAMU mixer: returns (y [B, L, D] in x.dtype, final state [B, D] fp32/float64)."""
    return SAMUTorchFunction.apply(x.contiguous(), nu, theta_log, directions, amplitudes,
                                   initial_state, float(radial_bound))
