"""The mixers' constants are arguments (spec §5): a radial_bound and a c other than the defaults reach each backend."""

import pytest
import torch

import samu
from samu import reference
from samu.gates.inputs import PARAMS
from samu.ops import dispatch
from tests.helpers import randn, rel_err, rglru_params, samu_params

# Triton variants run in the interpreter on CPU (tests/conftest.py sets TRITON_INTERPRET=1 there)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
B, L, D, H = 2, 40, 16, 4
RADIAL_BOUND, C = 0.7, 3.0
# fp32 rounding over L = 40 serial steps: below ~L * 2^-24 = 2.4e-6 relative
TOL = 1e-5


def _triton(name):
    needs_triton = pytest.mark.skipif(not dispatch.triton_available(), reason="triton is not installed")
    return pytest.param(name, marks=needs_triton)


def _assert_matches_reference(op, backend, params, constant):
    """Outputs, final state and every gradient of one fp32 call against the float64 reference with ``constant``."""
    public, ref = (samu.samu_mixer, reference.samu_mixer) if op == "samu" else (samu.rglru_mixer, reference.rglru_mixer)
    x, h0 = randn((B, L, D), 1, device=DEVICE), randn((B, D), 2, device=DEVICE)
    dy = randn((B, L, D), 3, device=DEVICE, requires_grad=False)
    dh = randn((B, D), 4, device=DEVICE, requires_grad=False)
    leaves = [x, h0, *params]
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    y, h = public(x, *params, initial_state=h0, output_final_state=True, backend=backend, **constant)
    y_ref, h_ref = ref(leaves64[0], *leaves64[2:], initial_state=leaves64[1], output_final_state=True, **constant)
    y_default, _ = ref(leaves64[0], *leaves64[2:], initial_state=leaves64[1])
    # the default constant moves y by over 100 TOL on these inputs: a backend that ignored the argument would fail
    assert rel_err(y_default, y_ref) > 100 * TOL
    assert rel_err(y, y_ref) < TOL and rel_err(h, h_ref) < TOL
    grads = torch.autograd.grad([y, h], leaves, [dy, dh])
    grads_ref = torch.autograd.grad([y_ref, h_ref], leaves64, [dy.double(), dh.double()])
    for name, a, b in zip(["x", "initial_state", *PARAMS[op]], grads, grads_ref):
        assert rel_err(a, b) < TOL, f"d{name}: {rel_err(a, b)}"


# triton_serial shares triton_grouped's kernels and arguments (and at L = 40 its one group): one of them is enough
@pytest.mark.parametrize("backend", ["torch", _triton("triton_grouped")])
def test_samu_radial_bound_reaches_the_backend(backend):
    _assert_matches_reference("samu", backend, samu_params(D, 5, device=DEVICE), {"radial_bound": RADIAL_BOUND})


@pytest.mark.parametrize("backend", ["torch", _triton("triton_chunked")])
def test_rglru_c_reaches_the_backend(backend):
    _assert_matches_reference("rglru", backend, rglru_params(D, H, 6, device=DEVICE), {"c": C})
