"""samu.ops.linear against autocast's own F.linear and against float64.

Rule, declared before any run: under autocast to bf16 or fp16 the output and the input gradient are
autocast's to the bit; the weight and bias gradients are fp32 and within 1e-5 (relative Frobenius) of the
float64 sums of the rounded operands (autocast's own, rounded to the low dtype, sit ~1e-3 away), with the
backward run outside autocast or inside it, for 2-D, 3-D and non-contiguous inputs, an input without gradient,
a frozen bias, and under activation checkpointing; compiled equals eager within the same 1e-5; outside
autocast, for float64 parameters and without gradients it is F.linear to the bit. Runs on CUDA where there is
one (the product writing fp32 itself), else on the CPU.
"""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from samu.modules.layers import Linear
from samu.ops.linear import linear
from tests.helpers import rel_err

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(dtype=torch.float32, bias=True, x_dtype=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 37, 48, generator=g, dtype=x_dtype or dtype).to(DEVICE).requires_grad_()
    w = torch.randn(80, 48, generator=g, dtype=dtype).to(DEVICE).requires_grad_()
    b = torch.randn(80, generator=g, dtype=dtype).to(DEVICE).requires_grad_() if bias else None
    dy = torch.randn(3, 37, 80, generator=g).to(DEVICE)
    return x, w, b, dy


def _run(fn, x, w, b, dy, low=None, backward_inside=False):
    leaves = [t for t in (x, w, b) if t is not None and t.requires_grad]
    for t in leaves:
        t.grad = None
    with torch.autocast(DEVICE, dtype=low or torch.bfloat16, enabled=low is not None):
        y = fn(x, w, b)
        if backward_inside:
            y.backward(dy.to(y.dtype))
    if not backward_inside:
        y.backward(dy.to(y.dtype))
    return [y.detach()] + [t.grad.clone() for t in leaves]


def _exact_grads(x, dy, low, bias=True):
    """The float64 sums of the rounded operands: dW and db."""
    rows = dy.to(low).double().reshape(-1, dy.shape[-1])
    xs = x.detach().to(low).double().reshape(-1, x.shape[-1])
    return [rows.t() @ xs] + ([rows.sum(0)] if bias else [])


# the input fp32 (a residual stream) or already in the product's dtype (a norm's or a gate's output)
@pytest.mark.parametrize("low,x_dtype", [(torch.bfloat16, torch.float32), (torch.bfloat16, torch.bfloat16),
                                         (torch.float16, torch.float32), (torch.float16, torch.float16)])
@pytest.mark.parametrize("bias", [True, False])
def test_under_autocast_the_forward_is_autocasts_and_the_parameter_gradients_fp32_sums(low, bias, x_dtype):
    x, w, b, dy = _inputs(bias=bias, x_dtype=x_dtype)
    got = _run(linear, x, w, b, dy, low)
    ref = _run(F.linear, x, w, b, dy, low)
    assert got[0].dtype == ref[0].dtype == low
    assert torch.equal(got[0], ref[0]), "forward differs from autocast's"
    assert got[1].dtype == x_dtype and torch.equal(got[1], ref[1]), "input gradient differs from autocast's"
    for name, g, r, e in zip(("weight", "bias"), got[2:], ref[2:], _exact_grads(x, dy, low, bias)):
        assert g.dtype == torch.float32
        assert rel_err(g, e) < 1e-5, f"{name} gradient {rel_err(g, e):.2e} from float64"
        # autocast's own gradient is rounded to the low dtype: the rule above tells the two apart
        assert rel_err(r, e) > 1e-4


@pytest.mark.parametrize("case", ["no autocast", "float64", "no grad", "frozen weight"])
def test_elsewhere_it_is_f_linear(case):
    dtype = torch.float64 if case == "float64" else torch.float32
    x, w, b, dy = _inputs(dtype=dtype)
    low = None if case == "no autocast" else torch.bfloat16
    if case == "frozen weight":
        w.requires_grad_(False)
    if case == "no grad":
        with torch.no_grad(), torch.autocast(DEVICE, dtype=low):
            assert torch.equal(linear(x, w, b), F.linear(x, w, b))
        return
    for a, r in zip(_run(linear, x, w, b, dy, low), _run(F.linear, x, w, b, dy, low)):
        assert a.dtype == r.dtype and torch.equal(a, r)


@pytest.mark.parametrize("backward_inside", [False, True])
def test_compiled_equals_eager(backward_inside):
    # torch.compile traces the backward under the forward's autocast state: its products must keep their dtypes
    x, w, b, dy = _inputs()
    eager = _run(linear, x, w, b, dy, torch.bfloat16, backward_inside)
    # aot_eager on the CPU traces the custom op's fake kernel and both graphs; Inductor where CUDA runs
    backend = "inductor" if DEVICE == "cuda" else "aot_eager"
    compiled = _run(torch.compile(linear, backend=backend, fullgraph=True), x, w, b, dy, torch.bfloat16,
                    backward_inside)
    assert torch.equal(compiled[0], eager[0]) and torch.equal(compiled[1], eager[1])
    for a, r, e in zip(compiled[2:], eager[2:], _exact_grads(x, dy, torch.bfloat16)):
        assert a.dtype == r.dtype == torch.float32
        assert rel_err(a, r) < 1e-5 and rel_err(r, e) < 1e-5 and rel_err(a, e) < 1e-5


@pytest.mark.parametrize("case", ["2-D input", "non-contiguous input", "input without gradient", "frozen bias",
                                  "checkpointed"])
def test_the_shapes_and_gradients_a_model_asks_for(case):
    x, w, b, dy = _inputs()
    if case == "2-D input":
        x, dy = x.detach()[0].requires_grad_(), dy[0]
    if case == "non-contiguous input":
        x = x.detach().transpose(0, 1).requires_grad_()
        dy = dy.transpose(0, 1)
    if case == "input without gradient":
        x = x.detach()
    if case == "frozen bias":
        b.requires_grad_(False)
    fn = linear
    if case == "checkpointed":
        fn = lambda x, w, b: torch.utils.checkpoint.checkpoint(linear, x, w, b, use_reentrant=False)  # noqa: E731
    got = _run(fn, x, w, b, dy, torch.bfloat16)
    ref = _run(F.linear, x, w, b, dy, torch.bfloat16)
    assert torch.equal(got[0], ref[0])
    grads = dict(zip([n for n, t in (("x", x), ("w", w), ("b", b)) if t.requires_grad], zip(got[1:], ref[1:])))
    if "x" in grads:
        assert torch.equal(*grads["x"])
    exact = _exact_grads(x, dy, torch.bfloat16)
    assert grads["w"][0].dtype == torch.float32 and rel_err(grads["w"][0], exact[0]) < 1e-5
    if "b" in grads:
        assert rel_err(grads["b"][0], exact[1]) < 1e-5


def test_the_module_is_nn_linear_with_fp32_gradients():
    torch.manual_seed(0)
    plain = nn.Linear(48, 80, device=DEVICE)
    ours = Linear(48, 80, device=DEVICE)
    ours.load_state_dict(plain.state_dict())
    assert isinstance(ours, nn.Linear) and list(ours.state_dict()) == list(plain.state_dict())
    x, _, _, dy = _inputs()
    outputs = []
    for module in (plain, ours):
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            y = module(x)
        y.backward(dy.to(y.dtype))
        outputs.append(y.detach())
    assert torch.equal(*outputs)
    exact = _exact_grads(x, dy, torch.bfloat16)[0]
    assert rel_err(ours.weight.grad, exact) < 1e-5 < rel_err(plain.weight.grad, exact)


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
def test_a_low_weight_is_taken_for_the_cast_and_changes_nothing(low):
    """A bf16 copy of the weight (Linear.low_weight: what samu train's optimizer writes) gives the same output and
    gradients, to the bit, as the cast it replaces, through the function and the module, and compiled (the
    parameter gradients within 1e-5); the products read the copy (a copy that differs shows in the output); a copy
    in another dtype than autocast's is not used, one of another shape refused."""
    x, w, b, dy = _inputs()
    copy = w.detach().to(torch.bfloat16)
    with_copy = lambda x, w, b: linear(x, w, b, low_weight=copy)   # noqa: E731
    ref = _run(linear, x, w, b, dy, low)
    got = _run(with_copy, x, w, b, dy, low)
    for a, r in zip(got, ref):
        assert a.dtype == r.dtype and torch.equal(a, r)
    if low == torch.bfloat16:
        backend = "inductor" if DEVICE == "cuda" else "aot_eager"
        compiled = _run(torch.compile(with_copy, backend=backend), x, w, b, dy, low)
        assert torch.equal(compiled[0], ref[0]) and torch.equal(compiled[1], ref[1])
        for c, r in zip(compiled[2:], ref[2:]):   # the parameter gradients: fp32 sums, within the module's rule
            assert c.dtype == torch.float32 and rel_err(c, r) < 1e-5
        with pytest.raises(ValueError, match="low_weight"), torch.autocast(DEVICE, dtype=low):
            linear(x, w, b, low_weight=copy[:, 1:])
        module = Linear(48, 80, device=DEVICE)
        with torch.no_grad():
            module.weight.copy_(w)
            module.bias.copy_(b)
        module.low_weight = copy
        through_module = _run(lambda x, w, b: module(x), x, module.weight, module.bias, dy, low)
        assert all(torch.equal(a, r) for a, r in zip(through_module, ref))
        with torch.no_grad():
            copy.mul_(2)   # no longer the weight's cast: the products take it all the same
        assert not torch.equal(_run(with_copy, x, w, b, dy, low)[0], ref[0])
