"""RG-LRU: the chunked PyTorch path and the public API against the float64 reference."""

import functools

import pytest
import torch

import samu
from samu import reference
from samu.ops import dispatch
from tests.helpers import assert_float64_matches_reference, assert_gate, gate_check, randn, rel_err, rglru_params


def torch_backend(*args, **kw):
    return samu.rglru_mixer(*args, backend="torch", **kw)


@pytest.mark.parametrize("B,L,D,H", [(2, 63, 12, 3), (1, 1, 4, 1), (3, 64, 8, 2), (1, 200, 16, 4)])
@pytest.mark.parametrize("with_state", [True, False])
def test_torch_path_fp32_gate(B, L, D, H, with_state):
    assert_gate(gate_check("rglru", torch_backend, torch.float32, B, L, D, H=H, with_state=with_state, seed=L))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_torch_path_low_precision_gate(dtype):
    assert_gate(gate_check("rglru", torch_backend, dtype, 2, 63, 12, H=3, seed=5))


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton_chunked", marks=pytest.mark.skipif(
    not dispatch.triton_available(), reason="triton is not installed"))])
def test_gate_where_the_sqrt_derivative_is_bounded(backend):
    """Channels with a ~ 1 take Griffin's bound: softplus(-20) = 2.1e-9, so u = 1 - a^2 = 2 c gate_a softplus(a_param)
    < 3.3e-8, below the 2.5e-7 where max(4u, 1e-6) stops being 4u (spec §4); every gradient within the gate. The
    torch path takes its gates from the reference's own code, so its case checks the scan around them; the bound
    itself is held by the Triton case and tests/test_reference.py's slow channels."""
    device = "cuda" if backend != "torch" and torch.cuda.is_available() else "cpu"
    params = rglru_params(16, 4, 22, device=device)
    a_param = params[4]
    with torch.no_grad():
        a_param[::2] = -20.0

    def mixer(*args, **kw):
        return samu.rglru_mixer(*args, backend=backend, **kw)

    assert_gate(gate_check("rglru", mixer, torch.float32, 2, 40, 16, H=4, seed=21, device=device, params=params))


@pytest.mark.parametrize("backend", ["torch", "reference"])
def test_initial_state_carries_a_split_sequence(backend):
    B, L, D, H, cut = 2, 50, 8, 2, 29
    x = randn((B, L, D), 3, requires_grad=False)
    params = rglru_params(D, H, 4)
    y, h = samu.rglru_mixer(x, *params, output_final_state=True, backend=backend)
    y1, h1 = samu.rglru_mixer(x[:, :cut], *params, output_final_state=True, backend=backend)
    y2, h2 = samu.rglru_mixer(x[:, cut:], *params, initial_state=h1, output_final_state=True, backend=backend)
    assert rel_err(torch.cat([y1, y2], 1), y) < 1e-6
    assert rel_err(h2, h) < 1e-6


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_output_dtypes(dtype):
    x = randn((1, 9, 8), 7, dtype=dtype, requires_grad=False)
    y, h = samu.rglru_mixer(x, *rglru_params(8, 2, 8), output_final_state=True, backend="torch")
    assert y.dtype == dtype and h.dtype == torch.float32 and y.shape == x.shape


def test_torch_path_float64_is_exact():
    B, L, D, H = 2, 63, 12, 3
    x = randn((B, L, D), 0, dtype=torch.float64)
    params = [p.detach().double().requires_grad_() for p in rglru_params(D, H, 1)]
    h0 = randn((B, D), 2, dtype=torch.float64)
    torch_path = functools.partial(samu.rglru_mixer, backend="torch")
    assert_float64_matches_reference(torch_path, reference.rglru_mixer, x, params, h0)


def test_non_contiguous_input_is_accepted():
    x = randn((9, 2, 8), 11, requires_grad=False).transpose(0, 1)
    params = rglru_params(8, 2, 12)
    y, _ = samu.rglru_mixer(x, *params, backend="torch")
    y_c, _ = samu.rglru_mixer(x.contiguous(), *params, backend="torch")
    assert torch.equal(y, y_c)


def test_autocast_does_not_lower_precision():
    x = randn((2, 33, 8), 13, requires_grad=False)
    params = rglru_params(8, 2, 14)
    y, _ = samu.rglru_mixer(x, *params, backend="torch")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_ac, _ = samu.rglru_mixer(x, *params, backend="torch")
    assert torch.equal(y, y_ac)


def test_multiplier_keeps_its_precision_for_slow_decays():
    """1 - a^2 without cancellation: the fp32 evaluation of a ~ 0.9999 channel stays fp32-accurate."""
    log_a = torch.tensor([-1e-4, -1e-6], dtype=torch.float64)
    a_param = torch.log(torch.expm1(-log_a / 8.0))  # softplus(a_param) = -log_a / c with gate 1
    x = torch.ones(1, 1, 2, dtype=torch.float64)
    w = torch.zeros(1, 2, 2, dtype=torch.float64)
    big = torch.full((2,), 40.0, dtype=torch.float64)  # sigmoid(40) == 1 in float32 and float64
    exact, _ = reference.rglru_mixer(x, w, big, w, big, a_param)
    single, _ = reference.rglru_mixer(x, w, big.float(), w.float(), big.float(), a_param.float(),
                                      dtype=torch.float32)
    assert rel_err(single, exact) < 1e-6
