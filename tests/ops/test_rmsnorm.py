"""The fused RMSNorm kernels against the same maths in float64 (the Triton interpreter on CPU).

Rule, declared before any run: in fp32 y, dx and dweight are within 1e-6 (relative Frobenius) of
float64; in bf16 the fused result is no further from float64 than the PyTorch ops in bf16, or within
one bf16 rounding (eps / 2), whichever is larger; two backward calls give the same bits. A norm written
in another dtype, and a residual sum with its norm (add_rms_norm), equal the same ops one after another:
the forward to the bit, the backward to the bit where no sum joins it, else within 1e-6 of float64 in fp32.
"""

import pytest
import torch

from samu.ops import dispatch
from samu.ops.rmsnorm import add_rms_norm, rms_norm, rms_norm_shifted
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


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_norm_in_another_dtype_is_the_norm_then_the_cast(backend):
    g = torch.Generator().manual_seed(7)
    x, w, dy = torch.randn(3, 5, 40, generator=g), torch.randn(40, generator=g), torch.randn(3, 5, 40, generator=g)
    dy = dy.bfloat16()
    direct = _grads(lambda a, b: rms_norm(a, b, 1e-6, backend, torch.bfloat16), x, w, dy, DEVICE)
    cast = _grads(lambda a, b: rms_norm(a, b, 1e-6, backend).bfloat16(), x, w, dy, DEVICE)
    assert direct[0].dtype == torch.bfloat16
    for name, a, b in zip(("y", "dx", "dweight"), direct, cast):
        assert a.dtype == b.dtype and torch.equal(a, b), name


def _exact_add(x, h, w):
    total = x + h
    return total, _exact(total, w, 1e-6)


def _add_grads(fn, x, h, w, dt, dy, device):
    x, h, w = (t.to(device).requires_grad_() for t in (x, h, w))
    total, y = fn(x, h, w)
    grads = torch.autograd.grad([total, y], [x, h, w], [dt.to(device, total.dtype), dy.to(device, y.dtype)])
    return [total, y, *grads]


@pytest.mark.parametrize("rows", [1, 6])
def test_add_norm_fp32_matches_float64(rows):
    g = torch.Generator().manual_seed(rows)
    x, h, w = torch.randn(rows, 3, 24, generator=g), torch.randn(rows, 3, 24, generator=g), torch.randn(24, generator=g)
    dt, dy = torch.randn(rows, 3, 24, generator=g), torch.randn(rows, 3, 24, generator=g)
    want = _add_grads(_exact_add, *(t.double() for t in (x, h, w)), dt, dy, "cpu")
    got = _add_grads(lambda a, b, c: add_rms_norm(a, b, c, 1e-6, "triton"), x, h, w, dt, dy, DEVICE)
    for name, a, e in zip(("total", "y", "dx", "dh", "dweight"), got, want):
        assert a.dtype == torch.float32 and rel_err(a.cpu(), e) < 1e-6, name


@pytest.mark.parametrize("h_dtype,y_dtype", [(torch.bfloat16, torch.bfloat16), (torch.float32, None),
                                             (torch.bfloat16, None)])
def test_add_norm_equals_the_sum_then_the_norm(h_dtype, y_dtype):
    """The residual stream (fp32) plus a block's output (bf16 under autocast), normalised for a product:
    the fused op against the sum and the norm as two ops, forward and backward, and deterministic."""
    g = torch.Generator().manual_seed(11)
    x, w = torch.randn(4, 5, 48, generator=g), torch.randn(48, generator=g)
    h = torch.randn(4, 5, 48, generator=g).to(h_dtype)
    dt, dy = torch.randn(4, 5, 48, generator=g), torch.randn(4, 5, 48, generator=g)

    def two_ops(backend):
        def fn(a, b, c):
            total = a + b
            return total, rms_norm(total, c, 1e-6, backend, y_dtype)
        return fn

    fused = _add_grads(lambda a, b, c: add_rms_norm(a, b, c, 1e-6, "triton", y_dtype), x, h, w, dt, dy, DEVICE)
    again = _add_grads(lambda a, b, c: add_rms_norm(a, b, c, 1e-6, "triton", y_dtype), x, h, w, dt, dy, DEVICE)
    apart = _add_grads(two_ops("triton"), x, h, w, dt, dy, DEVICE)
    torch_ops = _add_grads(lambda a, b, c: add_rms_norm(a, b, c, 1e-6, "torch", y_dtype), x, h, w, dt, dy, "cpu")
    torch_apart = _add_grads(two_ops("torch"), x, h, w, dt, dy, "cpu")
    exact = _add_grads(_exact_add, x.double(), h.double(), w.double(), dt, dy, "cpu")
    names = ("total", "y", "dx", "dh", "dweight")
    for name, f, f2, a, t, ta, e in zip(names, fused, again, apart, torch_ops, torch_apart, exact):
        assert f.dtype == a.dtype == t.dtype, name
        assert torch.equal(f, f2) and torch.equal(t, ta), name
        if name in ("total", "y", "dweight"):
            assert torch.equal(f, a), name
        else:
            # the sum's cotangent joins the norm's inside the kernel (one rounding fewer, or a fused multiply-add)
            assert rel_err(f.cpu(), e) <= max(rel_err(a.cpu(), e), 1e-6 if f.dtype == torch.float32 else
                                              torch.finfo(f.dtype).eps / 2), name
    assert fused[3].dtype == h_dtype and fused[2].dtype == torch.float32


def test_add_norm_refuses_what_it_cannot_add():
    x, w = torch.randn(2, 3, 8), torch.ones(8)
    with pytest.raises(ValueError, match=r"add must be a tensor of x's shape \[2, 3, 8\] on cpu, got \[8\]"):
        add_rms_norm(x, torch.randn(8), w, 1e-6, "triton")
    with pytest.raises(ValueError, match="add must be a tensor of x's shape"):
        add_rms_norm(x, [1.0], w, 1e-6)
    with pytest.raises(TypeError, match="add must be a floating-point tensor, got torch.int64"):
        add_rms_norm(x, torch.ones(2, 3, 8, dtype=torch.int64), w, 1e-6)
    with pytest.raises(TypeError, match="dtype must be a floating-point torch.dtype or None, got torch.int32"):
        add_rms_norm(x, x, w, 1e-6, dtype=torch.int32)
    with pytest.raises(TypeError, match="dtype must be a floating-point torch.dtype or None, got 'bf16'"):
        rms_norm(x, w, 1e-6, dtype="bf16")
    # float64 anywhere takes the PyTorch ops (the kernels compute in fp32), and the fused backend says so
    total, y = add_rms_norm(x, x.double(), w, 1e-6)
    assert total.dtype == y.dtype == torch.float64
    with pytest.raises(TypeError, match="take bf16, fp16 or fp32"):
        add_rms_norm(x, x.double(), w, 1e-6, "triton")
