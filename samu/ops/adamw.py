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
fp32 in the order of operations of torch's fused kernel, which mixes in float64 where it multiplies by a
hyperparameter and rounds its square roots and divisions correctly, where Triton's fp32 square root and division on
CUDA are within an ulp or two: the two agree to a few fp32 roundings, not to the bit. The squared gradients are
summed in a fixed order: every run with the same gradients gives the same norm and the same parameters. The norm is
of the gradients the optimizer holds: where they are shards (FSDP), ``unsupported`` says no and torch's step runs.
"""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
import torch

from samu.ops import dispatch
from samu.ops.checks import local_part


class ClippedAdamW(torch.optim.AdamW):
    """torch's AdamW whose ``step`` clips the gradients to a total norm of ``max_norm`` first: on the kernels here
    (``clipped_step``, which leaves the gradients as they are) where ``unsupported`` says nothing against the
    optimizer and the step's gradients are dense contiguous fp32 tensors on 16-byte boundaries, else by torch's norm,
    clip (in place) and AdamW step, the same result to fp32 rounding, with a warning the first time it comes to that
    where the kernels were expected. ``grad_norm`` holds the last step's norm before clipping (a device scalar). Its
    state and ``state_dict`` are AdamW's. A GradScaler unscales its gradients before its step and skips a step with
    an inf or nan among them, as for an unfused AdamW. FSDP's flat parameters (FSDP1) are refused: the norm would be
    a shard's (clip with FSDP's ``clip_grad_norm_`` and step a plain AdamW there); FSDP2's DTensors take torch's
    path, whose norm is the whole one.

    ``low_copies`` maps parameters to bf16 tensors of their shape (``keep_low_copy``) that every step leaves equal to
    the parameter cast to bf16 (``p.to(torch.bfloat16)``, to the bit): the kernels write them beside the parameters,
    2 bytes a parameter, where autocast would otherwise cast every weight again in the next forward (6 bytes); torch's
    path casts them after its step. Nothing else writes them: whatever changes a parameter outside ``step`` must
    cast its copy again (``samu.train``'s loop does, from the parameters' version counters)."""

    def __init__(self, params, *, max_norm: float, **kwargs):
        if not max_norm > 0:
            raise ValueError(f"max_norm must be positive, got {max_norm}")
        self._why = None   # unsupported(self), asked again after the groups change (add_param_group, a load)
        self._warned = False
        super().__init__(params, **kwargs)
        if any(getattr(p, "_is_flat_param", False) for group in self.param_groups for p in group["params"]):
            raise ValueError("ClippedAdamW cannot clip FSDP's flat parameters (each rank holds a shard): clip with "
                             "FSDP's clip_grad_norm_ and step a torch.optim.AdamW")
        # the kernels take no grad_scale / found_inf: a GradScaler must unscale and check the gradients itself
        self._step_supports_amp_scaling = False
        self.max_norm = float(max_norm)
        self.grad_norm = None
        self.low_copies = {}

    def keep_low_copy(self, p: torch.Tensor) -> torch.Tensor:
        """A bf16 copy of parameter ``p`` (one of this optimizer's) that every step keeps equal to ``p``'s cast."""
        if not any(p is q for group in self.param_groups for q in group["params"]):
            raise ValueError("keep_low_copy: p is not a parameter of this optimizer")
        if p not in self.low_copies:
            self.low_copies[p] = p.detach().to(torch.bfloat16)
        return self.low_copies[p]

    def __getstate__(self):
        return {**super().__getstate__(), "max_norm": self.max_norm}

    def __setstate__(self, state):
        # also what load_state_dict calls, with the saved groups, whose flags replace these
        super().__setstate__(state)
        self._why, self._warned, self.grad_norm = None, False, None
        self.low_copies = getattr(self, "low_copies", {})
        self._step_supports_amp_scaling = False

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        self._why = None

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._why is None:
            self._why = unsupported(self) or ""
        if not self._why:
            try:
                self.grad_norm = clipped_step(self, self.max_norm)
                return loss
            except Unusable as why:   # a gradient that is a view into a bucket, say: torch's step takes it
                if not self._warned:
                    warnings.warn(f"ClippedAdamW steps by torch's clip and AdamW step: {why}", stacklevel=2)
                    self._warned = True
        # AdamW's own step without the hook wrapper torch puts around it (this step's wrapper ran the hooks once)
        adamw_step = torch.optim.AdamW.step
        if getattr(adamw_step, "hooked", False):
            adamw_step = adamw_step.__wrapped__
        params = [p for group in self.param_groups for p in group["params"] if p.grad is not None]
        self.grad_norm = torch_clipped_step(self, params, self.max_norm, step=lambda: adamw_step(self))
        for p, low in self.low_copies.items():
            low.copy_(p)
        return loss


def torch_clipped_step(optimizer: torch.optim.Optimizer, params: list, max_norm: float, step=None) -> torch.Tensor:
    """PyTorch's clip and step: the total norm of ``params``' gradients, then ``step`` (default ``optimizer.step``) on
    the gradients scaled down to a norm of at most ``max_norm``; returns the norm before (a device scalar, this
    process's part of a DTensor norm: the same value). A fused optimizer divides them itself as it reads them (its
    ``grad_scale``, cleared again after the step), which saves a read of every gradient (~0.4 ms a step for the 400m
    preset on an H200); any other needs them scaled in place first."""
    norm = torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True)
    step = optimizer.step if step is None else step
    if not optimizer.defaults.get("fused"):
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm, foreach=True)
        step()
        return local_part(norm)
    # sharded gradients (FSDP) give a replicated DTensor norm: the same value, held here
    norm = local_part(norm)
    optimizer.grad_scale = torch.clamp((norm + 1e-6) / max_norm, min=1.0)
    try:
        step()
    finally:
        optimizer.grad_scale = None
    return norm


class Unusable(ValueError):
    """What clipped_step raises, having stepped nothing, where it cannot step now: a gradient, parameter, moment or
    step counter it cannot read (not a dense contiguous fp32 tensor on a 16-byte boundary), or parameters or states
    that changed since the last step into something ``unsupported`` refuses."""


def unsupported(optimizer: torch.optim.Optimizer) -> str | None:
    """Why ``clipped_step`` cannot step ``optimizer`` (None where it can): it takes a ``torch.optim.AdamW`` (or a
    ClippedAdamW) without amsgrad, maximize, differentiable or capturable (its table is copied from the host at
    every step), with float hyperparameters, over dense contiguous fp32 parameters on 16-byte boundaries of one
    device that are plain tensors (not sharded: DTensors, FSDP's flat parameters), on CUDA or in the Triton
    interpreter."""
    if type(optimizer) not in (torch.optim.AdamW, ClippedAdamW):
        return f"it steps torch.optim.AdamW only, not {type(optimizer).__name__}"
    device = None
    for group in optimizer.param_groups:
        for flag in ("amsgrad", "maximize", "differentiable", "capturable"):
            if group.get(flag):
                return f"AdamW with {flag}=True"
        if any(isinstance(group[k], torch.Tensor) for k in ("lr", "weight_decay", "eps")) or any(
                isinstance(b, torch.Tensor) for b in group["betas"]):
            return "tensor hyperparameters"
        for p in group["params"]:
            if type(p.detach()) is not torch.Tensor or getattr(p, "_is_flat_param", False):
                return f"sharded parameters ({type(p.detach()).__name__})"
            if p.dtype != torch.float32 or not p.is_contiguous() or p.data_ptr() % 16:
                return "parameters that are not contiguous fp32 on 16-byte boundaries"
            if device is None:
                device = p.device
            elif p.device != device:
                return "parameters on more than one device"
    if device is None:
        return "no parameters"
    return dispatch.triton_unusable(device)


def _bits(x: float) -> int:
    return int(np.array(float(x), dtype=np.float64).view(np.int64))


def _address(t: torch.Tensor, what: str, where: tuple[int, int], width: int = 16) -> int:
    """t's address, where it is a dense contiguous fp32 tensor on a ``width``-byte boundary."""
    address = t.data_ptr()
    if t.dtype != torch.float32 or t.is_sparse or (t.dim() and not t.is_contiguous()) or address % width:
        raise Unusable(f"clipped_step: the {what} of parameter {where[1]} of group {where[0]} is not a dense "
                    f"contiguous fp32 tensor on a {width}-byte boundary")
    return address


def _low_address(low: torch.Tensor, p: torch.Tensor, where: tuple[int, int]) -> int:
    """The address of parameter ``p``'s low copy, a dense contiguous bf16 tensor of its shape on its device and on a
    16-byte boundary."""
    address = low.data_ptr()
    if (low.dtype != torch.bfloat16 or low.shape != p.shape or low.device != p.device or low.is_sparse
            or not low.is_contiguous() or address % 16):
        raise Unusable(f"clipped_step: the low copy of parameter {where[1]} of group {where[0]} is not a dense "
                       f"contiguous bf16 tensor of its shape and device on a 16-byte boundary")
    return address


class _Rows:
    """The table's rows but the gradients' offsets, for one set of parameters and state tensors (checked once: the
    host time of a step matters, results/dev/session12/call4), and the chunks, which depend on the sizes alone."""

    def __init__(self, entries, lows, device):
        from samu.ops.adamw_triton import CHUNK, COLUMNS, LOW, M, NUMEL, P, STEP, V

        self.base = entries[0][0]
        base = self.base.data_ptr()
        self.fixed = np.zeros((len(entries), COLUMNS), dtype=np.int64)
        for i, (p, state, where) in enumerate(entries):
            for column, t, what, width in ((P, p, "data", 16), (M, state["exp_avg"], "exp_avg", 16),
                                           (V, state["exp_avg_sq"], "exp_avg_sq", 16),
                                           (STEP, state["step"], "step counter", 4)):
                self.fixed[i, column] = (_address(t, what, where, width) - base) // 4
            self.fixed[i, NUMEL] = p.numel()
            low = lows.get(p)
            if low is not None:
                self.fixed[i, LOW] = (_low_address(low, p, where) - base) // 2 + 1
        self.steps = [state["step"] for _, state, _ in entries]
        sizes = self.fixed[:, NUMEL]
        per_row = -(-sizes // CHUNK)
        rows = np.repeat(np.arange(len(entries)), per_row)
        starts = (np.arange(len(rows)) - np.repeat(np.cumsum(per_row) - per_row, per_row)) * CHUNK
        self.chunks = torch.from_numpy(np.stack([rows, starts], axis=1)).to(device)


def clipped_step(optimizer: torch.optim.AdamW, max_norm: float) -> torch.Tensor:
    """One AdamW step of ``optimizer`` (``unsupported`` must say None) on every parameter that has a gradient, the
    gradients divided by max(1, (norm + 1e-6) / max_norm) as they are read, and the parameters' low copies (a
    ClippedAdamW's ``low_copies``) written beside them; returns their total norm before (a device scalar, fp32; nan
    or inf where a gradient is not finite, and then the step writes non-finite values).
    Raises Unusable, having stepped nothing, where a tensor is not one the kernels read, or where the parameters or
    states changed since the last step into something ``unsupported`` refuses."""
    from samu.ops.adamw_triton import G, LR, clipped_adamw

    if not max_norm > 0:
        raise ValueError(f"max_norm must be positive, got {max_norm}")
    entries, hyper, grads = [], [], []
    for gi, group in enumerate(optimizer.param_groups):
        lr, wd, (beta1, beta2), eps = group["lr"], group["weight_decay"], group["betas"], group["eps"]
        hyper.append([_bits(lr), _bits(1.0 - lr * wd), _bits(beta1), _bits(beta2), _bits(eps)])
        for pi, p in enumerate(group["params"]):
            g = p.grad
            if g is not None:
                grads.append(_address(g, "gradient", (gi, pi)))
                entries.append((p, optimizer.state[p], (gi, pi)))
    if not entries:
        first = next((p for group in optimizer.param_groups for p in group["params"]), None)
        return torch.zeros((), dtype=torch.float32, device=None if first is None else first.device)
    for p, state, _ in entries:
        if not state:   # as torch's AdamW makes it (its fused form keeps the step counter on the device)
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        elif state["step"].device != p.device:
            # an unfused AdamW's counter (a state saved by one and loaded here), kept where the kernels read it
            state["step"] = state["step"].to(device=p.device, dtype=torch.float32)
    device = entries[0][0].device
    # what the fixed rows were made from: a state replaced (load_state_dict) or a parameter moved makes them again
    # (the rows hold the step counters, so a new counter never takes an old one's address)
    lows = getattr(optimizer, "low_copies", {})
    key = [(p.data_ptr(), state["exp_avg"].data_ptr(), state["exp_avg_sq"].data_ptr(), state["step"].data_ptr(),
            lows[p].data_ptr() if p in lows else 0) for p, state, _ in entries]
    cached = getattr(optimizer, "_samu_rows", None)
    if cached is None or cached[0] != key:
        why = unsupported(optimizer)   # parameters moved or cast since the last step, say
        if why:
            raise Unusable(why)
        optimizer._samu_rows = cached = (key, _Rows(entries, lows, device))
    rows = cached[1]
    table = rows.fixed.copy()
    table[:, G] = (np.array(grads, dtype=np.int64) - rows.base.data_ptr()) // 4
    table[:, LR:] = np.array(hyper, dtype=np.int64)[[where[0] for _, _, where in entries]]
    table = torch.from_numpy(table)
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        table = table.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else table
        torch._foreach_add_(rows.steps, 1.0)
        return clipped_adamw(rows.base, table, rows.chunks, max_norm)[0]
