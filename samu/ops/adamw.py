"""AdamW with the gradients clipped to a total norm, in two passes over the parameters: ``samu train``'s optimizer
step on CUDA.

torch's fused AdamW can take the clip as its ``grad_scale``, but it writes the divided gradients back, and the
norm before it is a pass of its own (per-tensor norms, their norm, the divisor): 4.49 ms of kernels a step for the
400m preset at 4 x 2048 on an H200, against 3.17 ms for the AdamW alone (``results/dev/session8/call4/``). Here
one kernel sums the squared gradients over fixed chunks, one adds those sums in one order and forms the norm and
the divisor, and one updates every parameter and both moments from the divided gradients, reading each tensor once
and writing the gradients not at all: 32 bytes a parameter, 12.8 GB a step for that preset (3.0 ms at 4.2 TB/s).

The optimizer stays a ``torch.optim.AdamW``: the same state (``exp_avg``, ``exp_avg_sq`` and the float32 step
counter on the parameter's device that its fused form keeps) and the same ``state_dict``, so a checkpoint moves
between this step and torch's. The update is torch's: decoupled weight decay p (1 - lr wd), the moments, the bias
corrections in float64 from the step counter, p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps); each element in
fp32 in the same order of operations as torch's fused kernel, which mixes in float64 where it multiplies by a
hyperparameter, so the two agree to a few fp32 roundings, not to the bit. The squared gradients are summed in a
fixed order: every run with the same gradients gives the same norm and the same parameters.
"""

from __future__ import annotations

import numpy as np
import torch

from samu.ops import dispatch


class ClippedAdamW(torch.optim.AdamW):
    """torch's AdamW whose ``step`` clips the gradients to a total norm of ``max_norm`` first, both on the kernels
    here (``clipped_step``; ``unsupported`` says where they cannot run). ``grad_norm`` holds the last step's norm
    before clipping (a device scalar). Its state and ``state_dict`` are AdamW's (make it with ``fused=True`` on CUDA
    so that a loaded step counter lands on the device, as the kernels read it there)."""

    def __init__(self, params, max_norm: float, **kwargs):
        if not max_norm > 0:
            raise ValueError(f"max_norm must be positive, got {max_norm}")
        super().__init__(params, **kwargs)
        self.max_norm = float(max_norm)
        self.grad_norm = None

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.grad_norm = clipped_step(self, self.max_norm)
        return loss


def unsupported(optimizer: torch.optim.Optimizer) -> str | None:
    """Why ``clipped_step`` cannot step ``optimizer`` (None where it can): it takes a ``torch.optim.AdamW`` (or a
    ClippedAdamW) without amsgrad, maximize or differentiable, with float hyperparameters, over dense contiguous
    fp32 parameters of one device that are plain tensors (not sharded DTensors), on CUDA or in the Triton
    interpreter."""
    if type(optimizer) not in (torch.optim.AdamW, ClippedAdamW):
        return f"it steps torch.optim.AdamW only, not {type(optimizer).__name__}"
    device = None
    for group in optimizer.param_groups:
        for flag in ("amsgrad", "maximize", "differentiable"):
            if group.get(flag):
                return f"AdamW with {flag}=True"
        if any(isinstance(group[k], torch.Tensor) for k in ("lr", "weight_decay", "eps")) or any(
                isinstance(b, torch.Tensor) for b in group["betas"]):
            return "tensor hyperparameters"
        for p in group["params"]:
            if type(p.detach()) is not torch.Tensor:
                return f"parameters of type {type(p.detach()).__name__} (sharded)"
            if p.dtype != torch.float32 or not p.is_contiguous():
                return "parameters that are not contiguous fp32"
            if device is None:
                device = p.device
            elif p.device != device:
                return "parameters on more than one device"
    if device is None:
        return "no parameters"
    return dispatch.triton_unusable(device)


def _bits(x: float) -> int:
    return int(np.array(float(x), dtype=np.float64).view(np.int64))


def _check(t: torch.Tensor, what: str, i: int, width: int = 16) -> None:
    if t.dtype != torch.float32 or t.is_sparse or (t.dim() and not t.is_contiguous()) or t.data_ptr() % width:
        raise ValueError(f"clipped_step: the {what} of parameter {i} is not a dense contiguous fp32 tensor on a "
                         f"{width}-byte boundary")


class _Rows:
    """The table's rows but the gradients' offsets, for one set of parameters and state tensors (checked once: the
    host time of a step matters, results/dev/session12/call4), and the chunks, which depend on the sizes alone."""

    def __init__(self, entries, device):
        from samu.ops.adamw_triton import CHUNK, COLUMNS, M, NUMEL, P, STEP, V

        self.base = entries[0][0]
        base = self.base.data_ptr()
        self.fixed = np.zeros((len(entries), COLUMNS), dtype=np.int64)
        for i, (p, _, state, _) in enumerate(entries):
            if state["step"].device != p.device:
                raise ValueError(f"clipped_step: the step counter of parameter {i} is on {state['step'].device}, "
                                 f"not {p.device} (an AdamW made with fused=True keeps it there)")
            for column, t, what, width in ((P, p, "data", 16), (M, state["exp_avg"], "exp_avg", 16),
                                           (V, state["exp_avg_sq"], "exp_avg_sq", 16),
                                           (STEP, state["step"], "step counter", 4)):
                _check(t, what, i, width)
                self.fixed[i, column] = (t.data_ptr() - base) // 4
            self.fixed[i, NUMEL] = p.numel()
        self.steps = [state["step"] for _, _, state, _ in entries]
        pairs = [(r, s) for r, (p, _, _, _) in enumerate(entries) for s in range(0, p.numel(), CHUNK)]
        self.chunks = torch.tensor(pairs, dtype=torch.int64).to(device)


def clipped_step(optimizer: torch.optim.AdamW, max_norm: float) -> torch.Tensor:
    """One AdamW step of ``optimizer`` (``unsupported`` must say None) on every parameter that has a gradient, the
    gradients divided by max(1, (norm + 1e-6) / max_norm) as they are read; returns their total norm before (a
    device scalar, fp32; nan or inf where a gradient is not finite, and then the step writes non-finite values)."""
    from samu.ops.adamw_triton import G, LR, clipped_adamw

    if not max_norm > 0:
        raise ValueError(f"max_norm must be positive, got {max_norm}")
    entries, hyper = [], []
    for gi, group in enumerate(optimizer.param_groups):
        lr, wd, (beta1, beta2), eps = group["lr"], group["weight_decay"], group["betas"], group["eps"]
        hyper.append([_bits(lr), _bits(1.0 - lr * wd), _bits(beta1), _bits(beta2), _bits(eps)])
        for p in group["params"]:
            g = p.grad
            if g is not None:
                state = optimizer.state[p]
                if not state:   # as torch's AdamW makes it (its fused form keeps the step counter on the device)
                    state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                entries.append((p, g, state, gi))
    if not entries:
        return torch.zeros((), dtype=torch.float32, device=optimizer.param_groups[0]["params"][0].device)
    device = entries[0][0].device
    # what the fixed rows were made from: a state replaced (load_state_dict) or a parameter moved makes them again
    # (the rows hold the step counters, so a new counter never takes an old one's address)
    key = [(p.data_ptr(), state["exp_avg"].data_ptr(), state["exp_avg_sq"].data_ptr(), state["step"].data_ptr())
           for p, _, state, _ in entries]
    cached = getattr(optimizer, "_samu_rows", None)
    if cached is None or cached[0] != key:
        optimizer._samu_rows = cached = (key, _Rows(entries, device))
    rows = cached[1]
    base = rows.base.data_ptr()
    table = rows.fixed.copy()
    for i, (_, g, _, _) in enumerate(entries):
        _check(g, "gradient", i)
    table[:, G] = (np.array([g.data_ptr() for _, g, _, _ in entries], dtype=np.int64) - base) // 4
    table[:, LR:] = np.array(hyper, dtype=np.int64)[[gi for _, _, _, gi in entries]]
    table = torch.from_numpy(table)
    table = table.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else table
    torch._foreach_add_(rows.steps, 1.0)
    return clipped_adamw(rows.base, table, rows.chunks, max_norm)[0]
