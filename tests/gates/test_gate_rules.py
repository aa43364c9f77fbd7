import math

import pytest
import torch

from samu.gates.rules import load_rules, rel_error


def test_gates_toml_declares_the_spec_thresholds():
    rules = load_rules()
    assert rules.version >= 1
    assert (rules.fp32_factor, rules.fp32_floor) == (2.0, 1e-6)
    assert (rules.low_factor, rules.low_floor) == (1.1, 5e-6)
    assert rules.stored_in_io_dtype == ("y", "dx")
    assert (rules.inputs["radius_min"], rules.inputs["radius_max"]) == (0.5, 0.9999)
    assert rules.inputs["amplitude_min"] > 0


def test_fp32_io_uses_the_serial_fp32_rule_for_every_result():
    rules = load_rules()
    for q in ("y", "dx", "final_state", "d_nu"):
        limit, rule = rules.threshold(q, torch.float32, 3e-7, None)
        assert rule == "fp32" and limit == pytest.approx(2 * 3e-7 + 1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_io_splits_by_where_a_result_is_stored(dtype):
    rules = load_rules()
    for q in ("y", "dx"):
        limit, rule = rules.threshold(q, dtype, 3e-7, 2e-3)
        assert rule == "low_precision" and limit == pytest.approx(1.1 * 2e-3 + 5e-6)
    for q in ("final_state", "d_initial_state", "d_directions", "d_w_a"):
        limit, rule = rules.threshold(q, dtype, 3e-7, None)
        assert rule == "fp32" and limit == pytest.approx(2 * 3e-7 + 1e-6)
    with pytest.raises(ValueError, match="needs the rounded-float64 error"):
        rules.threshold("y", dtype, 3e-7, None)


def test_rel_error_is_the_relative_frobenius_norm():
    ref = torch.tensor([3.0, 4.0])
    assert rel_error(torch.tensor([3.0, 4.0]), ref) == 0.0
    assert rel_error(torch.tensor([3.0, 4.5]), ref) == pytest.approx(0.5 / 5.0)
    assert rel_error(torch.tensor([0.0, 0.5]), torch.zeros(2)) == pytest.approx(0.5)
    assert rel_error(torch.tensor([float("nan"), 4.0]), ref) == math.inf
    with pytest.raises(ValueError, match=r"shape mismatch: \[3\] vs reference \[2\]"):
        rel_error(torch.zeros(3), ref)
