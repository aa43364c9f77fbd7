"""Decoding's one-row products (samu.ops.rowprod_triton) against the same maths in float64.

The kernel runs in the interpreter on CPU (compiled, with programmatic dependent launch on sm_90, on CUDA).
Rule, declared before any run: the float64 reference rounds where the kernel rounds (the RMSNorm's output, GeLU
and the gate's product, to the dtype) and nowhere else. fp32 results are within 1e-6 (relative Frobenius) of it.
Every bf16 element is within one unit of bf16 of it (eps |exact|, eps = 2^-7), plus the fp32 sums' own error
(K 2^-24 (sum |w x'| + |b| + |residual|)), plus, where a prologue rounds, one unit of each rounded input
(eps sum |w| |x'|): the kernel computes x' in fp32, so an element next to a rounding boundary may round the
other way than float64's, by one unit.
"""

import pytest
import torch

from samu.ops import dispatch
from tests.helpers import poison_allocations, rel_err

pytestmark = pytest.mark.skipif(not dispatch.triton_available(), reason="triton is not installed")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 2.0 ** -7   # bf16


@pytest.fixture(autouse=True)
def nan_outputs(monkeypatch):
    poison_allocations(monkeypatch)


def _gelu64(v):
    return v * torch.sigmoid(2 * 0.7978845608028654 * (v + 0.044715 * v ** 3))


def _exact(x, w, b, norm, geglu, res, dtype):
    """(float64 result, sum |w x'| + |b| + |residual|, sum |w x'|) with x' the prologue's output rounded to dtype,
    as the kernel."""
    K = w.shape[1]
    xd = x.double()
    if geglu:
        gate, up = xd[:, :K], xd[:, K:]
        xp = (_gelu64(gate).to(dtype).double() * up).to(dtype).double()
    elif norm is not None:
        nw, eps = norm
        xp = (xd / torch.sqrt((xd * xd).mean(-1, keepdim=True) + eps) * nw.double()).to(dtype).double()
    else:
        xp = xd
    out = xp @ w.double().T + b.double()
    scale = xp.abs() @ w.double().abs().T + b.double().abs()
    if res is not None:
        out = out + res.double()
        scale = scale + res.double().abs()
    return out, scale, xp.abs() @ w.double().abs().T


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("mode", ["plain", "norm", "geglu"])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("tiling", [None, (8, 128), (16, 256)])
def test_row_product_matches_float64(dtype, mode, with_residual, tiling, monkeypatch):
    from samu.ops import rowprod_triton
    from samu.ops.rowprod_triton import row_product

    if tiling is not None:   # the tiles rowprod_triton.tiles gives the 400m preset's shapes, and more column blocks
        monkeypatch.setattr(rowprod_triton, "tiles", lambda N, K, pro: tiling)
    torch.manual_seed(3)
    N, K = 37, 600   # a partial last program of rows; column blocks: 1 or 2 as shipped, 5 and 3 with a partial last
    w = (torch.randn(N, K, device=DEVICE) / K ** 0.5).to(dtype)
    b = torch.randn(N, device=DEVICE).to(dtype)
    x = torch.randn(1, 2 * K if mode == "geglu" else K, device=DEVICE).to(dtype)
    # eps large enough to move the scale by ~5%: a kernel that drops it fails
    norm = (torch.rand(K, device=DEVICE).add(0.5).to(dtype), 0.1) if mode == "norm" else None
    res = torch.randn(1, N, device=DEVICE).to(dtype) if with_residual else None
    y = row_product(x, w, b, norm=norm, geglu=mode == "geglu", residual=res)
    assert y.shape == (1, N) and y.dtype == dtype
    exact, scale, rounded = _exact(x, w, b, norm, mode == "geglu", res, dtype)
    if dtype == torch.float32:
        assert rel_err(y, exact) < 1e-6
    else:
        bound = EPS * exact.abs() + K * 2.0 ** -24 * scale + (EPS * rounded if mode != "plain" else 0.0)
        assert ((y.double() - exact).abs() <= bound).all()


@pytest.mark.parametrize("mode", ["norm", "geglu"])
def test_the_prologue_rounds_its_values_to_the_dtype(mode):
    # with small integer weights and K = 4 every fp32 sum is exact, so y is round(sum w round(x')) where the unfused
    # ops round x' (the norm's output, GeLU and the gate's product) and round(sum w x') where they did not: the two
    # differ in about half the outputs, float64's rounding of x' and the kernel's fp32 one in almost none
    from samu.ops.rowprod_triton import row_product

    torch.manual_seed(7)
    N, K = 64, 4
    w = torch.randint(-3, 4, (N, K), device=DEVICE).to(torch.bfloat16)
    b = torch.zeros(N, device=DEVICE, dtype=torch.bfloat16)
    x = torch.randn(1, 2 * K if mode == "geglu" else K, device=DEVICE).to(torch.bfloat16)
    norm = (torch.rand(K, device=DEVICE).add(0.5).to(torch.bfloat16), 1e-6) if mode == "norm" else None
    y = row_product(x, w, b, norm=norm, geglu=mode == "geglu").double()
    exact, _, _ = _exact(x, w, b, norm, mode == "geglu", None, torch.bfloat16)
    assert (y == exact.to(torch.bfloat16).double()).double().mean() >= 0.98


def test_row_product_leaves_its_inputs_alone():
    from samu.ops.rowprod_triton import row_product

    torch.manual_seed(4)
    w, b = torch.randn(9, 20, device=DEVICE), torch.randn(9, device=DEVICE)
    x, res = torch.randn(1, 20, device=DEVICE), torch.randn(1, 9, device=DEVICE)
    before = (x.clone(), res.clone())
    y = row_product(x, w, b, residual=res)
    assert torch.equal(x, before[0]) and torch.equal(res, before[1])
    assert rel_err(y[0], (w.double() @ x.double()[0] + b.double() + res.double()[0])) < 1e-6


def test_row_product_refuses_more_than_one_row():
    # decoding takes these products at batch 1 only (ResidualLayer.takes_one_row), the forward's above it
    from samu.ops.rowprod_triton import row_product

    w, b = torch.randn(9, 20, device=DEVICE), torch.randn(9, device=DEVICE)
    with pytest.raises(ValueError, match="x must have one row, got 2"):
        row_product(torch.randn(2, 20, device=DEVICE), w, b)
