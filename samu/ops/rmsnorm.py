"""RMSNorm, y = x / sqrt(mean(x^2) + eps) * weight in fp32, returned in x's dtype: a fused Triton kernel
forward and one backward on CUDA (``rmsnorm_triton``), PyTorch ops elsewhere and while torch.compile
traces (Inductor fuses those itself)."""

from __future__ import annotations

import torch

from samu.ops.glue import fused_kernels


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        from samu.ops.rmsnorm_triton import rmsnorm_fwd

        y, rstd, _ = rmsnorm_fwd(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        from samu.ops.rmsnorm_triton import rmsnorm_bwd

        x, weight, rstd = ctx.saved_tensors
        dx, dw = rmsnorm_bwd(dy.contiguous(), x, weight, rstd)
        return dx, dw.to(weight.dtype), None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, backend: str = "auto") -> torch.Tensor:
    """RMSNorm of x [..., W] with weight [W] over the last dimension, in x's dtype; backend "auto" (fused
    kernels on CUDA), "torch" or "triton" (samu.ops.glue.fused_kernels decides)."""
    if not fused_kernels(x, backend):
        return rms_norm_torch(x, weight, eps)
    return _RMSNorm.apply(x.contiguous(), weight, eps)


def rms_norm_shifted(x: torch.Tensor, weight: torch.Tensor, eps: float, shift: torch.Tensor, backend: str = "auto"):
    """(RMSNorm(x), x + shift), both in x's dtype, from one pass over x [..., W] (no autograd): the decoding
    step's norm, whose second output is the residual stream plus the next product's bias, so that the
    product adds the residual in its epilogue (samu.modules.layers.linear_onto)."""
    if not fused_kernels(x, backend):
        return rms_norm_torch(x, weight, eps), (x.float() + shift.float()).to(x.dtype)
    from samu.ops.rmsnorm_triton import rmsnorm_fwd

    y, _, shifted = rmsnorm_fwd(x.contiguous(), weight, eps, shift.contiguous())
    return y, shifted
