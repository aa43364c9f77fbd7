"""SAMUMixer / RGLRUMixer modules: parameter counts, inits, step decoding."""

import math

import pytest
import torch

import samu
from samu.ops.checks import NonFiniteParameters
from tests.helpers import rel_err


@pytest.mark.parametrize("D,samu_count,rglru_count", [(1024, 3076, 134144), (2048, 6148, 530432),
                                                       (2560, 7684, 826880)])
def test_parameter_counts(D, samu_count, rglru_count):
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(samu.SAMUMixer(D)) == samu_count == 3 * D + 4
    assert count(samu.RGLRUMixer(D)) == rglru_count == 2 * D * D // 16 + 3 * D


def test_samu_init_follows_spec():
    torch.manual_seed(0)
    m = samu.SAMUMixer(4096)
    r = torch.exp(-torch.exp(m.nu.detach().double()))
    assert 0.9 ** 2 <= float((r * r).min()) and float((r * r).max()) <= 0.999 ** 2 + 1e-9
    theta = torch.exp(m.theta_log.detach().double())
    assert 0 < float(theta.min()) and float(theta.max()) <= math.pi / 10 + 1e-7
    # each mean within ~4 standard errors of its distribution's (2048 draws): gross init errors, not fine ones
    assert abs(float(theta.mean()) / (math.pi / 20) - 1) < 0.05
    assert abs(float((r * r).mean()) - (0.9 ** 2 + 0.999 ** 2) / 2) < 0.005
    assert torch.equal(m.amplitudes, torch.zeros(2, 2))
    assert abs(float(m.directions.detach().std()) - 1.0) < 0.05
    assert all(p.dtype == torch.float32 for p in m.parameters())


def test_rglru_init_follows_spec():
    torch.manual_seed(0)
    m = samu.RGLRUMixer(1024, num_heads=16)
    a0 = torch.exp(-torch.nn.functional.softplus(m.a_param.detach().double()))
    assert 0.9 ** 2 - 1e-6 <= float((a0 * a0).min()) and float((a0 * a0).max()) <= 0.999 ** 2 + 1e-6
    assert abs(float(m.w_a.detach().std()) - (1 / 64) ** 0.5) < 0.01
    assert abs(float(m.w_x.detach().std()) - (1 / 64) ** 0.5) < 0.002
    assert abs(float(m.w_a.detach().mean())) < 0.002 and abs(float(m.w_x.detach().mean())) < 0.002
    assert abs(float((a0 * a0).mean()) - (0.9 ** 2 + 0.999 ** 2) / 2) < 0.007
    assert torch.equal(m.b_a, torch.zeros(1024)) and torch.equal(m.b_x, torch.zeros(1024))


def _nonzero_amplitudes(m):
    with torch.no_grad():
        m.amplitudes.copy_(torch.tensor([[0.7, -0.3], [0.4, 0.9]]))
    return m


# a SAMU mixer with a live controller and an RG-LRU mixer with three heads
MIXERS = [lambda: _nonzero_amplitudes(samu.SAMUMixer(10)), lambda: samu.RGLRUMixer(12, num_heads=3)]


@pytest.mark.parametrize("make", MIXERS)
def test_step_equals_forward_token_by_token(make):
    torch.manual_seed(1)
    m = make()
    x = torch.randn(2, 23, m.width)
    h0 = torch.randn(2, m.width)
    y, h = m(x, initial_state=h0, output_final_state=True)
    state = h0
    for t in range(x.shape[1]):
        y_t, state = m.step(x[:, t], state)
        assert rel_err(y_t, y[:, t]) < 1e-6
    assert rel_err(state, h) < 1e-6


def test_the_serial_reference_evaluates_in_float64_or_float32_only():
    m = samu.RGLRUMixer(8, num_heads=2)
    for dtype in (torch.float16, "float64"):
        with pytest.raises(ValueError, match="dtype: the serial reference evaluates in torch.float64 or torch.float32"):
            samu.reference.rglru_mixer(torch.randn(1, 5, 8), *m._params(), dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("backend", ["torch", "reference", "auto"])
@pytest.mark.parametrize("make", MIXERS)
def test_outputs_share_no_memory_with_the_states_they_return(make, backend, dtype):
    # a caller changing y (or y_t) in place must not change the state it carries on from, and a kept final state
    # must not hold y's memory; L = 37 leaves the chunked paths a padded buffer, of which y is then a copy
    torch.manual_seed(2)
    m = make().to(dtype)
    m.backend = backend
    x = torch.randn(2, 37, m.width, dtype=dtype)
    with torch.no_grad():
        y, h = m(x, output_final_state=True)
        y_t, state = m.step(x[:, 0], None)
    assert y.is_contiguous() and y.untyped_storage().data_ptr() != h.untyped_storage().data_ptr()
    assert h.untyped_storage().nbytes() == h.numel() * h.element_size()
    assert y_t.untyped_storage().data_ptr() != state.untyped_storage().data_ptr()


@pytest.mark.parametrize("make", MIXERS)
def test_step_under_autocast_equals_forward(make):
    """Mixers compute in fp32 whatever autocast says, in forward and in step alike."""
    torch.manual_seed(2)
    m = make()
    x = torch.randn(2, 17, m.width)
    y, h = m(x, output_final_state=True)
    state = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for t in range(x.shape[1]):
            y_t, state = m.step(x[:, t], state)
            assert rel_err(y_t, y[:, t]) < 1e-6
    assert rel_err(state, h) < 1e-6


@pytest.mark.parametrize("make", [lambda: samu.SAMUMixer(8), lambda: samu.RGLRUMixer(8, num_heads=2)])
def test_parameters_stay_fp32_under_model_casts(make):
    m = make().bfloat16()
    assert all(p.dtype == torch.float32 for p in m.parameters())
    y, _ = m(torch.randn(1, 5, 8, dtype=torch.bfloat16))
    assert y.dtype == torch.bfloat16
    m.double()
    assert all(p.dtype == torch.float32 for p in m.parameters())


def test_step_rejects_bad_dtypes_and_devices():
    m = samu.SAMUMixer(8)
    with pytest.raises(TypeError, match="x_t has dtype int64"):
        m.step(torch.ones(1, 8, dtype=torch.int64))
    with pytest.raises(TypeError, match="state has dtype int64"):
        m.step(torch.ones(1, 8), torch.zeros(1, 8, dtype=torch.int64))
    with pytest.raises(ValueError, match="state is on meta"):
        m.step(torch.ones(1, 8), torch.zeros(1, 8, device="meta"))


def test_step_checks_parameters_and_construction_checks_arguments():
    m = samu.SAMUMixer(8)
    with torch.no_grad():
        m.nu[0] = float("nan")
    with pytest.raises(NonFiniteParameters, match="nu"):
        m.step(torch.randn(1, 8))
    r = samu.RGLRUMixer(8, num_heads=2)
    with torch.no_grad():
        r.a_param[0] = float("inf")
    with pytest.raises(ValueError, match="a_param"):
        r.step(torch.randn(1, 8))
    with pytest.raises(ValueError, match="radial_bound must be a finite number > 0"):
        samu.SAMUMixer(8, radial_bound=float("nan"))
    with pytest.raises(ValueError, match="c must be a finite number > 0"):
        samu.RGLRUMixer(8, num_heads=2, c=-1.0)
    with pytest.raises(ValueError, match=r"x_t must have shape \[B, 8\] with B >= 1, got \[0, 8\]"):
        samu.SAMUMixer(8).step(torch.zeros(0, 8))
    with pytest.raises(ValueError, match=r"x must have shape \[B, L, 8\]"):
        samu.SAMUMixer(8)(torch.randn(1, 3, 6))
    with pytest.raises(ValueError, match=r"x must have shape \[B, L, 8\]"):
        samu.RGLRUMixer(8, num_heads=2)(torch.randn(1, 3, 4))
    with pytest.raises(ValueError, match="'triton_chunked' is a variant of the other mixer; samu's are"):
        samu.SAMUMixer(8, backend="triton_chunked")
    with pytest.raises(ValueError, match="'triton_grouped' is a variant of the other mixer; rglru's are"):
        samu.RGLRUMixer(8, num_heads=2, backend="triton_grouped")


def test_step_in_float64_keeps_float64_state():
    m = _nonzero_amplitudes(samu.SAMUMixer(6))
    y_t, state = m.step(torch.randn(2, 6, dtype=torch.float64))
    assert y_t.dtype == torch.float64 and state.dtype == torch.float64


@pytest.mark.parametrize("bad,match", [(dict(width=7), "positive even"), (dict(width=8, r_min=0.99, r_max=0.9), "r_min"),
                                       (dict(width=8, max_phase=4.0), "max_phase"),
                                       (dict(width=8, r_min="a"), "r_min must be a finite number")])
def test_samu_module_bad_arguments(bad, match):
    with pytest.raises(ValueError, match=match):
        samu.SAMUMixer(**bad)


def test_rglru_module_bad_heads():
    with pytest.raises(ValueError, match="num_heads must be a positive divisor"):
        samu.RGLRUMixer(10, num_heads=4)


def test_step_rejects_bad_shapes():
    m = samu.SAMUMixer(6)
    with pytest.raises(ValueError, match=r"x_t must have shape \[B, 6\]"):
        m.step(torch.zeros(2, 1, 6))
    with pytest.raises(ValueError, match=r"state must have shape \[2, 6\]"):
        m.step(torch.zeros(2, 6), torch.zeros(3, 6))
