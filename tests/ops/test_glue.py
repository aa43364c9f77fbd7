"""The block's fused glue (Conv1D of z_x, GeLU of z_y) against the same maths in float64 PyTorch ops.

The Triton kernels run in the interpreter on CPU (CUDA with -m gpu). Tiles are shrunk so that small
shapes cover several row tiles, several programs along L, a partial channel tile and a partial row tile.
Rule, declared before any run: in fp32 every output and gradient is within 1e-6 (relative Frobenius)
of float64; in bf16 and fp16 the fused result is no further from float64 than the unfused PyTorch ops
in that dtype, or within one rounding of the dtype (eps / 2), whichever is larger.
"""

import pytest
import torch

from samu.ops import dispatch
from samu.ops.glue import conv_gelu, conv_gelu_torch
from tests.helpers import rel_err

pytestmark = pytest.mark.skipif(not dispatch.triton_available(), reason="triton is not installed")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def small_tiles(monkeypatch):
    from samu.ops import glue_triton

    for name in ("BL", "BWD_BL"):
        monkeypatch.setattr(glue_triton, name, 8)
    for name in ("BE", "BWD_BE", "ROWS"):
        monkeypatch.setattr(glue_triton, name, 16)


def _inputs(B, L, E, K, dtype, with_state, seed):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(B, L, 2 * E, generator=g).to(dtype)
    weight = torch.randn(K, E, generator=g) * 0.5
    bias = torch.randn(E, generator=g)
    state = torch.randn(B, K - 1, E, generator=g).to(dtype) if with_state else None
    dxc = torch.randn(B, L, E, generator=g).to(dtype)
    da = torch.randn(B, L, E, generator=g).to(dtype)
    return z, weight, bias, state, dxc, da


def _run(fn, z, weight, bias, state, dxc, da, device, dtype=None):
    leaves = [t if t is None else t.to(device=device, dtype=dtype or t.dtype).requires_grad_()
              for t in (z, weight, bias, state)]
    xc, a = fn(*leaves)
    grads = torch.autograd.grad((xc, a), [t for t in leaves if t is not None],
                                (dxc.to(device=device, dtype=xc.dtype), da.to(device=device, dtype=a.dtype)))
    return [xc, a, *grads]


def _unfused(z, weight, bias, state):
    return conv_gelu_torch(z, weight, bias, state)[:2]


def _fused(z, weight, bias, state):
    xc, a, _ = conv_gelu(z, weight, bias, state, backend="triton")
    return xc, a


NAMES = ("x_c", "a", "dz", "dweight", "dbias", "dstate")
# B, L, E, K: several programs along L (ROWS = 16) and row tiles (BL = 8), a partial channel tile
# (E = 20 over BE = 16), L shorter than the window (1, 2), conv widths 1, 2 and 4
CASES = [(2, 37, 20, 4), (1, 1, 16, 4), (2, 2, 8, 4), (1, 50, 36, 2), (3, 9, 8, 1), (1, 16, 16, 3)]


@pytest.mark.parametrize("B,L,E,K,with_state", [(*case, s) for case in CASES for s in (False, True)
                                                  if not (s and case[3] == 1)])   # width 1: no state
def test_fp32_matches_float64(B, L, E, K, with_state):
    inputs = _inputs(B, L, E, K, torch.float32, with_state, seed=L + E + K)
    exact = _run(_unfused, *inputs, "cpu", torch.float64)
    fused = _run(_fused, *inputs, DEVICE)
    assert len(fused) == len(exact)
    for name, f, e in zip(NAMES, fused, exact):
        assert f.dtype == (torch.float32), name
        assert rel_err(f.cpu(), e) < 1e-6, name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_no_worse_than_unfused(dtype):
    inputs = _inputs(2, 45, 20, 4, dtype, True, seed=3)
    exact = _run(_unfused, *inputs, "cpu", torch.float64)
    unfused = _run(_unfused, *inputs, "cpu")
    fused = _run(_fused, *inputs, DEVICE)
    rounding = torch.finfo(dtype).eps / 2
    for name, f, u, e in zip(NAMES, fused, unfused, exact):
        assert f.dtype == u.dtype, name
        assert rel_err(f.cpu(), e) <= max(rel_err(u, e), rounding), name


def test_backward_is_deterministic_and_new_state_is_the_last_inputs():
    z, weight, bias, state, dxc, da = _inputs(2, 30, 20, 4, torch.float32, True, seed=5)
    first = _run(_fused, z, weight, bias, state, dxc, da, DEVICE)
    second = _run(_fused, z, weight, bias, state, dxc, da, DEVICE)
    for name, a, b in zip(NAMES, first, second):
        assert torch.equal(a, b), name
    for L in (30, 2):
        _, _, new = conv_gelu(z[:, :L].to(DEVICE), weight.to(DEVICE), bias.to(DEVICE), state.to(DEVICE),
                              return_state=True, backend="triton")
        window = torch.cat([state, z[:, :L, :20]], dim=1)
        assert torch.equal(new.cpu(), window[:, -3:])


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("K,with_state", [(4, False), (4, True), (3, True)])
def test_packed_rows_restart_the_convolution_at_every_boundary(K, with_state, backend):
    """One packed call (fused, or the PyTorch ops' masked taps) against the float64 PyTorch ops run one
    sequence at a time: outputs, every gradient (the state's per sequence) and the new state; lengths 1,
    2 (shorter than the window), a row tile exactly and ragged ones, boundaries inside row tiles and
    programs. The PyTorch ops packed equal them unpacked, one sequence at a time, bit for bit."""
    offsets = [0, 1, 3, 11, 12, 29, 30, 37]
    N, E = len(offsets) - 1, 20
    z, weight, bias, _, dxc, da = _inputs(1, offsets[-1], E, K, torch.float32, False, seed=K)
    state = torch.randn(N, K - 1, E, generator=torch.Generator().manual_seed(9)) if with_state else None

    def packed(z, weight, bias, state):
        xc, a, _ = conv_gelu(z, weight, bias, state, backend=backend, offsets=offsets)
        return xc, a

    def one_by_one(z, weight, bias, state):
        pieces = [_unfused(z[:, a:b], weight, bias, None if state is None else state[n:n + 1])
                  for n, (a, b) in enumerate(zip(offsets, offsets[1:]))]
        return tuple(torch.cat([p[i] for p in pieces], dim=1) for i in (0, 1))

    exact = _run(one_by_one, z, weight, bias, state, dxc, da, "cpu", torch.float64)
    fused = _run(packed, z, weight, bias, state, dxc, da, DEVICE)
    assert len(fused) == len(exact)
    for name, f, e in zip(NAMES, fused, exact):
        assert rel_err(f.cpu(), e) < 1e-6, name
    if backend == "torch":
        alone = _run(one_by_one, z, weight, bias, state, dxc, da, DEVICE)
        for name, f, e in zip(NAMES[:2], fused, alone):
            assert torch.equal(f, e), name
    # the new state of each sequence: its last K - 1 inputs, reaching back into its state row
    _, _, new = conv_gelu(z.to(DEVICE), weight.to(DEVICE), bias.to(DEVICE),
                          None if state is None else state.to(DEVICE), return_state=True, backend=backend,
                          offsets=offsets)
    for n, (a, b) in enumerate(zip(offsets, offsets[1:])):
        old = torch.zeros(1, K - 1, E) if state is None else state[n:n + 1]
        window = torch.cat([old, z[:, a:b, :E]], dim=1)
        assert torch.equal(new[n:n + 1].cpu(), window[:, -(K - 1):]), n


def test_wider_convolutions_run_as_pytorch_ops():
    from samu.ops.glue import uses_triton

    z, weight, bias = (t.to(DEVICE) for t in _inputs(1, 4, 8, 5, torch.float32, False, seed=0)[:3])
    assert not uses_triton(z, weight, "triton") and uses_triton(z, weight[:4], "triton")
    xc, a, _ = conv_gelu(z, weight, bias, backend="triton")
    assert torch.equal(xc, conv_gelu_torch(z, weight, bias)[0])


def test_bad_backend():
    z, weight, bias, *_ = _inputs(1, 4, 8, 4, torch.float32, False, seed=0)
    with pytest.raises(ValueError, match="glue backend must be one of"):
        conv_gelu(z, weight, bias, backend="cuda")
