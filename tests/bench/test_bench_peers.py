"""The peer builds against the reference: each third-party scan is replaced by a serial scan with the
same calling convention, so what is checked is our side of the contract (gates, layouts, the log-decay
convention, complex packing, which module a package version names its scan), on CPU, without the
third-party packages."""

import sys
import types

import pytest
import torch

from samu import reference
from samu.bench import peers
from tests.helpers import randn, rel_err, rglru_params, samu_params


def _serial(a, b):
    """h_t = a_t h_{t-1} + b_t along the last axis."""
    h, out = torch.zeros_like(b[..., 0]), []
    for t in range(b.shape[-1]):
        h = a[..., t] * h + b[..., t]
        out.append(h)
    return torch.stack(out, dim=-1)


def _chunk_hgrn(x, g, initial_state=None, output_final_state=False):
    # flash-linear-attention's convention: [B, T, D], h_t = exp(g_t) h_{t-1} + x_t
    h = _serial(g.exp().transpose(1, 2), x.transpose(1, 2)).transpose(1, 2)
    return h, (h[:, -1] if output_final_state else None)


def _scan_bct(forget, inputs):
    # accelerated-scan's convention: [B, C, T], contiguous (0.3's scalar.scan takes any T)
    assert forget.is_contiguous() and inputs.is_contiguous() and forget.shape == inputs.shape
    return _serial(forget, inputs)


def _pow2_scan_bct(forget, inputs):
    # accelerated-scan 0.2's triton.scan: the same, one block per sequence, so T a power of two
    T = inputs.shape[-1]
    assert T & (T - 1) == 0, f"T={T} is not a power of two"
    return _scan_bct(forget, inputs)


def _complex_scan_bct(forget, inputs):
    # accelerated-scan's complex.scan refuses a real forget tensor
    assert forget.is_complex()
    return _scan_bct(forget, inputs)


def _install(monkeypatch, real=("scalar",)):
    """Stand-ins for fla and accelerated-scan; ``real``: which of accelerated-scan's real-scan modules
    the installed version has (0.3: scalar, 0.2: triton); the other one fails to import."""
    scans = {"scalar": _scan_bct, "triton": _pow2_scan_bct}
    modules = {"fla": types.ModuleType("fla"), "fla.ops": types.ModuleType("fla.ops"),
               "fla.ops.hgrn": types.ModuleType("fla.ops.hgrn"),
               "accelerated_scan": types.ModuleType("accelerated_scan"),
               "accelerated_scan.complex": types.ModuleType("accelerated_scan.complex")}
    modules["fla.ops.hgrn"].chunk_hgrn = _chunk_hgrn
    modules["accelerated_scan.complex"].scan = _complex_scan_bct
    for name, scan in scans.items():
        module = types.ModuleType(f"accelerated_scan.{name}") if name in real else None
        if module is not None:
            module.scan = scan
        modules[f"accelerated_scan.{name}"] = module
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)


@pytest.fixture
def fake_peers(monkeypatch):
    _install(monkeypatch)


@pytest.mark.parametrize("name", ["fla-chunk_hgrn", "ascan-scalar"])
def test_rglru_peers_compute_the_reference(fake_peers, name):
    x = randn((2, 13, 16), 1)
    params = rglru_params(16, 4, 2)
    want, _ = reference.rglru_mixer(x, *params, c=peers.RGLRU_C, dtype=torch.float32)
    assert rel_err(peers.PEERS[name][1](x, *params), want) < 1e-5


# 0.3 names its real scan `scalar`, 0.2 `triton`; with both importable, `scalar` (any length) wins
@pytest.mark.parametrize("real, L, used", [(("scalar",), 13, "scalar"), (("triton",), 16, "triton"),
                                           (("scalar", "triton"), 13, "scalar")])
def test_ascan_peer_takes_the_installed_module(monkeypatch, real, L, used):
    _install(monkeypatch, real)
    assert peers.peer_module("ascan-scalar").__name__ == f"accelerated_scan.{used}"
    x = randn((2, L, 16), 1)
    params = rglru_params(16, 4, 2)
    want, _ = reference.rglru_mixer(x, *params, c=peers.RGLRU_C, dtype=torch.float32)
    assert rel_err(peers.rglru_ascan(x, *params), want) < 1e-5


def test_ascan_0_2_refuses_lengths_that_are_not_powers_of_two(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    _install(monkeypatch, ("triton",))
    reason = peers.unavailable("ascan-scalar", "cpu", (1, 13, 16))
    assert "power-of-two length, got L=13" in reason and "accelerated_scan.scalar" in reason
    assert "needs a CUDA device" in peers.unavailable("ascan-scalar", "cpu", (1, 16, 16))
    _install(monkeypatch, ("scalar",))
    assert "needs a CUDA device" in peers.unavailable("ascan-scalar", "cpu", (1, 13, 16))


def test_samu_peer_computes_the_reference(fake_peers):
    x = randn((2, 13, 10), 3)
    params = samu_params(10, 4)
    want, _ = reference.samu_mixer(x, *params, radial_bound=peers.RADIAL_BOUND, dtype=torch.float32)
    assert rel_err(peers.samu_ascan(x, *params), want) < 1e-5


def test_a_missing_peer_names_its_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "accelerated_scan", None)
    assert "accelerated-scan is not installed" in peers.unavailable("ascan-complex", "cpu")
    reason = peers.unavailable("ascan-scalar", "cpu")
    assert "accelerated_scan.scalar" in reason and "accelerated_scan.triton" in reason
