"""Peer mixers: the same definitions built from PyTorch ops plus third-party scans (extra ``peers``).

Each peer takes the mixer's own arguments and returns y, so it is timed side by side with the
samu op on identical inputs. Gates and controllers are PyTorch ops in fp32 (the reference's own
functions); only the recurrence runs in the third-party kernel.
"""

from __future__ import annotations

import importlib

import torch

from samu.ops import dispatch
from samu.reference import rglru_gates, samu_controls, samu_transitions

RADIAL_BOUND = 2.0
RGLRU_C = 8.0


def rglru_fla(x, w_a, b_a, w_x, b_x, a_param):
    """RG-LRU: PyTorch gate ops + flash-linear-attention ``chunk_hgrn`` (h = exp(g) h + x)."""
    from fla.ops.hgrn import chunk_hgrn

    a, b = rglru_gates(x.float(), w_a, b_a, w_x, b_x, a_param, RGLRU_C)
    y, _ = chunk_hgrn(b, torch.log(a))
    return y.to(x.dtype)


def rglru_ascan(x, w_a, b_a, w_x, b_x, a_param):
    """RG-LRU: PyTorch gate ops + accelerated-scan's real (scalar) scan, ``accelerated_scan.triton.scan``
    (layout [B, D, L]; its CUDA twin ``accelerated_scan.warp`` compiles with nvcc at import and needs
    power-of-two lengths, so the Triton one is the peer)."""
    from accelerated_scan.triton import scan

    a, b = rglru_gates(x.float(), w_a, b_a, w_x, b_x, a_param, RGLRU_C)
    h = scan(a.transpose(1, 2).contiguous(), b.transpose(1, 2).contiguous())
    return h.transpose(1, 2).to(x.dtype)


def samu_ascan(x, nu, theta_log, directions, amplitudes):
    """SAMU: PyTorch controller ops + accelerated-scan ``complex.scan`` (layout [B, N, L])."""
    from accelerated_scan.complex import scan

    xs = x.float()
    n = xs.shape[-1] // 2
    _, m, phi = samu_controls(xs, directions, amplitudes, RADIAL_BOUND)
    lam, gamma = samu_transitions(m, phi, nu, theta_log)
    z = torch.complex(xs[..., :n], xs[..., n:])
    h = scan(lam.transpose(1, 2).contiguous(), (gamma * z).transpose(1, 2).contiguous()).transpose(1, 2)
    return torch.cat([h.real, h.imag], dim=-1).to(x.dtype)


# name -> (op, function, module it needs, package that provides it)
PEERS = {
    "fla-chunk_hgrn": ("rglru", rglru_fla, "fla.ops.hgrn", "flash-linear-attention"),
    "ascan-scalar": ("rglru", rglru_ascan, "accelerated_scan.triton", "accelerated-scan"),
    "ascan-complex": ("samu", samu_ascan, "accelerated_scan.complex", "accelerated-scan"),
}


def peers_of(op: str) -> list[str]:
    return [name for name, (peer_op, *_) in PEERS.items() if peer_op == op]


def unavailable(name: str, device) -> "str | None":
    """None when peer ``name`` can run on ``device``, else the reason it cannot."""
    _, _, module, package = PEERS[name]
    try:
        importlib.import_module(module)
    except ImportError as err:
        return f"{package} is not installed ({err}); pip install 'samu[peers]'"
    device = torch.device(device)
    if device.type != "cuda":
        if name.startswith("fla") or not dispatch.interpreting():
            return f"{package} needs a CUDA device (its scan is a Triton kernel)"
    return None
