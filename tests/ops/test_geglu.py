"""The fused GeGLU gate against the same maths in float64 and against the unfused PyTorch ops.

The Triton kernels run in the interpreter on CPU (CUDA with -m gpu). Narrow programs are forced for
some cases so that a row spans several programs with a partial last one.
Rule, declared before any run: in fp32 a and dz are within 1e-6 (relative Frobenius) of float64; in
bf16 and fp16 the fused result is no further from float64 than the unfused PyTorch ops in that dtype,
or within one rounding of the dtype (eps / 2), whichever is larger, and every element of a and dz is
within one unit of the dtype (eps |exact|, at least one subnormal step) of float64: two roundings at
most, as the ops round (GeLU computed without the cancellation of 1 + tanh near -1); two backward
calls give the same bits.
"""

import pytest
import torch
import torch.nn.functional as F

from samu.ops import dispatch
from samu.ops.geglu import geglu, geglu_torch
from tests.helpers import rel_err

pytestmark = pytest.mark.skipif(not dispatch.triton_available(), reason="triton is not installed")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _exact(z):
    gate, up = z.double().chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


def _run(fn, z, da, device, dtype=None):
    z = z.to(device=device, dtype=dtype or z.dtype).requires_grad_()
    a = fn(z)
    (dz,) = torch.autograd.grad(a, [z], da.to(device=device, dtype=a.dtype))
    return [a, dz]


def _inputs(shape, H, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    z = (torch.randn(*shape, 2 * H, generator=g) * 2).to(dtype)
    da = torch.randn(*shape, H, generator=g).to(dtype)
    return z, da


# leading shapes and H: one row, a batch of tokens, a row spanning several narrow programs
CASES = [((1,), 8), ((2, 7), 20), ((3,), 600), ((1, 1, 5), 1030)]


@pytest.fixture(params=[False, True], ids=["wide", "narrow"])
def programs(request, monkeypatch):
    from samu.ops import geglu_triton

    if request.param:   # rows over FEW_ROWS take BLOCK columns a program: force several per row
        monkeypatch.setattr(geglu_triton, "BLOCK", 64)
        monkeypatch.setattr(geglu_triton, "FEW_ROWS", 0)


@pytest.mark.parametrize("shape,H", CASES)
def test_fp32_matches_float64(shape, H, programs):
    z, da = _inputs(shape, H, torch.float32, H)
    exact = _run(_exact, z, da, "cpu", torch.float64)
    fused = _run(lambda t: geglu(t, "triton"), z, da, DEVICE)
    for name, f, e in zip(("a", "dz"), fused, exact):
        assert f.dtype == torch.float32 and f.shape == e.shape and rel_err(f.cpu(), e) < 1e-6, name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape,H", CASES[1:3])
def test_low_precision_rounds_as_the_unfused_ops(shape, H, dtype, programs):
    z, da = _inputs(shape, H, dtype, 3)
    exact = _run(_exact, z, da, "cpu", torch.float64)
    unfused = _run(geglu_torch, z, da, "cpu")
    fused = _run(lambda t: geglu(t, "triton"), z, da, DEVICE)
    again = _run(lambda t: geglu(t, "triton"), z, da, DEVICE)
    rounding = torch.finfo(dtype).eps / 2
    for name, f, u, e, f2 in zip(("a", "dz"), fused, unfused, exact, again):
        assert f.dtype == dtype, name
        assert rel_err(f.cpu(), e) <= max(rel_err(u, e), rounding), name
        unit = torch.finfo(dtype).eps * (e.abs() + torch.finfo(dtype).tiny)
        assert ((f.cpu().double() - e).abs() <= unit).all(), name
        assert torch.equal(f, f2), name


def test_torch_backend_and_bad_backend():
    z = torch.randn(3, 8)
    assert torch.equal(geglu(z, "torch"), geglu_torch(z))
    assert torch.equal(geglu(z), geglu_torch(z))   # auto on CPU: the PyTorch ops
    with pytest.raises(ValueError, match="glue backend must be one of"):
        geglu(z, "fast")
