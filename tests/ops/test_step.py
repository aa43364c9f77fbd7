"""The fused one-token step kernels against the serial reference's step (the interpreter on CPU).

Rule, declared before any run: the new state within 1e-5 (relative Frobenius) of the float64 reference's
step from the same state, y_t within that plus one rounding of its dtype, in fp32 and from bf16 and fp16
input; every output element written (the buffers start as NaN).
"""

import pytest
import torch

from samu.ops import dispatch
from samu.ops.step import rglru_step, samu_step
from tests.helpers import poison_allocations, rel_err, rglru_params, samu_params

pytestmark = pytest.mark.skipif(not dispatch.triton_available(), reason="triton is not installed")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def nan_buffers(monkeypatch):
    """Every new buffer the fused step allocates starts as NaN, so an unwritten element fails."""
    poison_allocations(monkeypatch)


def _check(step, params, B, D, dtype, seed, **kw):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, D, generator=g).to(dtype)
    state = torch.randn(B, D, generator=g)
    exact_y, exact_h = step(x.double(), *[p.double() for p in params], state.double(), backend="torch", **kw)
    dev = [p.detach().to(DEVICE) for p in params]
    for s in (state, None):
        y, h = step(x.to(DEVICE), *dev, None if s is None else s.to(DEVICE), backend="triton", **kw)
        ey, eh = (exact_y, exact_h) if s is not None else step(x.double(), *[p.double() for p in params], None,
                                                               backend="torch", **kw)
        assert y.dtype == dtype and h.dtype == torch.float32 and h.shape == (B, D)
        assert torch.isfinite(h).all()
        assert rel_err(h.cpu(), eh) < 1e-5 and rel_err(y.float().cpu(), ey.to(dtype).float()) < 1e-5 + (
            0 if dtype == torch.float32 else torch.finfo(dtype).eps)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("B,D", [(1, 8), (3, 20), (2, 64)])
def test_samu_step_matches_the_reference(B, D, dtype):
    _check(samu_step, samu_params(D, seed=D), B, D, dtype, seed=B + D, radial_bound=2.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("B,D,H", [(1, 16, 2), (2, 40, 4), (1, 96, 2), (1, 128, 2), (18, 16, 2), (3, 300, 4)])
# head dims 8, 10, 48, 64, 75; 18 rows: more than one program's STEP_ROWS; 300 channels: three programs of the
# update's UPDATE_CHANNELS, the last one partial
def test_rglru_step_matches_the_reference(B, D, H, dtype):
    _check(rglru_step, rglru_params(D, H, seed=D), B, D, dtype, seed=B + D, c=8.0)


def test_decoding_with_the_fused_step_follows_the_forward():
    from samu.modules import SAMUMixer, RGLRUMixer
    from samu.ops.functional import rglru_mixer, samu_mixer

    torch.manual_seed(0)
    samu = SAMUMixer(16, backend=sorted(dispatch.variants("samu"))[0])
    with torch.no_grad():
        samu.amplitudes.copy_(torch.tensor([[0.6, -0.2], [0.3, 0.8]]))   # the controller at work
    for mixer in (samu, RGLRUMixer(16, num_heads=2, backend=sorted(dispatch.variants("rglru"))[0])):
        mixer = mixer.to(DEVICE)
        x = torch.randn(2, 9, 16, device=DEVICE)
        full = (samu_mixer if isinstance(mixer, SAMUMixer) else rglru_mixer)(
            x, *mixer._params(), backend="torch")[0]
        state = None
        with torch.no_grad():
            for t in range(9):
                y, state = mixer.step(x[:, t], state)
                assert rel_err(y, full[:, t]) < 1e-5, t


def test_a_wanted_gradient_takes_the_differentiable_serial_step():
    nu, theta_log, directions, amplitudes = samu_params(8, seed=1)
    x = torch.randn(2, 8, device=DEVICE)
    params = [p.detach().to(DEVICE).requires_grad_() for p in (nu, theta_log, directions, amplitudes)]
    y, h = samu_step(x, *params, None, backend="triton")
    assert y.grad_fn is not None and h.grad_fn is not None
    torch.autograd.grad(y.sum(), params)
    with torch.no_grad():
        y, _ = samu_step(x, *params, None, backend="triton")
    assert y.grad_fn is None


def test_strided_parameters_and_auto():
    nu, theta_log, directions, amplitudes = (p.detach() for p in samu_params(8, seed=2))
    x = torch.randn(2, 8)
    strided = torch.stack([nu, torch.zeros_like(nu)], 1)[:, 0]
    assert not strided.is_contiguous()
    want = samu_step(x.double(), nu.double(), theta_log.double(), directions.double(), amplitudes.double(),
                     None, backend="torch")[1]
    got = samu_step(x.to(DEVICE), strided.to(DEVICE), theta_log.to(DEVICE), directions.to(DEVICE),
                    amplitudes.to(DEVICE), None, backend="triton")[1]
    assert rel_err(got.cpu(), want) < 1e-5
    # "auto" takes the fused step on CUDA and the serial one elsewhere
    for device in ("cpu", DEVICE):
        args = [t.to(device) for t in (x, nu, theta_log, directions, amplitudes)]
        y, h = samu_step(*args, None, backend="auto")
        other = "triton" if device == "cuda" else "torch"
        assert torch.equal(h, samu_step(*args, None, backend=other)[1])


# The block's step (Conv1D, mixer, GeLU gate in one kernel). Rule, declared before the first GPU run: in
# fp32 y_t and the new mixer state within 1e-5 of the float64 block step from the same inputs; in bf16 the
# mixer state within 1e-5 + eps (the Conv1D output is rounded before the mixer) and y_t within 2 eps (the
# mixer output, the GeLU and the product each round once); the new Conv1D state equal to the shifted
# inputs bit for bit in every dtype; a block decoding token by token with the fused kernels follows its
# own forward (fused glue) within 1e-5 in fp32 and within one rounding (eps) in bf16 and fp16, its
# Conv1D window holding the step's own inputs bit for bit.


@pytest.fixture
def fused_calls(monkeypatch):
    """Counts the block step kernels' launches, so a test sees that the fused path ran."""
    from samu.ops import step_triton

    calls = []
    for name in ("samu_step", "rglru_step"):
        kernel = getattr(step_triton, name)
        monkeypatch.setattr(step_triton, name, lambda *a, _k=kernel, **kw: calls.append(kw.get("conv")) or _k(*a, **kw))
    return calls

def _block_inputs(B, E, K, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(B, 2 * E, generator=g).to(dtype)
    conv_w = (0.5 * torch.randn(K, E, generator=g)).to(dtype)
    conv_b = torch.randn(E, generator=g).to(dtype)
    conv_state = torch.randn(B, K - 1, E, generator=g).to(dtype)
    return z, conv_w, conv_b, conv_state, torch.randn(B, E, generator=g)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mixer,B,E,H,K", [("samu", 2, 20, None, 4), ("samu", 1, 64, None, 1),
                                           ("rglru", 2, 40, 4, 4), ("rglru", 1, 96, 2, 3), ("rglru", 17, 16, 2, 4)])
def test_block_step_matches_the_float64_block_step(mixer, B, E, H, K, dtype, fused_calls):
    from samu.ops.step import rglru_block_step, samu_block_step

    step = samu_block_step if mixer == "samu" else rglru_block_step
    params = samu_params(E, seed=E) if mixer == "samu" else rglru_params(E, H, seed=E)
    z, cw, cb, cs, h = _block_inputs(B, E, K, dtype, seed=B + E + K)
    cs64, h64 = cs.double(), h.double()
    want = step(z.double(), cw.double(), cb.double(), cs64, *[p.detach().double() for p in params], h64,
                backend="torch")
    dev = [t.to(DEVICE, copy=True) for t in (z, cw, cb, cs, h)]
    with torch.no_grad():
        got = step(*dev[:4], *[p.detach().to(DEVICE) for p in params], dev[4], backend="triton")
    assert len(fused_calls) == 1 and fused_calls[0] is not None   # the block's kernel, with its Conv1D
    assert got.dtype == dtype and got.shape == (B, E)
    # the states were updated in place: the Conv1D window shifted by z_x, the mixer state advanced
    shifted = torch.cat([cs, z[:, None, :E]], 1)[:, 1:]
    assert torch.equal(dev[3].cpu(), shifted) and torch.equal(cs64, shifted.double())
    assert rel_err(dev[4].cpu(), h64) < 1e-5 + (0 if dtype == torch.float32 else torch.finfo(dtype).eps)
    tol = 1e-5 if dtype == torch.float32 else 2 * torch.finfo(dtype).eps
    assert rel_err(got.float().cpu(), want) < tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mixer", ["samu", "rglru"])
def test_a_block_decoding_with_the_fused_step_follows_its_forward(mixer, dtype, fused_calls):
    from samu.modules import RecurrentBlock

    torch.manual_seed(3)
    block = RecurrentBlock(16, mixer, 24, 2, backend=sorted(dispatch.variants(mixer))[0]).to(DEVICE, dtype)
    if mixer == "samu":
        with torch.no_grad():
            block.mixer.amplitudes.copy_(torch.tensor([[0.6, -0.2], [0.3, 0.8]]))   # the controller at work
    u = torch.randn(2, 7, 16, device=DEVICE).to(dtype)
    tol = 1e-5 if dtype == torch.float32 else torch.finfo(dtype).eps
    with torch.no_grad():
        full, final = block(u, return_state=True)
        state = block.init_state(2)
        conv, mix = state
        for t in range(7):
            assert rel_err(block.decode(u[:, t], state).float(), full[:, t].float()) < tol, t
        inputs = torch.stack([block.linear_in(u[:, t])[:, :24] for t in range(4, 7)], 1)
    assert len(fused_calls) == 7
    assert state.conv is conv and state.mixer is mix   # updated in place
    assert torch.equal(state.conv, inputs)   # the window: the step's own last three inputs
    # the Conv1D window holds the in-projection's outputs: one token's GEMM and the sequence's may sum in
    # different orders (cuBLAS picks its kernel by shape), so equal within the same rule, not to the bit
    assert rel_err(state.conv.float(), final.conv.float()) < tol and rel_err(state.mixer, final.mixer) < 1e-5
