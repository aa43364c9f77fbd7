"""Fresh random mixer inputs for gates and benchmarks, drawn as ``gates.toml`` [inputs] declares."""

from __future__ import annotations

import math
import zlib

import torch

from samu.gates.rules import load_rules

PARAMS = {"samu": ("nu", "theta_log", "directions", "amplitudes"),
          "rglru": ("w_a", "b_a", "w_x", "b_x", "a_param")}
RGLRU_C = 8.0


def derive_seed(seed: int, *parts) -> int:
    """A seed of its own for every (op, shape, dtype): stable across runs and machines."""
    return zlib.crc32("|".join(str(p) for p in (seed, *parts)).encode()) & 0x7FFFFFFF


def rglru_heads(D: int, wanted: int) -> int:
    """The declared head count, or the largest divisor of D below it for small test widths."""
    return max(h for h in range(1, min(wanted, D) + 1) if D % h == 0)


def _stratified(n, lo, hi, gen, device):
    """n values spanning (lo, hi): one uniform draw in each of n equal strata, shuffled."""
    u = torch.rand(n, generator=gen, device=device, dtype=torch.float64)
    k = torch.randperm(n, generator=gen, device=device).to(torch.float64)
    return lo + (hi - lo) * (k + u) / n


def make_inputs(op: str, shape, dtype: torch.dtype, device, seed: int, spec: "dict | None" = None) -> dict:
    """Inputs of one mixer call and its cotangents.

    Returns {"x": [B, L, D] in ``dtype``, "params": {name: fp32 tensor}, "initial_state": [B, D] fp32,
    "dy": [B, L, D] in ``dtype`` (the output's dtype, spec §7), "dh": [B, D] fp32}.
    """
    spec = spec or load_rules().inputs
    B, L, D = shape
    device = torch.device(device)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    f32 = dict(dtype=torch.float32, device=device)

    def normal(*size, std=1.0):
        return std * torch.randn(*size, generator=gen, **f32)

    radius = _stratified(D // 2 if op == "samu" else D, spec["radius_min"], spec["radius_max"], gen, device)
    if op == "samu":
        n = D // 2
        theta = spec["theta_min"] + (spec["theta_max"] - spec["theta_min"]) * (
            1.0 - torch.rand(n, generator=gen, device=device, dtype=torch.float64))
        sign = torch.where(torch.rand(2, 2, generator=gen, **f32) < 0.5, -1.0, 1.0)
        magnitude = spec["amplitude_min"] + (spec["amplitude_max"] - spec["amplitude_min"]) * torch.rand(
            2, 2, generator=gen, **f32)
        params = {
            # r = exp(-exp(nu))
            "nu": torch.log(-torch.log(radius)).float(),
            "theta_log": torch.log(theta).float(),
            "directions": normal(2, D),
            "amplitudes": sign * magnitude,
        }
    elif op == "rglru":
        H = rglru_heads(D, int(spec["rglru_heads"]))
        std = 1.0 / math.sqrt(D // H)
        # base decay a0 with a0^c = r, i.e. softplus(a_param) = -log(r) / c; invert the softplus
        s = -torch.log(radius) / RGLRU_C
        params = {
            "w_a": normal(H, D // H, D // H, std=std),
            "b_a": normal(D, std=spec["bias_std"]),
            "w_x": normal(H, D // H, D // H, std=std),
            "b_x": normal(D, std=spec["bias_std"]),
            "a_param": (s + torch.log(-torch.expm1(-s))).float(),
        }
    else:
        raise ValueError(f"op must be 'samu' or 'rglru', got {op!r}")
    return {
        "x": normal(B, L, D).to(dtype),
        "params": {name: params[name] for name in PARAMS[op]},
        "initial_state": normal(B, D),
        "dy": normal(B, L, D).to(dtype),
        "dh": normal(B, D),
    }


def document_offsets(L: int, N: int, seed: int) -> list[int]:
    """cu_seqlens of N packed sequences over L tokens drawn from ``seed``: the first one token long (where
    N >= 2), the rest cut at random points (lengths that are mostly not a multiple of any chunk)."""
    if not 1 <= N <= L:
        raise ValueError(f"documents must lie in [1, L = {L}], got {N}")
    gen = torch.Generator().manual_seed(seed)
    cuts = [] if N == 1 else [1] + (2 + torch.randperm(L - 2, generator=gen)[:N - 2]).tolist()
    return [0] + sorted(cuts) + [L]


def pack_inputs(inputs: dict, offsets: list[int], seed: int) -> dict:
    """make_inputs' inputs for a batch-1 x that packs the sequences at ``offsets``: an initial state and a
    final-state cotangent per sequence ([N, D] fp32, drawn from ``seed``), and the offsets as int32."""
    N, D = len(offsets) - 1, inputs["x"].shape[-1]
    gen = torch.Generator(device=inputs["x"].device).manual_seed(seed)
    f32 = dict(dtype=torch.float32, device=inputs["x"].device)
    return {**inputs, "initial_state": torch.randn(N, D, generator=gen, **f32),
            "dh": torch.randn(N, D, generator=gen, **f32),
            "cu_seqlens": torch.tensor(offsets, dtype=torch.int32, device=inputs["x"].device)}
