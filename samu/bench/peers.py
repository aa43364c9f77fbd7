"""Peer mixers: the same definitions built from PyTorch ops plus third-party scans (extra ``peers``).

Each peer takes the mixer's own arguments and returns y, so it is timed side by side with the
samu op on identical inputs. Gates and controllers are PyTorch ops in fp32 (the reference's own
functions); only the recurrence runs in the third-party kernel. The bench checks every peer's y
against samu's (samu.bench.runner), so a peer that computes something else is flagged, not ranked.
"""

from __future__ import annotations

import importlib

import torch

from samu.ops import dispatch
from samu.reference import rglru_gates, samu_controls, samu_transitions

RADIAL_BOUND = 2.0
RGLRU_C = 8.0
# accelerated-scan's real scan: `scalar` in 0.3.1 (any length), `triton` in 0.2.0 (power-of-two lengths only)
ASCAN_REAL = ("accelerated_scan.scalar", "accelerated_scan.triton")


def rglru_fla(x, w_a, b_a, w_x, b_x, a_param):
    """RG-LRU: PyTorch gate ops + flash-linear-attention ``chunk_hgrn`` (h = exp(g) h + x, layout [B, L, D]).

    fla-core 0.6.0's kernel races on an H200: two calls on the same inputs differ in bits, its first
    128-token chunk is exact and later chunks are ~3% off at samu's gate inputs, 4-11% in y, so the
    bench flags it (evidence and the likely cause in docs/performance.md; the adapter matches the
    reference to bf16 rounding when the kernel runs serially in the Triton interpreter).
    """
    chunk_hgrn = peer_module("fla-chunk_hgrn").chunk_hgrn
    a, b = rglru_gates(x.float(), w_a, b_a, w_x, b_x, a_param, RGLRU_C)
    y, _ = chunk_hgrn(b, torch.log(a))
    return y.to(x.dtype)


def rglru_ascan(x, w_a, b_a, w_x, b_x, a_param):
    """RG-LRU: PyTorch gate ops + accelerated-scan's real scan, layout [B, D, L], fp32, contiguous.

    ``accelerated_scan.scalar.scan`` (0.3.1) is a Triton kernel, compiled on first call, that walks
    the sequence in blocks of 2048 tokens and takes any L. 0.2.0 named it ``accelerated_scan.triton``;
    that one holds a whole sequence in one block, so L must be a power of two (``unavailable`` says so).
    The CUDA twin ``accelerated_scan.warp`` compiles with nvcc at import, so the Triton scan is the peer.
    """
    scan = peer_module("ascan-scalar").scan
    a, b = rglru_gates(x.float(), w_a, b_a, w_x, b_x, a_param, RGLRU_C)
    h = scan(a.transpose(1, 2).contiguous(), b.transpose(1, 2).contiguous())
    return h.transpose(1, 2).to(x.dtype)


def samu_ascan(x, nu, theta_log, directions, amplitudes):
    """SAMU: PyTorch controller ops + accelerated-scan ``complex.scan`` (layout [B, N, L])."""
    scan = peer_module("ascan-complex").scan
    xs = x.float()
    n = xs.shape[-1] // 2
    _, m, phi = samu_controls(xs, directions, amplitudes, RADIAL_BOUND)
    lam, gamma = samu_transitions(m, phi, nu, theta_log)
    z = torch.complex(xs[..., :n], xs[..., n:])
    h = scan(lam.transpose(1, 2).contiguous(), (gamma * z).transpose(1, 2).contiguous()).transpose(1, 2)
    return torch.cat([h.real, h.imag], dim=-1).to(x.dtype)


# name -> (op, function, modules that provide its scan (the first importable one is used), package)
PEERS = {
    "fla-chunk_hgrn": ("rglru", rglru_fla, ("fla.ops.hgrn",), "flash-linear-attention"),
    "ascan-scalar": ("rglru", rglru_ascan, ASCAN_REAL, "accelerated-scan"),
    "ascan-complex": ("samu", samu_ascan, ("accelerated_scan.complex",), "accelerated-scan"),
}


def peers_of(op: str) -> list[str]:
    return [name for name, (peer_op, *_) in PEERS.items() if peer_op == op]


def peer_module(name: str):
    """The module peer ``name`` takes its scan from: the first of its modules that imports."""
    errors = []
    for module in PEERS[name][2]:
        try:
            return importlib.import_module(module)
        except ImportError as err:
            errors.append(str(err))
    raise ImportError("; ".join(errors))


def unavailable(name: str, device, shape=None) -> "str | None":
    """None when peer ``name`` can run on ``device`` (at ``shape`` (B, L, D), if given), else the reason."""
    package = PEERS[name][3]
    try:
        module = peer_module(name)
    except ImportError as err:
        return f"{package} is not installed ({err}); pip install 'samu[peers]'"
    if module.__name__ == "accelerated_scan.triton" and shape is not None and shape[1] & (shape[1] - 1):
        return (f"accelerated-scan 0.2 (accelerated_scan.triton) needs a power-of-two length, got L={shape[1]}; "
                f"0.3.1 (accelerated_scan.scalar) takes any length")
    if torch.device(device).type != "cuda":
        if name.startswith("fla") or not dispatch.interpreting():
            return f"{package} needs a CUDA device (its scan is a Triton kernel)"
    return None
