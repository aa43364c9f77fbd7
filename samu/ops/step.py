"""One decoding step of each mixer: y_t and the new state from x_t [B, D] and the state [B, D].

A fused Triton kernel per token on CUDA (``step_triton``, one launch); elsewhere, for float64 and while
torch.compile traces, the serial reference for one token. Both evaluate the reference's definitions in
the state dtype (fp32; float64 for float64 input), so a token-by-token decode agrees with the full forward
within the gates' fp32 rule. Inputs are the mixers' (checked by the caller).
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


def _fused(x_t, state, backend):
    """(x_t contiguous, the fp32 state, a fresh state buffer) when the fused step runs, else None."""
    if x_t.dtype == torch.float64 or x_t.requires_grad or not fused_kernels(x_t, backend):
        return None
    h = (torch.zeros(x_t.shape, dtype=torch.float32, device=x_t.device) if state is None
         else state.to(torch.float32).contiguous())
    return x_t.contiguous(), h, torch.empty_like(h)


def samu_step(x_t, nu, theta_log, directions, amplitudes, state=None, radial_bound=2.0, backend="auto"):
    """(y_t [B, D] in x_t's dtype, new state [B, D] fp32, float64 for float64 x_t) of the SAMU mixer."""
    fused = _fused(x_t, state, backend)
    if fused is None:
        return _serial(reference.samu_serial, x_t, (nu, theta_log, directions, amplitudes), state, radial_bound)
    from samu.ops import step_triton

    x, h, h_out = fused
    y = step_triton.samu_step(x, nu, theta_log, directions.contiguous(), amplitudes.contiguous(), h,
                              radial_bound, h_out)
    return y, h_out


def rglru_step(x_t, w_a, b_a, w_x, b_x, a_param, state=None, c=8.0, backend="auto"):
    """(y_t [B, D] in x_t's dtype, new state [B, D] fp32, float64 for float64 x_t) of the RG-LRU mixer."""
    fused = _fused(x_t, state, backend)
    if fused is None:
        return _serial(reference.rglru_serial, x_t, (w_a, b_a, w_x, b_x, a_param), state, c)
    from samu.ops import step_triton

    x, h, h_out = fused
    y = step_triton.rglru_step(x, w_a.contiguous(), b_a, w_x.contiguous(), b_x, a_param, h, c, h_out)
    return y, h_out
