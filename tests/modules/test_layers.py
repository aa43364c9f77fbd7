"""Conv1D, RMSNorm, GatedMLP: definitions, step decoding, carried state, bad inputs."""

import pytest
import torch
import torch.nn.functional as F

from samu.modules import Conv1D, GatedMLP, RMSNorm
from tests.helpers import live_parameters


def _conv_by_definition(conv, x, history=None):
    """y_t = bias + sum_i weight[i] * x_{t-(K-1)+i}, with ``history`` (or zeros) before the sequence."""
    B, L, D = x.shape
    K = conv.kernel_size
    past = torch.zeros(B, K - 1, D, dtype=x.dtype) if history is None else history
    full = torch.cat([past, x], dim=1)
    y = torch.empty_like(x)
    for t in range(L):
        y[:, t] = conv.bias + sum(conv.weight[i] * full[:, t + i] for i in range(K))
    return y


@pytest.mark.parametrize("K", [1, 2, 4, 5])
def test_conv1d_matches_definition(K):
    torch.manual_seed(0)
    conv = Conv1D(5, K).double()
    with torch.no_grad():
        conv.bias.normal_()
    x = torch.randn(3, 7, 5, dtype=torch.float64)
    y, state = conv(x, return_state=True)
    assert torch.allclose(y, _conv_by_definition(conv, x), rtol=1e-12, atol=1e-12)
    assert state.shape == (3, K - 1, 5)
    assert torch.equal(state, torch.cat([torch.zeros(3, K - 1, 5, dtype=x.dtype), x], 1)[:, 7:])


def test_conv1d_is_causal():
    torch.manual_seed(1)
    conv = Conv1D(6)
    x = torch.randn(2, 9, 6)
    x2 = x.clone()
    x2[:, 5:] = torch.randn(2, 4, 6)
    assert torch.equal(conv(x)[0][:, :5], conv(x2)[0][:, :5])


def test_conv1d_step_equals_forward_token_by_token():
    torch.manual_seed(2)
    conv = live_parameters(Conv1D(7), 2)
    x = torch.randn(3, 11, 7)
    y, final = conv(x, return_state=True)
    state = None
    for t in range(x.shape[1]):
        y_t, state = conv.step(x[:, t], state)
        assert torch.equal(y_t, y[:, t])
    assert torch.equal(state, final)


@pytest.mark.parametrize("split", [1, 2, 5])
def test_conv1d_carried_state_equals_unsplit(split):
    torch.manual_seed(3)
    conv = live_parameters(Conv1D(5), 3)
    x = torch.randn(2, 9, 5)
    y, final = conv(x, return_state=True)
    y1, s1 = conv(x[:, :split], return_state=True)
    y2, s2 = conv(x[:, split:], s1, return_state=True)
    assert torch.equal(torch.cat([y1, y2], 1), y)
    assert torch.equal(s2, final)


def test_conv1d_init_follows_griffin():
    torch.manual_seed(0)
    conv = Conv1D(4096, 4)
    # recurrentgemma's Conv1D: normal with variance 0.01 / temporal width, zero bias.
    assert conv.weight.std().item() == pytest.approx((0.01 / 4) ** 0.5, rel=0.02)
    assert torch.equal(conv.bias, torch.zeros(4096))


def test_conv1d_bad_inputs():
    conv = Conv1D(5)
    with pytest.raises(ValueError, match="width"):
        Conv1D(0)
    with pytest.raises(ValueError, match="kernel_size"):
        Conv1D(5, 0)
    with pytest.raises(ValueError, match="x must have shape"):
        conv(torch.randn(2, 3, 4))
    with pytest.raises(ValueError, match="x must have shape"):
        conv(torch.randn(3, 5))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        conv([[1.0]])
    with pytest.raises(TypeError, match="floating-point"):
        conv(torch.ones(1, 2, 5, dtype=torch.int64))
    with pytest.raises(ValueError, match="state must have shape"):
        conv(torch.randn(2, 3, 5), torch.zeros(2, 2, 5))
    with pytest.raises(ValueError, match="x_t must have shape"):
        conv.step(torch.randn(2, 4))
    with pytest.raises(TypeError, match="x_t has dtype int64"):
        conv.step(torch.ones(2, 5, dtype=torch.int64))
    with pytest.raises(TypeError, match="state must be a floating-point tensor"):
        conv(torch.randn(2, 3, 5), torch.ones(2, 3, 5, dtype=torch.int64))


def test_rmsnorm_and_mlp_bad_inputs():
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        RMSNorm(4)(torch.tensor([[1, 2, 3, 4]]))
    mlp = GatedMLP(8)
    with pytest.raises(ValueError, match=r"x must have shape \[..., 8\]"):
        mlp(torch.randn(1, 2, 6))
    with pytest.raises(TypeError, match="x must be a floating-point tensor, got torch.int64"):
        mlp(torch.ones(1, 2, 8, dtype=torch.long))
    with pytest.raises(TypeError, match="x has dtype torch.bfloat16 but the layer's weights are torch.float32"):
        mlp(torch.randn(1, 2, 8, dtype=torch.bfloat16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert mlp(torch.randn(1, 2, 8)).shape == (1, 2, 8)


def test_rmsnorm_matches_definition_and_keeps_dtype():
    torch.manual_seed(4)
    norm = RMSNorm(9, eps=1e-5)
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(2, 3, 9, dtype=torch.float64)
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight.double()
    assert torch.allclose(norm(x).double(), expected, rtol=1e-6)
    xb = x.to(torch.bfloat16)
    assert norm(xb).dtype == torch.bfloat16
    with pytest.raises(ValueError, match=r"x must have shape \[..., 9\]"):
        norm(torch.randn(2, 8))
    with pytest.raises(ValueError, match="eps must be a finite number > 0, got 0"):
        RMSNorm(9, eps=0)


def test_gated_mlp_is_geglu_with_expansion_3():
    torch.manual_seed(5)
    mlp = live_parameters(GatedMLP(6), 5)
    assert mlp.gate_up.out_features == 2 * 18 and mlp.down.in_features == 18
    assert sum(p.numel() for p in mlp.parameters()) == 6 * 36 + 36 + 18 * 6 + 6
    x = torch.randn(2, 5, 6)
    w, b = mlp.gate_up.weight, mlp.gate_up.bias
    gate, up = x @ w[:18].t() + b[:18], x @ w[18:].t() + b[18:]
    expected = (F.gelu(gate, approximate="tanh") * up) @ mlp.down.weight.t() + mlp.down.bias
    assert torch.allclose(mlp(x), expected, atol=1e-6)
    # decoding: the residual (holding the down product's bias) added in the product
    r = torch.randn(2, 6) + mlp.down.bias
    x_t = x[:, 0]
    expected = r - mlp.down.bias + mlp(x_t)
    assert torch.allclose(mlp.decode(x_t, r), expected, atol=1e-6)
    with pytest.raises(ValueError, match="expansion"):
        GatedMLP(6, expansion=0)
    with pytest.raises(ValueError, match="backend must be one of auto, torch, triton, got 'fast'"):
        GatedMLP(6, backend="fast")
