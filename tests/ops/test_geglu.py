"""The fused GeGLU gate against the same maths in float64 and against the unfused PyTorch ops.

The Triton kernels run in the interpreter on CPU (CUDA with -m gpu). Narrow programs are forced for
some cases so that a row spans several programs with a partial last one.
Rule, declared before any run: in fp32 a and dz are within 1e-6 (relative Frobenius) of float64, and the summing
backward's sums of dz over rows within 1e-6 of their float64 sums (1e-5 for the product-and-gate unit's bias
gradient, samu.ops.linear's rule); in
bf16 and fp16 the fused result is no further from float64 than the unfused PyTorch ops in that dtype,
or within one rounding of the dtype (eps / 2), whichever is larger, and every element of a and dz is
within one unit of the dtype (eps |exact|, at least one subnormal step) of float64: two roundings at
most, as the ops round (GeLU computed without the cancellation of 1 + tanh near -1); two backward
calls give the same bits.
"""

import pytest
import torch

from samu.ops import dispatch
from samu.ops.geglu import geglu, geglu_torch
from tests.helpers import poison_allocations, rel_err

pytestmark = pytest.mark.skipif(not dispatch.triton_available(), reason="triton is not installed")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def nan_outputs(monkeypatch):
    poison_allocations(monkeypatch)


def _gelu64(v):
    # the tanh form v sigmoid(2u) in float64: F.gelu's 0.5 v (1 + tanh u) cancels to 0 below v ~ -7 even there
    return v * torch.sigmoid(2 * 0.7978845608028654 * (v + 0.044715 * v ** 3))


def _exact(z):
    gate, up = z.double().chunk(2, dim=-1)
    return _gelu64(gate) * up


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


def test_extreme_gates_give_finite_values_and_slopes():
    # a grid through the cancellation region and far beyond it, both ways, and values whose cube overflows
    v = torch.cat([torch.linspace(-30, 30, 601), torch.tensor([-1e13, -1e6, -100.0, 100.0, 1e6, 1e13])])
    z = torch.cat([v[None], torch.ones(1, v.numel())], dim=-1)
    a, dz = _run(lambda t: geglu(t, "triton"), z, torch.ones(1, v.numel()), DEVICE)
    exact_a, exact_dz = _run(_exact, z, torch.ones(1, v.numel()), "cpu", torch.float64)
    assert torch.isfinite(a).all() and torch.isfinite(dz).all()
    gate_slope, exact_slope = dz[0, :v.numel()].cpu().double(), exact_dz[0, :v.numel()]
    # fp32 GeLU can be no closer than a few ulp times its condition number |v g'(v) / g(v)| (~3 |2u| in
    # the tail, where exp(-2u) amplifies the rounding of u); below fp32's range, within 1e-30
    cond = (v.double() * exact_slope / exact_a[0]).abs().nan_to_num(0.0)
    eps = torch.finfo(torch.float32).eps
    assert ((a.cpu().double() - exact_a).abs() <= 4 * eps * (1 + cond) * exact_a.abs() + 1e-30).all()
    assert ((gate_slope - exact_slope).abs() <= 1e-5 * exact_slope.abs() + 1e-30).all()


def test_torch_backend_and_bad_backend():
    z = torch.randn(3, 8)
    assert torch.equal(geglu(z, "torch"), geglu_torch(z))
    assert torch.equal(geglu(z), geglu_torch(z))   # auto on CPU: the PyTorch ops
    with pytest.raises(ValueError, match="glue backend must be one of"):
        geglu(z, "fast")


def test_a_compiled_gate_runs_the_fused_kernels(monkeypatch):
    """Inside a torch.compile trace the gate is the custom ops samu::geglu_fwd and samu::geglu_bwd (not the
    PyTorch ops, which Inductor would fuse on its own): no graph break, each kernel runs, and the compiled
    call gives the eager call's bits."""
    from samu.ops import geglu_triton

    calls = []
    for name in ("geglu_fwd", "geglu_bwd"):
        kernel = getattr(geglu_triton, name)
        monkeypatch.setattr(geglu_triton, name, lambda *a, kernel=kernel, name=name: calls.append(name) or kernel(*a))
    z, da = _inputs((2, 7), 20, torch.float32, 4)

    def gate(t):
        return geglu(t, "triton")

    explanation = torch._dynamo.explain(gate)(z.to(DEVICE))
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    torch._dynamo.reset()
    calls.clear()
    compiled = _run(torch.compile(gate, fullgraph=True, backend="aot_eager"), z, da, DEVICE)
    assert calls == ["geglu_fwd", "geglu_bwd"]
    eager = _run(gate, z, da, DEVICE)
    for c, e in zip(compiled, eager):
        assert torch.equal(c, e)


@pytest.fixture
def few_rows(monkeypatch):
    # groups of 8 rows (not 32: the interpreter walks them one by one), columns in programs of 512
    from samu.ops import geglu_triton

    monkeypatch.setattr(geglu_triton, "ROWS", 8)
    monkeypatch.setattr(geglu_triton, "BLOCK", 512)


@pytest.mark.parametrize("rows", [1, 19])   # one partial group of rows; two whole and a partial one
def test_the_summing_backward_writes_the_same_dz_and_its_sums(rows, few_rows):
    """geglu_bwd_sums: geglu_bwd's dz to the bit, and its sum over rows within 1e-6 of the float64 sum of the
    stored dz (two programs a row, the second partial), the same bits in two calls."""
    from samu.ops import geglu_triton

    for dtype in (torch.bfloat16, torch.float32):
        z, da = _inputs((rows,), 600, dtype, rows)
        z, da = z.to(DEVICE), da.to(DEVICE)
        want = geglu_triton.geglu_bwd(da, z)
        dz, sums = geglu_triton.geglu_bwd_sums(da, z)
        again = geglu_triton.geglu_bwd_sums(da, z)
        assert torch.equal(dz, want) and sums.dtype == torch.float32 and sums.shape == (1200,)
        assert rel_err(sums.cpu(), want.double().sum(0).cpu()) < 1e-6, dtype
        assert torch.equal(again[0], dz) and torch.equal(again[1], sums)


def _mlp_in(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 37, 24, generator=g).to(DEVICE, dtype).requires_grad_()
    w = (torch.randn(80, 24, generator=g) / 5).to(DEVICE).requires_grad_()
    b = torch.randn(80, generator=g).to(DEVICE).requires_grad_()
    da = torch.randn(2, 37, 40, generator=g).to(DEVICE)
    return x, w, b, da


def _grads(fn, x, w, b, da):
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        a = fn(x, w, b)
    return [a.detach(), *torch.autograd.grad(a, [x, w, b], da.to(a.dtype))]


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
def test_the_product_and_gate_as_one_unit_equal_the_two(x_dtype, few_rows):
    """linear_geglu under bf16 autocast runs as one unit whose bias gradient comes from the summing backward: the
    output, dx and dW equal geglu(linear(...))'s to the bit (also with the weight's bf16 copy, and compiled from
    fp32 x), db within 1e-5 of the float64 sum of the stored dz (the rule of samu.ops.linear's gradients); the
    products read the copy (one that differs shows in the output)."""
    from samu.ops import geglu_triton
    from samu.ops.geglu import linear_geglu
    from samu.ops.linear import linear

    x, w, b, da = _mlp_in(dtype=x_dtype)
    summed = []
    kernel = geglu_triton.geglu_bwd_sums
    geglu_triton.geglu_bwd_sums = lambda *a: summed.append(1) or kernel(*a)
    try:
        unit = _grads(lambda x, w, b: linear_geglu(x, w, b, backend="triton"), x, w, b, da)
    finally:
        geglu_triton.geglu_bwd_sums = kernel
    assert summed == [1], "the unit's backward did not run the summing kernel"
    two = _grads(lambda x, w, b: geglu(linear(x, w, b), "triton"), x, w, b, da)
    for name, u, t in zip(("a", "dx", "dW"), unit, two):
        assert u.dtype == t.dtype and torch.equal(u, t), name
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        z = linear(x, w, b)
    dz = geglu_triton.geglu_bwd(da.to(z.dtype).contiguous(), z.detach().contiguous())
    exact = dz.double().reshape(-1, 80).sum(0)
    assert unit[3].dtype == torch.float32 and rel_err(unit[3].cpu(), exact.cpu()) < 1e-5
    copy = w.detach().to(torch.bfloat16)
    with_copy = _grads(lambda x, w, b: linear_geglu(x, w, b, copy, "triton"), x, w, b, da)
    assert all(torch.equal(c, u) for c, u in zip(with_copy, unit))
    if x_dtype != torch.float32:
        return
    doubled = _grads(lambda x, w, b: linear_geglu(x, w, b, copy * 2, "triton"), x, w, b, da)
    assert not torch.equal(doubled[0], unit[0])
    backend = "inductor" if DEVICE == "cuda" else "aot_eager"
    compiled = _grads(torch.compile(lambda x, w, b: linear_geglu(x, w, b, copy, "triton"), backend=backend),
                      x, w, b, da)
    assert all(torch.equal(c, u) for c, u in zip(compiled[:3], unit[:3]))
    assert rel_err(compiled[3].cpu(), exact.cpu()) < 1e-5


def test_the_unit_runs_only_where_linear_takes_its_autocast_path():
    """Without autocast, without the fused kernels, without gradients or without a bias that wants one:
    geglu(linear(...)) itself (no unit in the graph); a copy of the wrong shape is refused."""
    from samu.ops.geglu import _LinearGeGLU, linear_geglu
    from samu.ops.linear import linear

    x, w, b, _ = _mlp_in()
    frozen = b.detach()
    for backend, cast, grad, bias in (("triton", False, True, b), ("torch", True, True, b),
                                      ("triton", True, False, b), ("triton", True, True, frozen),
                                      ("triton", True, True, None)):
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=cast), torch.set_grad_enabled(grad):
            got = linear_geglu(x, w, bias, backend=backend)
            assert torch.equal(got, geglu(linear(x, w, bias), backend))
            assert got.grad_fn is None or not isinstance(got.grad_fn, _LinearGeGLU._backward_cls)
    with pytest.raises(ValueError, match="low_weight"), torch.autocast(x.device.type, dtype=torch.bfloat16):
        linear_geglu(x, w, b, w.detach().to(torch.bfloat16)[:, 1:], "triton")
