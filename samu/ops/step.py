"""One decoding step of each mixer, alone or as the RecurrentBlock's step between its projections.

``samu_step`` / ``rglru_step``: y_t and the new state from x_t [B, D] and the state [B, D].
``samu_block_step`` / ``rglru_block_step``: from the block's in-projection row z = [z_x | z_y] [B, 2D],
y_t = mixer(Conv1D(z_x))_t * GeLU(z_y), with the Conv1D state [B, K-1, D] and the mixer state [B, D]
updated in place (the decoding loop's buffers, samu.models.generate).

The fused Triton kernels (``step_triton``, one launch per token and block) run under "auto" on CUDA and
under "triton" or a Triton variant wherever Triton runs. Otherwise, for float64, while torch.compile
traces, for a Conv1D wider than the fused glue's, RG-LRU heads wider than MAX_HEAD_DIM, or when a gradient
is wanted (the kernels have no backward): the serial reference for one token, with the block's Conv1D and
GeLU as PyTorch ops. Both evaluate the reference's definitions in the state dtype (fp32; float64 for
float64 input), so a token-by-token decode agrees with the full forward within the gates' fp32 rule.
Inputs are the mixers' (checked by the caller).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from samu import reference
from samu.ops.glue import FUSED_MAX_WIDTH, causal_conv, fused_kernels, last_inputs
from samu.ops.scan import state_dtype

# the widest RG-LRU head the fused step takes (its gate rows live in registers); wider ones step serially
MAX_HEAD_DIM = 256


def _serial(serial, x_t, params, state, *config):
    """One token of a serial reference with autocast off: (y_t in x_t's dtype, new state), never one tensor (a
    caller may change y_t in place)."""
    sdt = state_dtype(x_t.dtype)
    h = (torch.zeros(x_t.shape[0], x_t.shape[1], dtype=sdt, device=x_t.device) if state is None
         else state.to(sdt))
    with torch.autocast(x_t.device.type, enabled=False):
        y = serial(x_t.unsqueeze(1), *params, h, *config, sdt)[:, 0]
    return y.to(x_t.dtype, copy=True), y


def _runs_fused(x_t, tensors, backend) -> bool:
    if backend not in ("auto", "triton") or x_t.dtype == torch.float64:
        return False
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x_t, *tensors)):
        return False
    return fused_kernels(x_t, backend)


def _fp32(params):
    """The mixer parameters as the kernels read them: fp32, contiguous."""
    return [p.to(torch.float32).contiguous() for p in params]


def _operands(x_t, state, params):
    """x_t, the fp32 parameters and state (contiguous), and a fresh buffer for the new state."""
    h = (torch.zeros(x_t.shape, dtype=torch.float32, device=x_t.device) if state is None
         else state.to(torch.float32).contiguous())
    return x_t.contiguous(), _fp32(params), h, torch.empty_like(h)


def samu_step(x_t, nu, theta_log, directions, amplitudes, state=None, radial_bound=2.0, backend="auto"):
    """(y_t [B, D] in x_t's dtype, new state [B, D] fp32, float64 for float64 x_t) of the SAMU mixer."""
    params = (nu, theta_log, directions, amplitudes)
    if not _runs_fused(x_t, (state, *params), backend):
        return _serial(reference.samu_serial, x_t, params, state, radial_bound)
    from samu.ops import step_triton

    x, params, h, h_out = _operands(x_t, state, params)
    return step_triton.samu_step(x, *params, h, radial_bound, h_out), h_out


def rglru_step(x_t, w_a, b_a, w_x, b_x, a_param, state=None, c=8.0, backend="auto"):
    """(y_t [B, D] in x_t's dtype, new state [B, D] fp32, float64 for float64 x_t) of the RG-LRU mixer."""
    params = (w_a, b_a, w_x, b_x, a_param)
    if w_a.shape[-1] > MAX_HEAD_DIM or not _runs_fused(x_t, (state, *params), backend):
        return _serial(reference.rglru_serial, x_t, params, state, c)
    from samu.ops import step_triton

    x, params, h, h_out = _operands(x_t, state, params)
    return step_triton.rglru_step(x, *params, h, c, h_out), h_out


def fuses_block_step(mixer, z, conv_weight, conv_bias, conv_state, params, mixer_state, backend) -> bool:
    """Whether the block's step around ``mixer`` ("samu" or "rglru") from z [B, 2E] runs the fused Triton kernel."""
    return (conv_weight.shape[0] <= FUSED_MAX_WIDTH and mixer_state.dtype == torch.float32
            and (mixer == "samu" or params[0].shape[-1] <= MAX_HEAD_DIM)
            and all(t.is_contiguous() for t in (z, conv_state, mixer_state))
            and _runs_fused(z, (conv_weight, conv_bias, conv_state, mixer_state, *params), backend))


def _block_step(mixer, z, conv_weight, conv_bias, conv_state, params, mixer_state, config, backend):
    """The block's y_t from z [B, 2E] around ``mixer`` ("samu" or "rglru"); the states updated in place."""
    E = z.shape[1] // 2
    if fuses_block_step(mixer, z, conv_weight, conv_bias, conv_state, params, mixer_state, backend):
        from samu.ops import step_triton

        fp32 = _fp32(params)
        conv = (conv_weight, conv_bias, conv_state)
        if mixer == "rglru":
            return step_triton.rglru_step(z, *fp32, mixer_state, config, mixer_state, conv=conv)
        # the SAMU kernel may read its parameters before the in-projection has finished, unless they were
        # just copied (a copy kernel would then be the one before it)
        early = all(a is b for a, b in zip(fp32, params))
        return step_triton.samu_step(z, *fp32, mixer_state, config, mixer_state, conv=conv, early=early)
    zx = z[:, None, :E]
    xc, _ = causal_conv(zx, conv_weight, conv_bias, conv_state)
    conv_state.copy_(last_inputs(zx, conv_state, conv_weight.shape[0]))
    serial = reference.samu_serial if mixer == "samu" else reference.rglru_serial
    y, h = _serial(serial, xc[:, 0], params, mixer_state, config)
    mixer_state.copy_(h)
    return y * F.gelu(z[:, E:], approximate="tanh")


def samu_block_step(z, conv_weight, conv_bias, conv_state, nu, theta_log, directions, amplitudes, mixer_state,
                    radial_bound=2.0, backend="auto"):
    """The block's y_t [B, D] in z's dtype from z [B, 2D] around a SAMU mixer; updates conv_state
    [B, K-1, D] and mixer_state [B, D] (fp32; float64 for float64 z) in place."""
    return _block_step("samu", z, conv_weight, conv_bias, conv_state, (nu, theta_log, directions, amplitudes),
                       mixer_state, radial_bound, backend)


def rglru_block_step(z, conv_weight, conv_bias, conv_state, w_a, b_a, w_x, b_x, a_param, mixer_state, c=8.0,
                     backend="auto"):
    """The block's y_t [B, D] in z's dtype from z [B, 2D] around an RG-LRU mixer; states as for
    samu_block_step."""
    return _block_step("rglru", z, conv_weight, conv_bias, conv_state, (w_a, b_a, w_x, b_x, a_param),
                       mixer_state, c, backend)
