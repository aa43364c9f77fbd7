"""nn.Module wrappers of the two mixers, with their spec initialisations (docs/spec.md) and a one-token step."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from samu.modules.layers import check_sequence, check_token
from samu.ops import dispatch
from samu.ops.checks import check_rglru_inputs, check_samu_inputs
from samu.ops.functional import rglru_mixer, samu_mixer
from samu.ops.glue import fused_backend
from samu.ops.sequence_parallel import rglru_mixer_sequence_parallel, samu_mixer_sequence_parallel
from samu.ops.step import rglru_block_step, rglru_step, samu_block_step, samu_step
from samu.validate import finite_number


def _no_packing(cu_seqlens):
    if cu_seqlens is not None:
        raise ValueError("cu_seqlens: packed sequences are not split across ranks (group is given)")


class _FP32Parameters(nn.Module):
    """Mixer parameters stay fp32 (spec §3) when the model around them is cast to bf16 or fp16.

    ``backend`` is checked when set; ``_step_backend`` is the one-token step's (samu.ops.step)."""

    @property
    def backend(self) -> str:
        return self._backend

    @backend.setter
    def backend(self, value: str):
        self._step_backend = fused_backend(value)
        if value not in dispatch.BASE_BACKENDS and value not in dispatch.variants(self.OP):
            raise ValueError(f"backend {value!r} is a variant of the other mixer; {self.OP}'s are "
                             f"{', '.join(map(repr, sorted(dispatch.variants(self.OP))))}")
        self._backend = value

    def choose(self, batch: int, length: int, dtype: torch.dtype, device=None, packed: bool = False) -> dispatch.Choice:
        """The implementation a [batch, length, width] input of ``dtype`` runs (samu.dispatch.choose; ``packed``:
        a packed row of that length), gating its class now if no record covers it: call it eagerly before
        torch.compile, which never gates."""
        device = next(self.parameters()).device if device is None else device
        return dispatch.choose(self.OP, batch, length, self.width, dtype, device, self.backend,
                               heads=getattr(self, "num_heads", 16), packed=packed)

    def _apply(self, fn, recurse=True):
        def keep_fp32(t):
            # a cast that changes dtype moves the tensor only; other conversions apply as asked
            probe = fn(torch.empty(0, dtype=t.dtype, device=t.device))
            if t.is_floating_point() and probe.dtype != t.dtype:
                return t.to(device=probe.device)
            return fn(t)

        return super()._apply(keep_fp32, recurse)


class SAMUMixer(_FP32Parameters):
    """SAMU mixer of width D (even): N = D/2 complex modes, 3·D + 4 parameters.

    forward(x [B, L, D], initial_state [B, D] | None, output_final_state) -> (y, final_state | None)
    step(x_t [B, D], state [B, D] | None) -> (y_t [B, D], new_state [B, D] fp32; float64 for float64 x_t)
    Parameters stay fp32 when the module is cast to another dtype.
    """

    OP = "samu"

    def __init__(self, width: int, *, r_min: float = 0.9, r_max: float = 0.999,
                 max_phase: float = math.pi / 10, radial_bound: float = 2.0, backend: str = "auto",
                 device=None):
        super().__init__()
        if not isinstance(width, int) or width < 2 or width % 2:
            raise ValueError(f"width must be a positive even integer, got {width!r}")
        for name, value in (("r_min", r_min), ("r_max", r_max), ("max_phase", max_phase)):
            finite_number(name, value)
        if not 0 < r_min < r_max < 1:
            raise ValueError(f"need 0 < r_min < r_max < 1, got r_min={r_min}, r_max={r_max}")
        if not 0 < max_phase <= math.pi:
            raise ValueError(f"max_phase must lie in (0, pi], got {max_phase}")
        self.width, self.r_min, self.r_max, self.max_phase = width, r_min, r_max, max_phase
        self.radial_bound = float(finite_number("radial_bound", radial_bound, positive=True))
        self.backend = backend
        n = width // 2
        kw = dict(device=device, dtype=torch.float32)
        self.nu = nn.Parameter(torch.empty(n, **kw))
        self.theta_log = nn.Parameter(torch.empty(n, **kw))
        self.directions = nn.Parameter(torch.empty(2, width, **kw))
        self.amplitudes = nn.Parameter(torch.empty(2, 2, **kw))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        # r^2 ~ U[r_min^2, r_max^2]; exp(nu) = -log r
        r2 = torch.empty_like(self.nu).uniform_(self.r_min ** 2, self.r_max ** 2)
        self.nu.copy_(torch.log(-0.5 * torch.log(r2)))
        # theta ~ U(0, max_phase]: 1 - U[0, 1) lies in (0, 1]
        self.theta_log.copy_(torch.log(self.max_phase * (1.0 - torch.rand_like(self.theta_log))))
        self.directions.normal_()
        self.amplitudes.zero_()

    def _params(self):
        return self.nu, self.theta_log, self.directions, self.amplitudes

    def forward(self, x, initial_state=None, output_final_state=False, cu_seqlens=None, group=None):
        """``group``: x is this rank's shard of a sequence split along L across that process group
        (samu.ops.sequence_parallel; not with cu_seqlens)."""
        check_sequence("x", x, self.width)
        if group is not None:
            _no_packing(cu_seqlens)
            return samu_mixer_sequence_parallel(x, *self._params(), group=group, initial_state=initial_state,
                                                output_final_state=output_final_state,
                                                radial_bound=self.radial_bound, backend=self.backend)
        return samu_mixer(x, *self._params(), initial_state=initial_state,
                          output_final_state=output_final_state, radial_bound=self.radial_bound,
                          backend=self.backend, cu_seqlens=cu_seqlens)

    def step(self, x_t, state=None):
        check_token("x_t", x_t, self.width)
        check_samu_inputs(x_t.unsqueeze(1), *self._params(), state, self.radial_bound,
                          state_name="state", x_name="x_t")
        return samu_step(x_t, *self._params(), state, self.radial_bound, self._step_backend)

    def block_step(self, z, conv_weight, conv_bias, conv_state, state):
        """The RecurrentBlock's step around this mixer (samu.ops.step.samu_block_step): unchecked, the
        states updated in place."""
        return samu_block_step(z, conv_weight, conv_bias, conv_state, *self._params(), state, self.radial_bound,
                               self._step_backend)

    def extra_repr(self):
        return f"width={self.width}, modes={self.width // 2}, radial_bound={self.radial_bound}"


class RGLRUMixer(_FP32Parameters):
    """RG-LRU mixer of width D with H block-diagonal gate heads: 2·D²/H + 3·D parameters.

    forward(x [B, L, D], initial_state [B, D] | None, output_final_state) -> (y, final_state | None)
    step(x_t [B, D], state [B, D] | None) -> (y_t [B, D], new_state [B, D] fp32)
    """

    OP = "rglru"

    def __init__(self, width: int, num_heads: int = 16, *, c: float = 8.0, r_min: float = 0.9,
                 r_max: float = 0.999, backend: str = "auto", device=None):
        super().__init__()
        if not isinstance(width, int) or width < 1:
            raise ValueError(f"width must be a positive integer, got {width!r}")
        if not isinstance(num_heads, int) or num_heads < 1 or width % num_heads:
            raise ValueError(f"num_heads must be a positive divisor of width={width}, got {num_heads!r}")
        if not 0 < r_min < r_max < 1:
            raise ValueError(f"need 0 < r_min < r_max < 1, got r_min={r_min}, r_max={r_max}")
        self.width, self.num_heads, self.c = width, num_heads, float(finite_number("c", c, positive=True))
        self.r_min, self.r_max, self.backend = r_min, r_max, backend
        hd = width // num_heads
        kw = dict(device=device, dtype=torch.float32)
        self.w_a = nn.Parameter(torch.empty(num_heads, hd, hd, **kw))
        self.b_a = nn.Parameter(torch.empty(width, **kw))
        self.w_x = nn.Parameter(torch.empty(num_heads, hd, hd, **kw))
        self.b_x = nn.Parameter(torch.empty(width, **kw))
        self.a_param = nn.Parameter(torch.empty(width, **kw))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        std = (1.0 / (self.width // self.num_heads)) ** 0.5
        self.w_a.normal_(0.0, std)
        self.w_x.normal_(0.0, std)
        self.b_a.zero_()
        self.b_x.zero_()
        # a0 = exp(-softplus(a_param)) with a0^2 ~ U[r_min^2, r_max^2]: softplus(a_param) = -log(a0)
        a0_sq = torch.empty_like(self.a_param).uniform_(self.r_min ** 2, self.r_max ** 2)
        target = -0.5 * torch.log(a0_sq)
        self.a_param.copy_(target + torch.log(-torch.expm1(-target)))  # softplus^-1

    def _params(self):
        return self.w_a, self.b_a, self.w_x, self.b_x, self.a_param

    def forward(self, x, initial_state=None, output_final_state=False, cu_seqlens=None, group=None):
        """``group``: as SAMUMixer.forward's."""
        check_sequence("x", x, self.width)
        if group is not None:
            _no_packing(cu_seqlens)
            return rglru_mixer_sequence_parallel(x, *self._params(), group=group, initial_state=initial_state,
                                                 output_final_state=output_final_state, c=self.c,
                                                 backend=self.backend)
        return rglru_mixer(x, *self._params(), initial_state=initial_state,
                           output_final_state=output_final_state, c=self.c, backend=self.backend,
                           cu_seqlens=cu_seqlens)

    def step(self, x_t, state=None):
        check_token("x_t", x_t, self.width)
        check_rglru_inputs(x_t.unsqueeze(1), *self._params(), state, self.c, state_name="state",
                           x_name="x_t")
        return rglru_step(x_t, *self._params(), state, self.c, self._step_backend)

    def block_step(self, z, conv_weight, conv_bias, conv_state, state):
        """The RecurrentBlock's step around this mixer (samu.ops.step.rglru_block_step): unchecked, the
        states updated in place."""
        return rglru_block_step(z, conv_weight, conv_bias, conv_state, *self._params(), state, self.c,
                                self._step_backend)

    def extra_repr(self):
        return f"width={self.width}, num_heads={self.num_heads}, c={self.c}"
