"""Decoding's skinny products (samu.ops.gemv) against PyTorch ops (the interpreter on CPU, CUDA with -m gpu).

Rule, declared before any run: in fp32 every output within 1e-6 (relative Frobenius) of float64; in bf16
and fp16 within one rounding of the dtype (eps / 2) of the same PyTorch ops in that dtype (F.linear, the
bias, the residual sum, the GeLU and the gate product rounding where the kernel rounds); every output
element written (outputs start as NaN); more rows than MAX_ROWS take the PyTorch ops.
"""

import pytest
import torch
import torch.nn.functional as F

from samu.ops import dispatch, gemv
from tests.helpers import rel_err

pytestmark = pytest.mark.skipif(not dispatch.triton_available(), reason="triton is not installed")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def nan_outputs(monkeypatch):
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: empty(*a, **kw).fill_(float("nan")))


def _inputs(M, K, N, dtype, seed, rows=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g)
    w = torch.randn(rows * N, K, generator=g) * K ** -0.5
    b = torch.randn(rows * N, generator=g)
    r = torch.randn(M, N, generator=g)
    return [t.to(dtype) for t in (x, w, b, r)]


def _close(got, same_dtype, exact64, dtype):
    if dtype == torch.float32:
        return rel_err(got.cpu(), exact64) < 1e-6
    return rel_err(got.float().cpu(), same_dtype.float()) <= torch.finfo(dtype).eps / 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("M,K,N", [(1, 40, 24), (5, 300, 33), (64, 64, 16)])
def test_linear_with_bias_and_residual(M, K, N, dtype):
    x, w, b, r = _inputs(M, K, N, dtype, seed=M + K + N)
    dev = [t.to(DEVICE) for t in (x, w, b, r)]
    for bias, res in ((True, True), (True, False), (False, False)):
        args = (b if bias else None, r if res else None)
        got = gemv.linear(dev[0], dev[1], dev[2] if bias else None, dev[3] if res else None, backend="triton")
        assert got.dtype == dtype and got.shape == (M, N) and torch.isfinite(got).all()
        exact = F.linear(x.double(), w.double(), None if not bias else b.double())
        exact = exact if not res else r.double() + exact
        assert _close(got, gemv.linear(x, w, *args, backend="torch"), exact, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("M,K,H", [(1, 40, 24), (3, 520, 17)])
def test_geglu(M, K, H, dtype):
    x, w, b, _ = _inputs(M, K, H, dtype, seed=M + K, rows=2)
    got = gemv.geglu(x.to(DEVICE), w.to(DEVICE), b.to(DEVICE), backend="triton")
    assert got.shape == (M, H) and torch.isfinite(got).all()
    gate, up = F.linear(x.double(), w.double(), b.double()).chunk(2, dim=-1)
    assert _close(got, gemv.geglu(x, w, b, backend="torch"), F.gelu(gate, approximate="tanh") * up, dtype)


def test_more_rows_than_a_program_holds_take_pytorch():
    x, w, b, r = _inputs(gemv.MAX_ROWS + 1, 32, 16, torch.float32, seed=1)
    x, w, b, r = (t.to(DEVICE) for t in (x, w, b, r))
    assert torch.equal(gemv.linear(x, w, b, r, backend="triton"), r + F.linear(x, w, b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M", [1, 3, 20])   # fused RMSNorm up to NORM_ROWS rows, its own kernel beyond
def test_rmsnorm_first_and_split_k(M, dtype, monkeypatch):
    from samu.ops import gemv_triton
    from samu.ops.rmsnorm import rms_norm_torch

    monkeypatch.setattr(gemv_triton, "TARGET_PROGRAMS", 64)   # K split in several slices at these sizes
    K, N = 700, 48
    x, w, b, r = _inputs(M, K, N, dtype, seed=M)
    g = (1 + 0.3 * torch.randn(K, generator=torch.Generator().manual_seed(5))).to(dtype)
    dev = [t.to(DEVICE) for t in (x, w, b, r, g)]
    got = gemv.linear(*dev[:4], backend="triton", norm=(dev[4], 1e-6))
    xn = rms_norm_torch(x.double(), g.double(), 1e-6)
    exact = r.double() + F.linear(xn, w.double(), b.double())
    assert _close(got, gemv.linear(x, w, b, r, backend="torch", norm=(g, 1e-6)), exact, dtype)
    w2 = torch.cat([w, w.flip(0)])
    got = gemv.geglu(dev[0], w2.to(DEVICE), torch.cat([b, b]).to(DEVICE), backend="triton", norm=(dev[4], 1e-6))
    gate, up = F.linear(xn, w2.double(), torch.cat([b, b]).double()).chunk(2, dim=-1)
    assert _close(got, gemv.geglu(x, w2, torch.cat([b, b]), backend="torch", norm=(g, 1e-6)),
                  F.gelu(gate, approximate="tanh") * up, dtype)
    # the ticket counters are back to zero for the next launch, and a rerun is the same to the bit
    assert not gemv_triton._buffers(dev[0].device)[0].any()
    assert torch.equal(got, gemv.geglu(dev[0], w2.to(DEVICE), torch.cat([b, b]).to(DEVICE), backend="triton",
                                       norm=(dev[4], 1e-6)))
