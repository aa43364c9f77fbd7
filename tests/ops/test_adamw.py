"""The clipped AdamW step's kernels against the same step in float64 (torch's AdamW on float64 copies after
clipping in float64), and against torch's fused AdamW, whose state it shares.

The kernels run in the interpreter on CPU (CUDA where there is one), with chunks of 2 x 512 elements so that
parameters of one partial chunk, of whole chunks and of whole chunks and a partial one are all stepped.
Rule, declared before any run: after three steps (the gradients' norm above the limit, below it, above it again;
weight decay, lr, betas and eps of each group its own, the lrs changed between steps; eps 1e-3 and 1e-2, so that a
misplaced eps shows), every parameter and both moments are within 1e-6 (relative Frobenius) of float64, and the
returned norms within 1e-6 of the float64 norms; two runs give the same bits; a parameter without a gradient is
left as it is, with no state; a non-finite gradient gives a non-finite norm and nan exactly where torch's clip and
step put them.
"""

import warnings

import pytest
import torch
from torch import nn

from samu.ops import adamw, dispatch
from tests.helpers import poison_allocations, rel_err

pytestmark = pytest.mark.skipif(not dispatch.triton_available(), reason="triton is not installed")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SIZES = (37, 1024, 2500, 3)   # one partial chunk, one whole, two whole and a partial, a tiny one
SCALES = (30.0, 1e-3, 10.0)   # gradients above the limit of 1, below it, above it
HYPER = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-3)


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    from samu.ops import adamw_triton

    poison_allocations(monkeypatch)
    monkeypatch.setattr(adamw_triton, "BLOCK", 512)
    monkeypatch.setattr(adamw_triton, "PASSES", 2)
    monkeypatch.setattr(adamw_triton, "CHUNK", 1024)


def _params(dtype=torch.float32, device=DEVICE):
    g = torch.Generator().manual_seed(0)
    return [nn.Parameter(torch.randn(n, generator=g, dtype=torch.float64).to(device=device, dtype=dtype))
            for n in SIZES] + [nn.Parameter(torch.ones(5, dtype=dtype, device=device))]   # never has a gradient


def _optimizer(params, kind=torch.optim.AdamW, **kw):
    groups = [{"params": params[:2], "weight_decay": 0.1},
              {"params": params[2:], "weight_decay": 0.0, "lr": 3e-2, "betas": (0.8, 0.99), "eps": 1e-2}]
    return kind(groups, **HYPER, **kw)


def _decay_lr(opt):
    # as a schedule would between steps
    for group in opt.param_groups:
        group["lr"] *= 0.7


def _gradients(step):
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(n, generator=g, dtype=torch.float64) * SCALES[step] for n in SIZES]


def _set(params, grads):
    for p, g in zip(params, grads):
        p.grad = g.to(device=p.device, dtype=p.dtype)


def _torch_step(params, opt):
    """torch's clip (over the parameters that get gradients) and step; returns the norm before."""
    norm = nn.utils.get_total_norm([p.grad for p in params[:len(SIZES)]])
    nn.utils.clip_grads_with_norm_(params[:len(SIZES)], 1.0, norm)
    opt.step()
    return norm


def _float64_run(steps=len(SCALES)):
    params = _params(torch.float64, "cpu")
    opt = _optimizer(params, foreach=False)
    norms = []
    for step in range(steps):
        _set(params, _gradients(step))
        norms.append(_torch_step(params, opt))
        _decay_lr(opt)
    return params, opt, norms


def _kernel_run(steps=len(SCALES), params=None, opt=None):
    params = _params() if params is None else params
    opt = _optimizer(params, fused=True) if opt is None else opt
    assert adamw.unsupported(opt) is None
    norms = []
    for step in range(steps):
        _set(params, _gradients(step))
        norms.append(adamw.clipped_step(opt, 1.0))
        _decay_lr(opt)
    return params, opt, norms


def test_matches_float64():
    want, want_opt, want_norms = _float64_run()
    got, opt, norms = _kernel_run()
    for a, b in zip(norms, want_norms):
        assert rel_err(a.cpu(), b) < 1e-6
    for i, (p, q) in enumerate(zip(got[:len(SIZES)], want)):
        assert rel_err(p.cpu(), q) < 1e-6, i
        for key in ("exp_avg", "exp_avg_sq"):
            assert rel_err(opt.state[p][key].cpu(), want_opt.state[q][key]) < 1e-6, (i, key)
        assert float(opt.state[p]["step"]) == len(SCALES)
    untouched = got[-1]
    assert torch.equal(untouched.detach(), torch.ones_like(untouched)) and not opt.state[untouched]


def test_same_bits_every_run():
    (a, _, norms_a), (b, _, norms_b) = _kernel_run(), _kernel_run()
    for p, q in zip(a, b):
        assert torch.equal(p, q)
    for n, m in zip(norms_a, norms_b):
        assert torch.equal(n, m)


@pytest.mark.parametrize("first", ["kernels", "torch"])
def test_state_moves_between_the_kernels_and_torch(first):
    """Two steps by one, the state saved and loaded into an optimizer of the other, a third step by it: the same
    result as three steps in float64 (the state dict's format is torch's fused AdamW's)."""
    want, _, _ = _float64_run()
    params = _params()
    opt = _optimizer(params, fused=True)
    for step in range(2):
        _set(params, _gradients(step))
        if first == "kernels":
            adamw.clipped_step(opt, 1.0)
        else:
            _torch_step(params, opt)
        _decay_lr(opt)
    moved = [nn.Parameter(p.detach().clone()) for p in params]
    other = _optimizer(moved, fused=True)
    other.load_state_dict(opt.state_dict())
    _set(moved, _gradients(2))
    if first == "kernels":
        _torch_step(moved, other)
    else:
        adamw.clipped_step(other, 1.0)
    for i, (p, q) in enumerate(zip(moved[:len(SIZES)], want)):
        assert rel_err(p.cpu(), q) < 1e-6, i


def test_a_loaded_state_is_the_one_stepped():
    """The rows the step keeps between calls follow a state replaced by load_state_dict: a step taken again from a
    saved state and saved parameters gives the same bits."""
    import copy

    params, opt, _ = _kernel_run(steps=2)
    saved, weights = copy.deepcopy(opt.state_dict()), [p.detach().clone() for p in params]
    _set(params, _gradients(2))
    adamw.clipped_step(opt, 1.0)
    once = [p.detach().clone() for p in params]
    opt.load_state_dict(saved)
    with torch.no_grad():
        for p, w in zip(params, weights):
            p.copy_(w)
    adamw.clipped_step(opt, 1.0)
    for p, q in zip(params, once):
        assert torch.equal(p, q)
    assert float(opt.state[params[0]]["step"]) == 3


@pytest.mark.filterwarnings("ignore:invalid value encountered")   # the interpreter's inf / inf, as intended
def test_a_non_finite_gradient_gives_what_torch_gives():
    params = _params()
    opt = _optimizer(params, fused=True)
    want = [nn.Parameter(p.detach().clone()) for p in params]
    want_opt = _optimizer(want, fused=True)
    grads = _gradients(0)
    grads[2][5] = float("inf")
    _set(params, grads)
    _set(want, grads)
    norm = adamw.clipped_step(opt, 1.0)
    want_norm = _torch_step(want, want_opt)
    assert not torch.isfinite(norm) and not torch.isfinite(want_norm)
    for p, q in zip(params, want):
        assert torch.equal(p.isnan(), q.isnan())


def test_clipped_adamw_steps_on_the_kernels_or_else_as_torch():
    """ClippedAdamW's step is clipped_step where the kernels take the optimizer and the gradients, and torch's clip
    and step where they do not (a gradient that is not contiguous; maximize): within 1e-6 of float64 either way.
    It tells a GradScaler to unscale for it, and keeps max_norm through a copy."""
    import copy

    want, _, want_norms = _float64_run()
    params = _params()
    opt = _optimizer(params, adamw.ClippedAdamW, max_norm=1.0, fused=True)
    for step in range(len(SCALES)):
        _set(params, _gradients(step))
        grads = [p.grad.clone() for p in params[:len(SIZES)]]
        opt.step()
        assert rel_err(opt.grad_norm.cpu(), want_norms[step]) < 1e-6
        # the kernels' step: the gradients as they were (torch's clips them in place, at steps 0 and 2 here)
        assert all(torch.equal(p.grad, g) for p, g in zip(params, grads))
        _decay_lr(opt)
    for p, q in zip(params, want):
        assert rel_err(p.cpu(), q) < 1e-6
    assert opt._step_supports_amp_scaling is False and copy.deepcopy(opt).max_norm == 1.0
    with pytest.raises(TypeError, match="positional argument"):
        adamw.ClippedAdamW(params, 1.0)   # max_norm is keyword-only: lr comes second in torch's AdamW
    with pytest.raises(ValueError, match="max_norm"):
        adamw.ClippedAdamW(params, max_norm=0.0)

    def one_step(opt, grad):
        matrix = opt.param_groups[0]["params"][0]
        matrix.grad = grad
        opt.step()
        return matrix

    start = torch.randn(6, 4, generator=torch.Generator().manual_seed(1))
    grad = torch.randn(4, 6, generator=torch.Generator().manual_seed(2)).t().to(DEVICE)   # not contiguous
    torch.optim.AdamW([nn.Parameter(torch.ones(1))])   # torch wraps AdamW.step in its hooks' wrapper from here on
    for options in (dict(), dict(maximize=True)):
        opt = adamw.ClippedAdamW([nn.Parameter(start.clone().to(DEVICE))], max_norm=1.0, **options)
        hooks = []
        opt.register_step_pre_hook(lambda *a: hooks.append("pre"))
        opt.register_step_post_hook(lambda *a: hooks.append("post"))
        with warnings.catch_warnings(record=True) as shown:
            warnings.simplefilter("always")
            got = one_step(opt, grad)
        assert hooks == ["pre", "post"]
        # a gradient the kernels cannot read says so once; an optimizer they do not take (maximize) goes quietly
        assert len([w for w in shown if "torch's clip" in str(w.message)]) == (0 if options else 1)
        ref = nn.Parameter(start.double())
        ref.grad = grad.double().cpu()
        nn.utils.clip_grads_with_norm_([ref], 1.0, nn.utils.get_total_norm([ref.grad]))
        torch.optim.AdamW([ref], foreach=False, **options).step()
        assert rel_err(got.cpu(), ref) < 1e-6, options


def test_low_copies_are_the_parameters_cast_after_every_step(monkeypatch):
    """A ClippedAdamW's low copies equal their parameters cast to bf16 (to the bit, round to nearest even) after
    every step, on the kernels (parameters of one partial chunk, and of whole chunks and a partial one) and where
    torch's step runs (the kernels refusing a step); a parameter without one is stepped as before, and a tensor
    that is not one of the optimizer's parameters is refused."""
    params = _params()
    want, _, _ = _kernel_run()
    opt = _optimizer(params, adamw.ClippedAdamW, max_norm=1.0, fused=True)
    lows = {i: opt.keep_low_copy(params[i]) for i in (0, 2)}
    assert opt.keep_low_copy(params[0]) is lows[0] and lows[0].dtype == torch.bfloat16
    for step in range(len(SCALES)):
        _set(params, _gradients(step))
        opt.step()
        for i, low in lows.items():
            assert torch.equal(low, params[i].detach().to(torch.bfloat16)), (step, i)
        _decay_lr(opt)
    for p, q in zip(params, want):
        assert torch.equal(p, q)

    def refuse(optimizer, max_norm):
        raise adamw.Unusable("refused here")

    monkeypatch.setattr(adamw, "clipped_step", refuse)
    before = [p.detach().clone() for p in params]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _set(params, _gradients(0))
        opt.step()
    assert not torch.equal(params[0], before[0]) and not torch.equal(params[2], before[2])
    for i, low in lows.items():
        assert torch.equal(low, params[i].detach().to(torch.bfloat16)), i
    with pytest.raises(ValueError, match="not a parameter"):
        opt.keep_low_copy(nn.Parameter(torch.ones(3, device=DEVICE)))


@pytest.mark.gpu
def test_an_unfused_state_steps_on_the_kernels():
    """An unfused AdamW keeps its step counters on the host; loaded into a ClippedAdamW on CUDA they move to the
    device, where the kernels read them."""
    want, _, _ = _float64_run()
    params = _params()
    opt = _optimizer(params, fused=False, foreach=False)
    for step in range(2):
        _set(params, _gradients(step))
        _torch_step(params, opt)
        _decay_lr(opt)
    clipped = _optimizer(params, adamw.ClippedAdamW, max_norm=1.0, fused=True)
    clipped.load_state_dict(opt.state_dict())
    _set(params, _gradients(2))
    clipped.step()
    assert clipped.state[params[0]]["step"].device == params[0].device
    for p, q in zip(params[:len(SIZES)], want):
        assert rel_err(p.cpu(), q) < 1e-6


def test_what_it_does_not_take():
    params = _params()
    assert "amsgrad" in adamw.unsupported(torch.optim.AdamW(params, amsgrad=True))
    assert "AdamW only" in adamw.unsupported(torch.optim.Adam(params))
    assert "fp32" in adamw.unsupported(torch.optim.AdamW([nn.Parameter(torch.ones(3, dtype=torch.float64))]))
    assert "16-byte" in adamw.unsupported(torch.optim.AdamW([nn.Parameter(torch.ones(9)[1:])]))
    assert "capturable" in adamw.unsupported(torch.optim.AdamW(params, capturable=True))
    flat = nn.Parameter(torch.ones(8))
    flat._is_flat_param = True   # as FSDP1 marks its shards
    with pytest.raises(ValueError, match="clip_grad_norm_"):
        adamw.ClippedAdamW([flat], max_norm=1.0)
    matrix = nn.Parameter(torch.ones(4, 6, device=DEVICE))
    matrix.grad = torch.ones(6, 4, device=DEVICE).t()   # not contiguous
    opt = torch.optim.AdamW([params[0], matrix], fused=True)
    assert adamw.unsupported(opt) is None
    with pytest.raises(adamw.Unusable, match="gradient of parameter 1 of group 0"):
        adamw.clipped_step(opt, 1.0)
    with pytest.raises(ValueError, match="max_norm"):
        adamw.clipped_step(opt, 0.0)
