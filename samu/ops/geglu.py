"""The GeGLU gate of the gated MLP: a = GeLU_tanh(gate) * up from z = [gate | up] [..., 2H].

``geglu`` runs it as one fused Triton kernel forward and one backward on CUDA (``geglu_triton``), or as
the PyTorch ops below elsewhere. Inside a torch.compile trace the kernels are the custom ops
``samu::geglu_fwd`` and ``samu::geglu_bwd``: Inductor's own fusion of these ops took 2.3x the kernels'
time at 4 x 2048 tokens and 3.4x at 1 x 32768, where it folded the bias gradient's sum over tokens into
the gate's backward (``results/dev/issue10/model_profile_2/``). The fused kernels round where the PyTorch
ops round, so the two agree to the last bit up to GeLU's tanh (a few fp32 ulps before the rounding to the
storage dtype).

``linear_geglu`` is the MLP's product and gate, geglu(linear(x, W, b)): under autocast, where samu.ops.linear
takes its own path and the fused kernels run, one autograd unit whose backward takes the bias gradient from the
GeGLU backward kernel (``samu::geglu_bwd_sums``: dz summed over rows as it is written) instead of a pass over dz
of its own (the MLP's widest tensor: 0.5-0.7 ms a training step for the 400m preset on an H200,
``results/dev/session15/``). The same values, db the same fp32 sum in another order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from samu.ops.glue import fused_kernels
from samu.ops.linear import (autocast_low, autocast_product, autocast_product_grads, check_low_weight, linear,
                              no_autocast)


def geglu_torch(z: torch.Tensor) -> torch.Tensor:
    """GeLU_tanh(gate) * up by PyTorch ops: the unfused gate, the ground the fused kernels are tested against."""
    gate, up = z.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


@torch.library.custom_op("samu::geglu_fwd", mutates_args=())
def geglu_fwd_op(z: torch.Tensor) -> torch.Tensor:
    from samu.ops.geglu_triton import geglu_fwd

    return geglu_fwd(z.contiguous())   # the kernels index rows densely; free when Inductor's layout already is


@geglu_fwd_op.register_fake
def _(z):
    return z.new_empty(*z.shape[:-1], z.shape[-1] // 2)


@torch.library.custom_op("samu::geglu_bwd", mutates_args=())
def geglu_bwd_op(da: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    from samu.ops.geglu_triton import geglu_bwd

    return geglu_bwd(da.contiguous(), z.contiguous())


@geglu_bwd_op.register_fake
def _(da, z):
    return torch.empty_like(z)


@torch.library.custom_op("samu::geglu_bwd_sums", mutates_args=())
def geglu_bwd_sums_op(da: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from samu.ops.geglu_triton import geglu_bwd_sums

    return geglu_bwd_sums(da.contiguous(), z.contiguous())


@geglu_bwd_sums_op.register_fake
def _(da, z):
    return torch.empty_like(z), z.new_empty(z.shape[-1], dtype=torch.float32)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _backward(ctx, da):
    (z,) = ctx.saved_tensors
    return geglu_bwd_op(da, z)


geglu_fwd_op.register_autograd(_backward, setup_context=_setup_context)


class _GeGLU(torch.autograd.Function):
    """The eager form of the ops above (an autograd Function dispatches in less host time than a custom op)."""

    @staticmethod
    def forward(ctx, z):
        from samu.ops.geglu_triton import geglu_fwd

        ctx.save_for_backward(z)
        return geglu_fwd(z)

    @staticmethod
    def backward(ctx, da):
        from samu.ops.geglu_triton import geglu_bwd

        (z,) = ctx.saved_tensors
        return geglu_bwd(da.contiguous(), z)


class _LinearGeGLU(torch.autograd.Function):
    """geglu(linear(x, W, b)) under autocast as one unit: its backward takes the bias gradient from the GeGLU
    backward kernel, which sums dz over its rows as it writes it (samu.ops.geglu_triton.geglu_bwd_sums),
    instead of a pass of its own over dz (the MLP's widest tensor)."""

    @staticmethod
    def forward(ctx, x, weight, bias, dtype, low_weight):
        from samu.ops.geglu_triton import geglu_fwd

        z, xc, wc = autocast_product(ctx, x, weight, bias, dtype, low_weight)
        ctx.save_for_backward(xc, wc, z)
        return geglu_fwd_op(z) if torch.compiler.is_compiling() else geglu_fwd(z)

    @staticmethod
    def backward(ctx, da):
        from samu.ops.geglu_triton import geglu_bwd_sums

        xc, wc, z = ctx.saved_tensors
        with no_autocast(da.device.type):
            da = da.to(z.dtype).contiguous()
            dz, db = geglu_bwd_sums_op(da, z) if torch.compiler.is_compiling() else geglu_bwd_sums(da, z)
        return *autocast_product_grads(ctx, dz, xc, wc, db), None, None


def linear_geglu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 low_weight: torch.Tensor | None = None, backend: str = "auto") -> torch.Tensor:
    """geglu(linear(x, weight, bias, low_weight), backend) (samu.ops.linear, and ``geglu`` below): the same
    values; where linear takes its autocast path and the fused kernels run, one unit whose bias gradient comes
    out of the GeGLU backward kernel (the sum over tokens of dz, in a fixed order: fp32 sums of the stored dz
    like linear's, in another order)."""
    low = autocast_low(x, weight, bias)
    if low is None or bias is None or not bias.requires_grad or not fused_kernels(x, backend, traced=True):
        return geglu(linear(x, weight, bias, low_weight), backend)
    check_low_weight(low_weight, weight)
    with no_autocast(x.device.type):
        return _LinearGeGLU.apply(x, weight, bias, low, low_weight)


def geglu(z: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """a [..., H] in z's dtype from z [..., 2H]; backend "auto" (fused kernels on CUDA, in a torch.compile
    trace too), "torch" or "triton" (samu.ops.glue.fused_kernels decides)."""
    if not fused_kernels(z, backend, traced=True):
        return geglu_torch(z)
    if torch.compiler.is_compiling():
        return geglu_fwd_op(z.contiguous())
    return _GeGLU.apply(z.contiguous())
