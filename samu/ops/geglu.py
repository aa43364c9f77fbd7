"""The GeGLU gate of the gated MLP: a = GeLU_tanh(gate) * up from z = [gate | up] [..., 2H].

``geglu`` runs it as one fused Triton kernel forward and one backward on CUDA (``geglu_triton``), or as
the PyTorch ops below elsewhere and while torch.compile traces (Inductor fuses those itself). The fused
kernels round where the PyTorch ops round, so the two agree to the last bit up to GeLU's tanh (a few
fp32 ulps before the rounding to the storage dtype).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from samu.ops.glue import fused_kernels


def geglu_torch(z: torch.Tensor) -> torch.Tensor:
    """GeLU_tanh(gate) * up by PyTorch ops: the unfused gate, the ground the fused kernels are tested against."""
    gate, up = z.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


class _GeGLU(torch.autograd.Function):
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


def geglu(z: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """a [..., H] in z's dtype from z [..., 2H]; backend "auto" (fused kernels on CUDA), "torch" or
    "triton" (samu.ops.glue.fused_kernels decides)."""
    if not fused_kernels(z, backend):
        return geglu_torch(z)
    return _GeGLU.apply(z.contiguous())
