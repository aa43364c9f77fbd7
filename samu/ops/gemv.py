"""Decoding's skinny products: ``linear`` (x W^T + b, plus a residual) and ``geglu`` (the gated MLP's
GeLU(x W_g^T + b_g) * (x W_u^T + b_u)) for x [M, K] of a few rows, one token per batch row, each optionally
of RMSNorm(x) (``norm`` = (its weight, eps)).

On CUDA (backend "auto", or "triton" wherever Triton runs) they are one Triton kernel each
(``gemv_triton``), with the RMSNorm (up to NORM_ROWS rows; a separate kernel for more), the bias, the
residual sum and the GeLU gate fused; elsewhere, for more than MAX_ROWS rows, under autocast, or when the
weight's dtype is not x's, the same maths as PyTorch ops (rms_norm, F.linear, then the sums), which is also
what the modules' forward computes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from samu.ops.glue import fused_kernels
from samu.ops.rmsnorm import rms_norm

# the most rows one kernel takes; the most whose RMSNorm each program recomputes (beyond, a kernel of its own)
MAX_ROWS, NORM_ROWS = 64, 16
# the plain products, or the GeGLU, through cuBLAS instead, with the RMSNorm, the residual sum and the gate
# as kernels of their own (set by scripts/gpu_gen.py to compare)
CUBLAS_LINEAR = CUBLAS_GEGLU = False


def _fused(x, weight, backend) -> bool:
    return (x.dim() == 2 and x.shape[0] <= MAX_ROWS and weight.dtype == x.dtype
            and not torch.is_autocast_enabled(x.device.type) and fused_kernels(x, backend))


def _kernel(x, weight, bias, residual, geglu, norm, backend):
    from samu.ops.gemv_triton import gemv

    if norm is not None and x.shape[0] > NORM_ROWS:
        x, norm = rms_norm(x, *norm, backend), None
    return gemv(x.contiguous(), weight.contiguous(), bias, None if residual is None else residual.contiguous(),
                geglu, norm)


def linear(x: torch.Tensor, weight: torch.Tensor, bias=None, residual=None, backend: str = "auto",
           norm=None) -> torch.Tensor:
    """residual + (x' W^T + b) in x's dtype, x' = RMSNorm(x) with norm = (weight [K], eps), else x; residual
    None: no sum. x [M, K], weight [N, K]."""
    if not _fused(x, weight, backend):
        x = x if norm is None else rms_norm(x, *norm, backend)
        y = F.linear(x, weight, bias)
        return y if residual is None else residual + y
    if CUBLAS_LINEAR:
        y = F.linear(x if norm is None else rms_norm(x, *norm, backend), weight, bias)
        return y if residual is None else residual + y
    return _kernel(x, weight, bias, residual, False, norm, backend)


def geglu(x: torch.Tensor, weight: torch.Tensor, bias=None, backend: str = "auto", norm=None) -> torch.Tensor:
    """GeLU(x' W_g^T + b_g) * (x' W_u^T + b_u) [M, H] with weight = [W_g; W_u] [2H, K], bias [2H] and x' as
    for ``linear``."""
    if not _fused(x, weight, backend) or CUBLAS_GEGLU:
        x = x if norm is None else rms_norm(x, *norm, backend)
        gate, up = F.linear(x, weight, bias).chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up
    return _kernel(x, weight, bias, None, True, norm, backend)
