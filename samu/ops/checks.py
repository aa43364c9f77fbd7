"""Input validation shared by every backend: clear errors that name the argument (spec §5)."""

from __future__ import annotations

import os

import torch

from samu.validate import finite_number

IO_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# float64 is accepted by the reference and torch backends (ground-truth evaluations), not by Triton.
ALL_DTYPES = IO_DTYPES + (torch.float64,)

_check_finite = os.environ.get("SAMU_CHECK_FINITE", "1") != "0"


def local_part(t: torch.Tensor) -> torch.Tensor:
    """This process's part of a DTensor (a sharded parameter, a replicated norm); any other tensor as it is."""
    # by its method: torch.distributed.tensor need not be importable where nothing is sharded
    return t.to_local() if hasattr(t, "to_local") else t


def set_check_finite(enabled: bool) -> bool:
    """Turn the parameter finiteness check on or off; returns the previous setting.

    The check reads a flag back from the device, which costs one host synchronisation per call on
    CUDA. It is skipped while a CUDA graph is being captured and while torch.compile traces.
    """
    global _check_finite
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be True or False, got {enabled!r}")
    previous, _check_finite = _check_finite, enabled
    return previous


def check_finite_enabled() -> bool:
    return _check_finite


def _tensor(name, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def _float(name, t, dtypes=ALL_DTYPES):
    if t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} has dtype {str(t.dtype).replace('torch.', '')}; expected one of {names}")


def _shape(name, t, shape):
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(t.shape)}")


def _device(name, t, device):
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but the input is on {device}; move them to one device")


def check_input(x, name="x"):
    """(B, L, D) of x, a float tensor [B, L, D] with every size >= 1; else an error naming ``name``."""
    _tensor(name, x)
    if x.dim() != 3:
        raise ValueError(f"{name} must have shape [B, L, D] (rank 3), got rank {x.dim()} with shape {list(x.shape)}")
    _float(name, x)
    B, L, D = x.shape
    if B < 1 or L < 1 or D < 1:
        raise ValueError(f"{name} must have B, L, D >= 1, got shape {list(x.shape)}")
    return B, L, D


class NonFiniteParameters(ValueError):
    """A mixer parameter holds nan or inf (a diverged training run, typically)."""


def _check_params(params, device, nonzero_rows=None):
    """Types, shapes and devices; with the check on, every value finite and, for the
    parameter named ``nonzero_rows``, every row of positive finite squared norm (one synchronisation)."""
    for name, t, shape in params:
        _tensor(name, t)
        _float(name, t, (torch.float32, torch.float64))
        _shape(name, t, shape)
        _device(name, t, device)
    if _check_finite and not _tracing_or_capturing(device):
        # one reduction and one host synchronisation for all parameters; names only on failure
        with torch.no_grad():
            ok = torch.isfinite(torch.cat([t.reshape(-1) for _, t, _ in params])).all()
            rows = {name: t for name, t, _ in params if name == nonzero_rows}
            for t in rows.values():
                norms = t.float().square().sum(dim=1)
                ok = ok & ((norms > 0) & torch.isfinite(norms)).all()
            ok = bool(ok)
        if not ok:
            bad = [name for name, t, _ in params if not bool(torch.isfinite(t).all())]
            if bad:
                raise NonFiniteParameters(f"non-finite values (nan or inf) in parameter(s): {', '.join(bad)}")
            for name, t in rows.items():
                norms = t.float().square().sum(dim=1)
                j = int(torch.nonzero(~((norms > 0) & torch.isfinite(norms)))[0])
                raise ValueError(f"{name} row {j} has a zero norm (or one that under- or overflows in fp32): "
                                 f"the controller's u_j / |u_j| is undefined there")


def _tracing_or_capturing(device) -> bool:
    if torch.compiler.is_compiling():
        return True
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def check_state(initial_state, B, D, device, name):
    """An initial state [B, D] (or None): its type, floating dtype, shape and device."""
    if initial_state is None:
        return
    _tensor(name, initial_state)
    _float(name, initial_state)
    _shape(name, initial_state, (B, D))
    _device(name, initial_state, device)


def check_samu_inputs(x, nu, theta_log, directions, amplitudes, initial_state, radial_bound,
                      state_name="initial_state", x_name="x"):
    """Raise a ValueError/TypeError naming the argument for any bad input (spec §5); a mixer's step passes
    its own argument names (x_t, state). The decoding paths (block and model decode) skip these checks:
    ``generate`` checks the parameters once a call."""
    B, L, D = check_input(x, x_name)
    if D % 2:
        raise ValueError(f"{x_name} has odd width D={D}; SAMU needs an even D (N = D/2 complex modes)")
    n = D // 2
    _check_params([("nu", nu, (n,)), ("theta_log", theta_log, (n,)),
                   ("directions", directions, (2, D)), ("amplitudes", amplitudes, (2, 2))], x.device,
                  nonzero_rows="directions")
    check_state(initial_state, B, D, x.device, state_name)
    finite_number("radial_bound", radial_bound, positive=True)


def check_rglru_inputs(x, w_a, b_a, w_x, b_x, a_param, initial_state, c, state_name="initial_state", x_name="x"):
    B, L, D = check_input(x, x_name)
    _tensor("w_a", w_a)
    if w_a.dim() != 3 or w_a.shape[1] != w_a.shape[2] or w_a.shape[0] * w_a.shape[1] != D:
        raise ValueError(f"w_a must have shape [H, D/H, D/H] with H * (D/H) = D = {D}, got {list(w_a.shape)}")
    H = w_a.shape[0]
    _check_params([("w_a", w_a, (H, D // H, D // H)), ("w_x", w_x, (H, D // H, D // H)),
                   ("b_a", b_a, (D,)), ("b_x", b_x, (D,)), ("a_param", a_param, (D,))], x.device)
    check_state(initial_state, B, D, x.device, state_name)
    finite_number("c", c, positive=True)
