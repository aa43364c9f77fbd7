"""Model FLOP utilisation: 6 * params * tokens/s over the device's dense bf16 peak."""

from __future__ import annotations

import torch

# Dense bf16 tensor-core peaks in FLOP/s, by a substring of the CUDA device name.
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12}


def peak_flops_of(gpu_name: "str | None") -> "float | None":
    """The dense bf16 peak of a GPU named ``gpu_name`` (``PEAK_FLOPS``), or None when unknown."""
    return next((v for k, v in PEAK_FLOPS.items() if gpu_name and k in gpu_name), None)


def peak_flops(device) -> "float | None":
    """The dense bf16 peak of ``device`` if it is a known CUDA GPU, else None (no MFU is reported)."""
    device = torch.device(device)
    return peak_flops_of(torch.cuda.get_device_name(device)) if device.type == "cuda" else None


def mfu(params: int, tokens_per_s: float, peak: "float | None", devices: int = 1) -> "float | None":
    """6 * params * tokens/s / (peak * devices): the training FLOPs of a dense model over the peak."""
    return None if peak is None else 6 * params * tokens_per_s / (peak * devices)
