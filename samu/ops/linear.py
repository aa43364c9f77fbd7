"""x W^T + b under autocast with the weight's gradient in its own dtype straight from the product.

Under autocast an fp32 weight enters a bf16 (or fp16) product through a cast, and autograd takes its
gradient back through that cast: the product writes dW in bf16, rounded to 8 significant bits, and a
second kernel converts it to fp32 for the weight's ``.grad`` (a read of 2 and a write of 4 bytes a
parameter, every step). ``linear`` asks the product for fp32 output instead (``torch.mm(...,
out_dtype=torch.float32)``, cuBLAS accumulating in fp32 as before): the same forward and input gradient to
the bit, the weight and bias gradients unrounded, and no cast kernel. Elsewhere (no autocast, a weight in
the product's dtype, no gradient wanted) it is ``F.linear``. The backward runs with autocast off wherever it is
called (torch.compile traces it under the forward's autocast state), so its products keep these dtypes. Not
supported under autocast: torch.func transforms and double backward (an autograd.Function that saves the cast
weight, as autocast's own product does).

A caller that keeps the weight's cast itself (``samu train``'s optimizer writes one beside every weight) hands it
over as ``low_weight``, and the product takes it instead of casting the weight again. ``autocast_product`` and
``autocast_product_grads`` are the product's forward and backward, shared with samu.ops.geglu's product-and-gate
unit.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

_LOW = (torch.bfloat16, torch.float16)
# the device types autocast knows, asked once here: inside a torch.compile trace the question itself is not
# traceable in every PyTorch version (2.11 breaks the graph at it), while the state of a known device is
_AUTOCAST_KINDS = frozenset(kind for kind in ("cpu", "cuda", "xpu", "mps", "hpu", "mtia", "xla",
                                             torch._C._get_privateuse1_backend_name())
                            if torch.amp.is_autocast_available(kind))


def autocast_dtype(kind: str) -> torch.dtype | None:
    """The dtype autocast casts products to on device type ``kind``, or None where it is off (or unknown)."""
    if kind in _AUTOCAST_KINDS and torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return None


def no_autocast(kind: str):
    """A context with autocast off for device type ``kind`` (nothing to turn off on a type it does not know):
    for backward passes whose products must keep their operands' dtypes."""
    return torch.autocast(kind, enabled=False) if kind in _AUTOCAST_KINDS else contextlib.nullcontext()


def _mm_fp32(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    # one product accumulating in fp32 and writing fp32 on CUDA; elsewhere (no such product there, and ROCm's is
    # untested) the same sums from the exact fp32 values of the operands
    if dy.is_cuda and torch.version.hip is None:
        return torch.mm(dy.t(), x, out_dtype=torch.float32)
    return torch.mm(dy.t().float(), x.float())


@torch.library.custom_op("samu::grad_weight", mutates_args=())
def _grad_weight_op(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return _mm_fp32(dy, x)


@_grad_weight_op.register_fake
def _(dy, x):
    return dy.new_empty(dy.shape[1], x.shape[1], dtype=torch.float32)


def _grad_weight(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """dy^T x in fp32 from low-precision rows dy [M, O], x [M, I]. Inside a torch.compile trace it is the
    custom op ``samu::grad_weight``, which Inductor calls as it is (``mm`` with ``out_dtype`` has no
    lowering or fake kernel in some PyTorch versions)."""
    return _grad_weight_op(dy, x) if torch.compiler.is_compiling() else _mm_fp32(dy, x)


def autocast_product(ctx, x, weight, bias, dtype, low_weight):
    """The forward of an autocast product inside an autograd Function's forward (autocast off there): y in
    ``dtype`` and the cast operands (xc, wc), which the Function saves for ``autocast_product_grads``;
    ``low_weight`` (``linear``'s) stands in for the weight's cast where it is in ``dtype``."""
    fits = low_weight is not None and low_weight.dtype == dtype
    xc, wc = x.to(dtype), low_weight if fits else weight.to(dtype)
    ctx.x_dtype, ctx.has_bias, ctx.low = x.dtype, bias is not None, dtype
    return F.linear(xc, wc, None if bias is None else bias.to(dtype)), xc, wc


def autocast_product_grads(ctx, dy, xc, wc, bias_grad=None):
    """dx, dW, db of ``autocast_product`` from dy (autocast off): dx in x's dtype, dW and db fp32; db the sum of dy
    over its rows, or ``bias_grad`` where the caller has it already."""
    needs = ctx.needs_input_grad
    with no_autocast(dy.device.type):
        dy = dy.to(ctx.low)
        dx = dw = db = None
        if needs[0]:
            dx = (dy @ wc).to(ctx.x_dtype)
        rows = dy.reshape(-1, dy.shape[-1])
        if needs[1]:
            dw = _grad_weight(rows, xc.reshape(-1, xc.shape[-1]))
        if ctx.has_bias and needs[2]:
            db = rows.sum(0, dtype=torch.float32) if bias_grad is None else bias_grad
    return dx, dw, db


class _AutocastLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, dtype, low):
        y, xc, wc = autocast_product(ctx, x, weight, bias, dtype, low)
        ctx.save_for_backward(xc, wc)
        return y

    @staticmethod
    def backward(ctx, dy):
        return *autocast_product_grads(ctx, dy, *ctx.saved_tensors), None, None


def autocast_low(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.dtype | None:
    """The dtype autocast takes ``linear``'s product to where ``linear`` takes its own path there (bf16 or fp16
    autocast, fp32 parameters that want gradients, x fp32 or that dtype), else None."""
    low = autocast_dtype(x.device.type)
    if (low in _LOW and weight.dtype == torch.float32 and torch.is_grad_enabled() and weight.requires_grad
            and (bias is None or bias.dtype == torch.float32) and x.dtype in (torch.float32, *_LOW)):
        return low
    return None


def check_low_weight(low_weight: torch.Tensor | None, weight: torch.Tensor) -> None:
    """A one-line error naming ``low_weight`` where it is not a tensor of the weight's shape on its device."""
    if low_weight is not None and (not isinstance(low_weight, torch.Tensor) or low_weight.shape != weight.shape
                                   or low_weight.device != weight.device):
        got = (f"{type(low_weight).__name__}" if not isinstance(low_weight, torch.Tensor)
               else f"{list(low_weight.shape)} on {low_weight.device}")
        raise ValueError(f"low_weight must be a tensor of the weight's shape {list(weight.shape)} on {weight.device}, "
                         f"got {got}")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           low_weight: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., I] W^T [I, O] + b [O] -> [..., O]; under autocast to bf16 or fp16 with fp32 parameters that want
    gradients, their gradients come out of the products in fp32 (module docstring). Forward values are
    autocast's own. ``low_weight``: the weight already cast to autocast's dtype (``weight.to(dtype)`` to the bit,
    which the caller keeps true), taken in place of that cast where autocast would cast the weight; a copy in
    another dtype is not used."""
    low = autocast_low(x, weight, bias)
    if low is not None:
        check_low_weight(low_weight, weight)
        with no_autocast(x.device.type):
            return _AutocastLinear.apply(x, weight, bias, low, low_weight)
    return F.linear(x, weight, bias)
