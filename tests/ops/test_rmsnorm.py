"""The fused RMSNorm kernels against the same maths in float64 (the Triton interpreter on CPU).

Rule, declared before any run: in fp32 y, dx and dweight are within 1e-6 (relative Frobenius) of
float64; in bf16 the fused result is no further from float64 than the PyTorch ops in bf16, or within
one bf16 rounding (eps / 2), whichever is larger; two backward calls give the same bits.
"""

import pytest
import torch

from samu.ops import dispatch
from samu.ops.rmsnorm import rms_norm, rms_norm_shifted
from tests.helpers import poison_allocations, rel_err

pytestmark = pytest.mark.skipif(not dispatch.triton_available(), reason="triton is not installed")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def nan_outputs(monkeypatch):
    poison_allocations(monkeypatch)


@pytest.fixture(autouse=True)
def few_rows(monkeypatch):
    from samu.ops import rmsnorm_triton

    monkeypatch.setattr(rmsnorm_triton, "ROWS", 4)
    monkeypatch.setattr(rmsnorm_triton, "FEW_ROWS", 2)   # the forward's one-row programs only up to 2 rows


def _exact(x, w, eps):
    xd, wd = x.double(), w.double()
    return xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * wd


def _grads(fn, x, w, dy, device, dtype=None):
    x = x.to(device=device, dtype=dtype or x.dtype).requires_grad_()
    w = w.to(device=device, dtype=dtype or w.dtype).requires_grad_()
    y = fn(x, w)
    return [y, *torch.autograd.grad(y, [x, w], dy.to(device=device, dtype=y.dtype))]


@pytest.mark.parametrize("shape", [(2, 7, 20), (1, 1, 16), (3, 5, 64)])
def test_fp32_matches_float64(shape):
    g = torch.Generator().manual_seed(sum(shape))
    x, w, dy = torch.randn(shape, generator=g) * 3, torch.randn(shape[-1], generator=g), torch.randn(shape, generator=g)
    exact = _grads(lambda a, b: _exact(a, b, 1e-6), x, w, dy, "cpu", torch.float64)
    fused = _grads(lambda a, b: rms_norm(a, b, 1e-6, "triton"), x, w, dy, DEVICE)
    for name, f, e in zip(("y", "dx", "dweight"), fused, exact):
        assert f.dtype == torch.float32 and rel_err(f.cpu(), e) < 1e-6, name


def test_bf16_no_worse_than_unfused_and_deterministic():
    g = torch.Generator().manual_seed(1)
    x, w, dy = (torch.randn(3, 9, 40, generator=g).bfloat16(), torch.randn(40, generator=g),
                torch.randn(3, 9, 40, generator=g).bfloat16())
    exact = _grads(lambda a, b: _exact(a, b, 1e-6), x, w, dy, "cpu", torch.float64)
    unfused = _grads(lambda a, b: rms_norm(a, b, 1e-6, "torch"), x, w, dy, "cpu")
    fused = _grads(lambda a, b: rms_norm(a, b, 1e-6, "triton"), x, w, dy, DEVICE)
    again = _grads(lambda a, b: rms_norm(a, b, 1e-6, "triton"), x, w, dy, DEVICE)
    rounding = torch.finfo(torch.bfloat16).eps / 2
    for name, f, u, e, f2 in zip(("y", "dx", "dweight"), fused, unfused, exact, again):
        assert f.dtype == u.dtype, name
        assert rel_err(f.cpu(), e) <= max(rel_err(u, e), rounding), name
        assert torch.equal(f, f2), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 5])   # one-row programs (FEW_ROWS = 2 here) and ROWS-row ones
def test_shifted_norm_also_writes_x_plus_shift(dtype, rows):
    g = torch.Generator().manual_seed(rows)
    x, w, b = torch.randn(rows, 40, generator=g).to(dtype), torch.randn(40, generator=g), torch.randn(40, generator=g)
    b = b.to(dtype)
    y, shifted = rms_norm_shifted(x.to(DEVICE), w.to(DEVICE), 1e-6, b.to(DEVICE), "triton")
    assert torch.equal(y, rms_norm(x.to(DEVICE), w.to(DEVICE), 1e-6, "triton"))
    assert shifted.dtype == dtype and torch.equal(shifted.cpu(), (x.float() + b.float()).to(dtype))
    y_torch, shifted_torch = rms_norm_shifted(x, w, 1e-6, b, "torch")
    assert torch.equal(y_torch, rms_norm(x, w, 1e-6, "torch")) and torch.equal(shifted_torch, shifted.cpu())
