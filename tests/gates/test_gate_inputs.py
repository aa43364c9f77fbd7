import torch

from samu.gates.inputs import RGLRU_C, derive_seed, make_inputs, rglru_heads


def test_samu_inputs_span_the_declared_radii_with_the_controller_on():
    inputs = make_inputs("samu", (2, 7, 64), torch.bfloat16, "cpu", seed=3)
    p = inputs["params"]
    radius = torch.exp(-torch.exp(p["nu"].double()))
    n = 32
    # stratified draws: one radius in each of n equal strata of (0.5, 0.9999)
    assert radius.min() < 0.5 + 0.4999 / n and radius.max() > 0.9999 - 0.4999 / n
    assert bool(((radius > 0.5) & (radius < 0.9999)).all())
    assert bool((p["amplitudes"].abs() >= 0.1).all()) and bool((p["amplitudes"].abs() <= 0.5).all())
    assert inputs["x"].dtype == inputs["dy"].dtype == torch.bfloat16
    assert inputs["initial_state"].dtype == inputs["dh"].dtype == torch.float32
    assert all(t.dtype == torch.float32 for t in p.values())


def test_rglru_inputs_follow_the_spec_layout():
    inputs = make_inputs("rglru", (1, 5, 32), torch.float32, "cpu", seed=0)
    p = inputs["params"]
    assert p["w_a"].shape == (16, 2, 2) and p["b_a"].shape == (32,)
    base = torch.exp(-torch.nn.functional.softplus(p["a_param"].double()))
    r = base ** RGLRU_C
    assert bool(((r > 0.5 - 1e-6) & (r < 0.9999 + 1e-6)).all())
    assert rglru_heads(10, 16) == 10 and rglru_heads(1024, 16) == 16 and rglru_heads(24, 16) == 12


def test_inputs_are_reproducible_per_seed_and_fresh_per_unit():
    a = make_inputs("samu", (1, 4, 8), torch.float32, "cpu", seed=5)
    b = make_inputs("samu", (1, 4, 8), torch.float32, "cpu", seed=5)
    c = make_inputs("samu", (1, 4, 8), torch.float32, "cpu", seed=6)
    assert torch.equal(a["x"], b["x"]) and torch.equal(a["params"]["nu"], b["params"]["nu"])
    assert not torch.equal(a["x"], c["x"])
    assert derive_seed(0, "samu", 1, 4, 8) != derive_seed(0, "rglru", 1, 4, 8)
    assert derive_seed(0, "samu", 1, 4, 8) == derive_seed(0, "samu", 1, 4, 8)
