"""RMSNorm, y = x / sqrt(mean(x^2) + eps) * weight in fp32, returned in x's dtype or one asked for, alone or
after a residual sum (add_rms_norm): a fused Triton kernel forward and one backward on CUDA
(``rmsnorm_triton``), PyTorch ops elsewhere and while torch.compile traces (Inductor fuses those itself)."""

from __future__ import annotations

import torch

from samu.ops.glue import fused_kernels


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float, dtype=None) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(dtype or x.dtype)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, dtype):
        from samu.ops.rmsnorm_triton import rmsnorm_fwd

        y, rstd, _, _ = rmsnorm_fwd(x, weight, eps, dtype=dtype)
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        from samu.ops.rmsnorm_triton import rmsnorm_bwd

        x, weight, rstd = ctx.saved_tensors
        dx, dw, _ = rmsnorm_bwd(dy.contiguous(), x, weight, rstd)
        return dx, dw.to(weight.dtype), None, None


class _AddRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, add, weight, eps, dtype):
        from samu.ops.rmsnorm_triton import rmsnorm_fwd

        y, rstd, total, _ = rmsnorm_fwd(x, weight, eps, dtype=dtype, add=add)
        ctx.save_for_backward(total, weight, rstd)
        ctx.dtypes = x.dtype, add.dtype
        return total, y

    @staticmethod
    def backward(ctx, dtotal, dy):
        from samu.ops.rmsnorm_triton import rmsnorm_bwd

        total, weight, rstd = ctx.saved_tensors
        x_dtype, add_dtype = ctx.dtypes
        # both cotangents are tensors (autograd fills an unused output's with zeros)
        dt, dw, dadd = rmsnorm_bwd(dy.contiguous(), total, weight, rstd, dtotal=dtotal.contiguous(),
                                   add_dtype=add_dtype if add_dtype != total.dtype else None)
        return dt.to(x_dtype), dt if dadd is None else dadd, dw.to(weight.dtype), None, None


def _check_dtype(dtype) -> None:
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating-point torch.dtype or None, got {dtype!r}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, backend: str = "auto", dtype=None) -> torch.Tensor:
    """RMSNorm of x [..., W] with weight [W] over the last dimension, in ``dtype`` (default: x's); backend
    "auto" (fused kernels on CUDA), "torch" or "triton" (samu.ops.glue.fused_kernels decides; float64 output
    takes the PyTorch ops)."""
    _check_dtype(dtype)
    if dtype == torch.float64 or not fused_kernels(x, backend):
        return rms_norm_torch(x, weight, eps, dtype)
    return _RMSNorm.apply(x.contiguous(), weight, eps, dtype)


def add_rms_norm(x: torch.Tensor, add: torch.Tensor, weight: torch.Tensor, eps: float, backend: str = "auto",
                 dtype=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + add, RMSNorm(x + add)) for x and add [..., W] of one shape on one device: the sum in their promoted
    dtype, as PyTorch's add gives it, and its norm (of the sum as stored) in ``dtype`` (default: the sum's). A
    residual stream's update and the next norm in one pass each way on CUDA; backends as rms_norm (each tensor
    must suit the fused kernels for them to run)."""
    if not isinstance(add, torch.Tensor) or add.shape != x.shape or add.device != x.device:
        got = f"{list(add.shape)} on {add.device}" if isinstance(add, torch.Tensor) else type(add).__name__
        raise ValueError(f"add must be a tensor of x's shape {list(x.shape)} on {x.device}, got {got}")
    if not add.is_floating_point():
        raise TypeError(f"add must be a floating-point tensor, got {add.dtype}")
    _check_dtype(dtype)
    if dtype == torch.float64 or not (fused_kernels(x, backend) and fused_kernels(add, backend)):
        total = x + add
        return total, rms_norm_torch(total, weight, eps, dtype)
    return _AddRMSNorm.apply(x.contiguous(), add.contiguous(), weight, eps, dtype)


def rms_norm_shifted(x: torch.Tensor, weight: torch.Tensor, eps: float, shift: torch.Tensor, backend: str = "auto"):
    """(RMSNorm(x), x + shift), both in x's dtype, from one pass over x [..., W] (no autograd): the decoding
    step's norm, whose second output is the residual stream plus the next product's bias, so that the
    product adds the residual in its epilogue (samu.modules.layers.linear_onto)."""
    if not fused_kernels(x, backend):
        return rms_norm_torch(x, weight, eps), (x.float() + shift.float()).to(x.dtype)
    from samu.ops.rmsnorm_triton import rmsnorm_fwd

    y, _, _, shifted = rmsnorm_fwd(x.contiguous(), weight, eps, shift=shift.contiguous())
    return y, shifted
