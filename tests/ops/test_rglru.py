"""RG-LRU: the chunked PyTorch path and the public API against the float64 reference."""

import pytest
import torch

import samu
from tests.helpers import assert_gate, gate_check, randn, rel_err, rglru_params


def torch_backend(*args, **kw):
    return samu.rglru_mixer(*args, backend="torch", **kw)


@pytest.mark.parametrize("B,L,D,H", [(2, 63, 12, 3), (1, 1, 4, 1), (3, 64, 8, 2), (1, 200, 16, 4)])
@pytest.mark.parametrize("with_state", [True, False])
def test_torch_path_fp32_gate(B, L, D, H, with_state):
    assert_gate(gate_check("rglru", torch_backend, torch.float32, B, L, D, H=H, with_state=with_state, seed=L))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_torch_path_low_precision_gate(dtype):
    assert_gate(gate_check("rglru", torch_backend, dtype, 2, 63, 12, H=3, seed=5))


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
