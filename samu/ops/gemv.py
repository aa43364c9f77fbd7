"""Decoding's skinny products: ``linear`` (x W^T + b, plus a residual) and ``geglu`` (the gated MLP's
GeLU(x W_g^T + b_g) * (x W_u^T + b_u)) for x [M, K] of a few rows, one token per batch row.

On CUDA (backend "auto", or "triton" wherever Triton runs) they are one bandwidth-bound Triton kernel each
(``gemv_triton``), with the bias, the residual sum and the GeLU gate fused; elsewhere, for more than
MAX_ROWS rows, under autocast, or when the weight's dtype is not x's, the same maths as PyTorch ops
(F.linear, then the sums), which is also what the modules' forward computes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from samu.ops.glue import fused_kernels

MAX_ROWS = 64


def _fused(x, weight, backend) -> bool:
    return (x.dim() == 2 and x.shape[0] <= MAX_ROWS and weight.dtype == x.dtype
            and not torch.is_autocast_enabled(x.device.type) and fused_kernels(x, backend))


def linear(x: torch.Tensor, weight: torch.Tensor, bias=None, residual=None, backend: str = "auto") -> torch.Tensor:
    """residual + (x W^T + b) in x's dtype (residual None: no sum), x [M, K], weight [N, K]."""
    if not _fused(x, weight, backend):
        y = F.linear(x, weight, bias)
        return y if residual is None else residual + y
    from samu.ops.gemv_triton import gemv

    return gemv(x.contiguous(), weight.contiguous(), bias, None if residual is None else residual.contiguous(),
                False)


def geglu(x: torch.Tensor, weight: torch.Tensor, bias=None, backend: str = "auto") -> torch.Tensor:
    """GeLU(x W_g^T + b_g) * (x W_u^T + b_u) [M, H] with weight = [W_g; W_u] [2H, K] and bias [2H]."""
    if not _fused(x, weight, backend):
        gate, up = F.linear(x, weight, bias).chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up
    from samu.ops.gemv_triton import gemv

    return gemv(x.contiguous(), weight.contiguous(), bias, None, True)
