"""Results do not depend on the order in which a launch's programs run (no floating-point atomics, every sum in a
fixed order, the last arrival at a counter composing whatever arrived before it: spec §6). Triton's interpreter runs
programs in grid order, so a kernel whose result followed the order would still give the same bits twice there; here
the same calls run again with the programs in reverse order and must give the same bits. The interpreter still runs
each program to its end before the next, so races between programs running side by side stay out of its reach (on
the GPU the order varies by itself: the deterministic tests of tests/ops/test_*_triton.py)."""

import math

import pytest
import torch

from samu.ops import dispatch
from tests.helpers import randn, rglru_params, samu_params

pytestmark = pytest.mark.skipif(not (dispatch.triton_available() and dispatch.interpreting()),
                                reason="the interpreter's program order (TRITON_INTERPRET=1)")


@pytest.fixture
def reversed_programs(monkeypatch):
    """Every interpreted launch runs its programs from the last to the first."""
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    forward = builder.set_grid_idx
    seen = []

    def backwards(x, y, z):
        gx, gy, gz = builder.grid_dim
        seen.append(((gx - 1 - x, gy - 1 - y, gz - 1 - z), (gx, gy, gz)))
        forward(*seen[-1][0])

    monkeypatch.setattr(builder, "set_grid_idx", backwards)
    return seen


def _both_orders(once, request):
    first = once()
    seen = request.getfixturevalue("reversed_programs")
    second = once()
    # the fixture ran the launches, last program first, and some launch had more than one
    (last, grid), *_ = seen
    assert last == tuple(g - 1 for g in grid) and any(math.prod(g) > 1 for _, g in seen)
    assert len(first) == len(second)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.parametrize("G", [1, 2])
def test_samu_gives_the_same_bits_in_either_program_order(G, request):
    """Five chunks of two mode tiles, in groups of two (G = 2) or none: the prefix is composed by whichever program
    arrives last."""
    from samu.ops.samu.function import Config, run

    x = randn((1, 40, 8), 1)
    params = samu_params(8, 2)
    h0 = randn((1, 8), 3)
    gy = randn((1, 40, 8), 4, requires_grad=False)

    def once():
        y, h = run(x, *params, h0, 2.0, Config(K=8, BN=2, G=G))
        return [y, h, *torch.autograd.grad((y * gy).sum() + h.sum(), [x, h0, *params])]

    _both_orders(once, request)


def test_rglru_gives_the_same_bits_in_either_program_order(request):
    """RG-LRU's kernels have no arrival counters or atomics today: this guards the next change."""
    from samu.ops.rglru.function import Config, run

    x = randn((2, 70, 32), 1)
    params = rglru_params(32, 4, 2)
    h0 = randn((2, 32), 3)
    gy = randn((2, 70, 32), 4, requires_grad=False)

    def once():
        y, h = run(x, *params, h0, 8.0, Config(K=4, WC=4, target_programs=16))
        return [y, h, *torch.autograd.grad((y * gy).sum() + h.sum(), [x, h0, *params])]

    _both_orders(once, request)


def test_block_glue_gives_the_same_bits_in_either_program_order(request):
    """The Conv1D's weight and bias gradients: per-program partial sums, added in a fixed order (no atomics today:
    this guards the next change)."""
    from samu.ops.glue_triton import conv_gelu_bwd, conv_gelu_fwd

    z = randn((2, 700, 96), 1, requires_grad=False)
    weight = randn((4, 48), 2, requires_grad=False)
    bias = randn((48,), 3, requires_grad=False)
    dxc, da = randn((2, 700, 48), 4, requires_grad=False), randn((2, 700, 48), 5, requires_grad=False)

    def once():
        return [*conv_gelu_fwd(z, weight, bias, None), *conv_gelu_bwd(dxc, da, z, weight, None)]

    _both_orders(once, request)
