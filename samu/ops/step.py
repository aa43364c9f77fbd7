"""One decoding step of each mixer: y_t and the new state from x_t [B, D] and the state [B, D].

backend "triton": a fused Triton kernel per token (``step_triton``, one launch; CUDA, or the interpreter).
Otherwise, and for float64, while torch.compile traces, or when a gradient is wanted (the kernel has no
backward), the serial reference for one token. "auto" takes the serial step until the fused one has run
its tests on a GPU (issue 11). Both evaluate the reference's definitions in the state dtype (fp32; float64
for float64 input), so a token-by-token decode agrees with the full forward within the gates' fp32 rule.
Inputs are the mixers' (checked by the caller).
"""

from __future__ import annotations

import torch

from samu import reference
from samu.ops.glue import fused_kernels
from samu.ops.scan import state_dtype


def _serial(serial, x_t, params, state, *config):
    """One token of a serial reference with autocast off: (y_t in x_t's dtype, new state)."""
    sdt = state_dtype(x_t.dtype)
    h = (torch.zeros(x_t.shape[0], x_t.shape[1], dtype=sdt, device=x_t.device) if state is None
         else state.to(sdt))
    with torch.autocast(x_t.device.type, enabled=False):
        y = serial(x_t.unsqueeze(1), *params, h, *config, sdt)[:, 0]
    return y.to(x_t.dtype), y


# the widest RG-LRU head the fused step takes (its gate rows live in registers); wider ones step serially
MAX_HEAD_DIM = 256


def _runs_fused(x_t, state, params, backend) -> bool:
    if backend != "triton" or x_t.dtype == torch.float64:
        return False
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x_t, state, *params)):
        return False
    return fused_kernels(x_t, backend)


def _operands(x_t, state, params):
    """x_t, the fp32 parameters and state (contiguous), and a fresh buffer for the new state."""
    h = (torch.zeros(x_t.shape, dtype=torch.float32, device=x_t.device) if state is None
         else state.to(torch.float32).contiguous())
    return x_t.contiguous(), [p.to(torch.float32).contiguous() for p in params], h, torch.empty_like(h)


def samu_step(x_t, nu, theta_log, directions, amplitudes, state=None, radial_bound=2.0, backend="auto"):
    """(y_t [B, D] in x_t's dtype, new state [B, D] fp32, float64 for float64 x_t) of the SAMU mixer."""
    params = (nu, theta_log, directions, amplitudes)
    if not _runs_fused(x_t, state, params, backend):
        return _serial(reference.samu_serial, x_t, params, state, radial_bound)
    from samu.ops import step_triton

    x, params, h, h_out = _operands(x_t, state, params)
    return step_triton.samu_step(x, *params, h, radial_bound, h_out), h_out


def rglru_step(x_t, w_a, b_a, w_x, b_x, a_param, state=None, c=8.0, backend="auto"):
    """(y_t [B, D] in x_t's dtype, new state [B, D] fp32, float64 for float64 x_t) of the RG-LRU mixer."""
    params = (w_a, b_a, w_x, b_x, a_param)
    if w_a.shape[-1] > MAX_HEAD_DIM or not _runs_fused(x_t, state, params, backend):
        return _serial(reference.rglru_serial, x_t, params, state, c)
    from samu.ops import step_triton

    x, params, h, h_out = _operands(x_t, state, params)
    return step_triton.rglru_step(x, *params, h, c, h_out), h_out
