"""The layers around the mixers: causal depthwise Conv1D, RMSNorm and the GeGLU gated MLP."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from samu.ops.geglu import geglu, linear_geglu
from samu.ops.glue import GLUE_BACKENDS, causal_conv
from samu.ops.linear import autocast_dtype, linear
from samu.ops.rmsnorm import add_rms_norm, rms_norm, rms_norm_shifted
from samu.validate import finite_number, positive_int


def check_tensor(name: str, t, shape, dtype=None) -> torch.Tensor:
    """``t`` if it is a tensor of ``shape`` (and ``dtype``), else a clear error naming ``name``."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(t.shape)}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {t.dtype}")
    return t


def check_sequence(name: str, x, width: int) -> None:
    """A [B, L, width] floating-point activation."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 3 or x.shape[-1] != width or x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"{name} must have shape [B, L, {width}] with B, L >= 1, got {list(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")


def check_token(name: str, x_t, width: int) -> None:
    """A [B, width] floating-point activation: one token per batch row, for step()."""
    if not isinstance(x_t, torch.Tensor) or x_t.dim() != 2 or x_t.shape[1] != width or x_t.shape[0] < 1:
        shape = list(x_t.shape) if isinstance(x_t, torch.Tensor) else type(x_t).__name__
        raise ValueError(f"{name} must have shape [B, {width}] with B >= 1, got {shape}")
    if not x_t.is_floating_point():
        raise TypeError(f"{name} has dtype {str(x_t.dtype).replace('torch.', '')}; expected a floating-point dtype")


def check_weights_dtype(name: str, x: torch.Tensor, weight: torch.Tensor) -> None:
    """With autocast off, an activation in its products' weights' dtype: else a TypeError naming ``name`` (where
    the product's own error would name neither)."""
    if x.dtype != weight.dtype and autocast_dtype(x.device.type) is None:
        raise TypeError(f"{name} has dtype {x.dtype} but the layer's weights are {weight.dtype}: cast the module "
                        f"(e.g. .to({x.dtype})) or run under torch.autocast")


def check_glue_backend(backend: str) -> str:
    if backend not in GLUE_BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(GLUE_BACKENDS)}, got {backend!r}")
    return backend


def linear_onto(residual: torch.Tensor, x: torch.Tensor, module: nn.Linear) -> torch.Tensor:
    """residual + x W^T, where ``residual`` already holds the module's bias (RMSNorm.decode's shifted
    output, a fresh tensor this consumes): the decoding step's product accumulating onto the residual in
    place, in its epilogue (one kernel, no copy), where the dtypes agree and autocast is off, else the
    product and the sum (as the forward promotes them)."""
    w = module.weight
    if residual.dtype == x.dtype == w.dtype and autocast_dtype(x.device.type) is None:
        return residual.addmm_(x, w.t())
    return residual + F.linear(x, w)


def lecun_normal_(module: nn.Linear) -> nn.Linear:
    # Unit-variance outputs for unit-variance inputs, whatever the width.
    nn.init.normal_(module.weight, std=module.in_features ** -0.5)
    if module.bias is not None:
        nn.init.zeros_(module.bias)
    return module


class Linear(nn.Linear):
    """nn.Linear (the same parameters and state dict) whose fp32 weight and bias take their gradients in fp32
    straight from the products under autocast (samu.ops.linear): no bf16 rounding of them, no cast kernel.

    ``low_weight`` (None, not part of the state dict): a bf16 copy of the weight that the products take under bf16
    autocast instead of casting the weight at every call. Whoever sets it keeps it equal to the weight's cast and
    sets it back to None when it stops (``samu.train``'s loop, whose optimizer step writes it)."""

    low_weight: torch.Tensor | None = None

    def forward(self, x):
        return linear(x, self.weight, self.bias, self.low_weight)


class Conv1D(nn.Module):
    """Causal depthwise convolution over time with a bias (Griffin's temporal Conv1D).

    y_t = bias + sum_i weight[i] * x_{t - (K-1) + i}, so ``weight[-1]`` multiplies the current token.
    The state is the last K-1 inputs, [B, K-1, D], in the input dtype (zeros before the sequence).

    forward(x [B, L, D], state [B, K-1, D] | None, return_state) -> (y [B, L, D], state | None)
    step(x_t [B, D], state [B, K-1, D] | None) -> (y_t [B, D], new_state [B, K-1, D])
    """

    def __init__(self, width: int, kernel_size: int = 4, *, device=None, dtype=None):
        super().__init__()
        self.width = positive_int("width", width)
        self.kernel_size = positive_int("kernel_size", kernel_size)
        self.weight = nn.Parameter(torch.empty(kernel_size, width, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(width, device=device, dtype=dtype))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        # Griffin's init (recurrentgemma's Conv1D): variance 0.01 / kernel_size, so the conv starts small.
        nn.init.normal_(self.weight, std=(0.01 / self.kernel_size) ** 0.5)
        nn.init.zeros_(self.bias)

    def empty_state(self, batch: int, device=None, dtype=torch.float32) -> torch.Tensor:
        return torch.zeros(batch, self.kernel_size - 1, self.width, device=device, dtype=dtype)

    def forward(self, x, state=None, return_state=False):
        check_sequence("x", x, self.width)
        if state is not None:
            check_tensor("state", state, (x.shape[0], self.kernel_size - 1, self.width))
            if not state.is_floating_point():
                raise TypeError(f"state must be a floating-point tensor, got {state.dtype}")
            if state.device != x.device:
                raise ValueError(f"state is on {state.device} but x is on {x.device}; move them to one device")
        return causal_conv(x, self.weight, self.bias, state, return_state)

    def step(self, x_t, state=None):
        check_token("x_t", x_t, self.width)
        y, new_state = self(x_t.unsqueeze(1), state, return_state=True)
        return y[:, 0], new_state

    def extra_repr(self):
        return f"width={self.width}, kernel_size={self.kernel_size}"


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, computed in fp32 and returned in x's dtype or ``dtype``
    (samu.ops.rmsnorm: one fused kernel each way on CUDA; ``backend`` "auto", "torch" or "triton").

    forward(x [..., width], dtype=None) -> the norm; add_norm(x, add, dtype=None) -> (x + add, norm of x + add)
    """

    def __init__(self, width: int, eps: float = 1e-6, *, backend: str = "auto", device=None, dtype=None):
        super().__init__()
        self.backend = check_glue_backend(backend)
        self.width = positive_int("width", width)
        self.eps = float(finite_number("eps", eps, positive=True))
        self.weight = nn.Parameter(torch.ones(width, device=device, dtype=dtype))

    def reset_parameters(self):
        nn.init.ones_(self.weight)

    def _check(self, name, x):
        if not isinstance(x, torch.Tensor) or x.shape[-1:] != (self.width,):
            shape = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"{name} must have shape [..., {self.width}], got {shape}")
        if not x.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")

    def forward(self, x, dtype=None):
        self._check("x", x)
        return rms_norm(x, self.weight, self.eps, self.backend, dtype)

    def add_norm(self, x, add, dtype=None):
        """(x + add, its norm in ``dtype`` or the sum's): a residual stream's update and the norm after it, in
        one pass each way on CUDA (samu.ops.rmsnorm.add_rms_norm, which checks ``add``)."""
        self._check("x", x)
        return add_rms_norm(x, add, self.weight, self.eps, self.backend, dtype)

    def decode(self, x_t, shift):
        """(RMSNorm(x_t), x_t + shift) in one pass, unchecked: the decoding step's norm (rms_norm_shifted)."""
        return rms_norm_shifted(x_t, self.weight, self.eps, shift, self.backend)

    def extra_repr(self):
        return f"width={self.width}, eps={self.eps}" + _backend_repr(self.backend)


def product_dtype(x: torch.Tensor):
    """The dtype a product under autocast takes fp32 ``x`` in (autocast's, where it is on for x's device), or
    None: a norm that feeds only products writes its output in it, so that no cast follows it."""
    return autocast_dtype(x.device.type) if x.dtype == torch.float32 else None


def _backend_repr(backend: str) -> str:
    return "" if backend == "auto" else f", backend={backend!r}"


class GatedMLP(nn.Module):
    """GeGLU feed-forward: (GeLU(x W_gate + b) * (x W_up + b)) W_down + b, hidden = expansion * width
    (the gate one fused kernel each way on CUDA, samu.ops.geglu; ``backend`` "auto", "torch" or "triton").
    The forward runs gate_up's product and the gate as one unit (samu.ops.geglu.linear_geglu), reading gate_up's
    parameters without calling the module: hooks on ``gate_up`` itself do not fire."""

    def __init__(self, width: int, expansion: int = 3, *, backend: str = "auto", device=None, dtype=None):
        super().__init__()
        self.width = positive_int("width", width)
        self.expansion = positive_int("expansion", expansion)
        self.backend = check_glue_backend(backend)
        hidden = expansion * width
        kw = dict(device=device, dtype=dtype)
        self.gate_up = Linear(width, 2 * hidden, **kw)
        self.down = Linear(hidden, width, **kw)
        self.reset_parameters()

    def reset_parameters(self):
        lecun_normal_(self.gate_up)
        lecun_normal_(self.down)

    def forward(self, x):
        if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] != self.width:
            shape = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x must have shape [..., {self.width}], got {shape}")
        if not x.is_floating_point():
            raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
        check_weights_dtype("x", x, self.gate_up.weight)
        up = self.gate_up
        return self.down(linear_geglu(x, up.weight, up.bias, up.low_weight, self.backend))

    def decode(self, x_t, residual):
        """residual + GatedMLP(x_t) for x_t [B, width], with ``residual`` holding the down product's bias
        (RMSNorm.decode), unchecked: the decoding step's MLP."""
        return linear_onto(residual, geglu(self.gate_up(x_t), self.backend), self.down)

    def extra_repr(self):
        return f"width={self.width}, expansion={self.expansion}" + _backend_repr(self.backend)
