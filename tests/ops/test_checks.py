"""Every documented bad input raises a clear error naming the argument (spec §5)."""

import math

import pytest
import torch

import samu
from tests.helpers import randn, rglru_params, samu_params


def _samu_args(B=2, L=5, D=6):
    return [randn((B, L, D), 0, requires_grad=False), *[p.detach() for p in samu_params(D, 1)]]


def _rglru_args(B=2, L=5, D=8, H=2):
    return [randn((B, L, D), 0, requires_grad=False), *[p.detach() for p in rglru_params(D, H, 1)]]


@pytest.mark.parametrize("mutate,error,match", [
    (lambda a: a.__setitem__(0, a[0][0]), ValueError, r"x must have shape \[B, L, D\]"),
    (lambda a: a.__setitem__(0, a[0].to(torch.int32)), TypeError, "x has dtype int32"),
    (lambda a: a.__setitem__(0, torch.zeros(2, 5, 7)), ValueError, "odd width D=7"),
    (lambda a: a.__setitem__(0, torch.zeros(2, 0, 6)), ValueError, "B, L, D >= 1"),
    (lambda a: a.__setitem__(1, torch.zeros(4)), ValueError, r"nu must have shape \[3\]"),
    (lambda a: a.__setitem__(2, torch.zeros(3, 1)), ValueError, r"theta_log must have shape \[3\]"),
    (lambda a: a.__setitem__(3, torch.zeros(2, 5)), ValueError, r"directions must have shape \[2, 6\]"),
    (lambda a: a.__setitem__(4, torch.zeros(2, 2, dtype=torch.float16)), TypeError, "amplitudes has dtype float16"),
    (lambda a: a.__setitem__(4, torch.zeros(2, 2, device="meta")), ValueError, "amplitudes is on meta"),
    (lambda a: a.__setitem__(1, torch.full((3,), math.nan)), ValueError, "non-finite .* nu"),
    (lambda a: a.__setitem__(3, torch.full((2, 6), math.inf)), ValueError, "non-finite .* directions"),
    (lambda a: a.__setitem__(0, [[0.0]]), TypeError, "x must be a torch.Tensor"),
])
def test_samu_bad_inputs(mutate, error, match):
    args = _samu_args()
    mutate(args)
    with pytest.raises(error, match=match):
        samu.samu_mixer(*args)


@pytest.mark.parametrize("kw,error,match", [
    (dict(initial_state=torch.zeros(3, 6)), ValueError, r"initial_state must have shape \[2, 6\]"),
    (dict(initial_state=torch.zeros(2, 6, dtype=torch.int64)), TypeError, "initial_state has dtype int64"),
    (dict(radial_bound=0.0), ValueError, "radial_bound must be a finite number > 0"),
    (dict(radial_bound=math.inf), ValueError, "radial_bound"),
    (dict(backend="cuda-fast"), ValueError, "backend must be one of"),
    (dict(backend=3), TypeError, "backend must be a string"),
])
def test_samu_bad_keywords(kw, error, match):
    with pytest.raises(error, match=match):
        samu.samu_mixer(*_samu_args(), **kw)


@pytest.mark.parametrize("mutate,error,match", [
    (lambda a: a.__setitem__(0, torch.zeros(2, 5, 9)), ValueError, "w_a must have shape"),
    (lambda a: a.__setitem__(1, torch.zeros(3, 3, 3)), ValueError, "w_a must have shape"),
    (lambda a: a.__setitem__(3, torch.zeros(4, 2, 2)), ValueError, r"w_x must have shape \[2, 4, 4\]"),
    (lambda a: a.__setitem__(2, torch.zeros(7)), ValueError, r"b_a must have shape \[8\]"),
    (lambda a: a.__setitem__(5, torch.full((8,), math.nan)), ValueError, "non-finite .* a_param"),
    (lambda a: a.__setitem__(0, torch.zeros(2, 5, 8, dtype=torch.uint8)), TypeError, "x has dtype uint8"),
])
def test_rglru_bad_inputs(mutate, error, match):
    args = _rglru_args()
    mutate(args)
    with pytest.raises(error, match=match):
        samu.rglru_mixer(*args)


def test_rglru_bad_c():
    with pytest.raises(ValueError, match="c must be a finite number > 0"):
        samu.rglru_mixer(*_rglru_args(), c=-1.0)


def test_the_finite_check_switch_takes_a_bool():
    with pytest.raises(TypeError, match="enabled must be True or False, got 'no'"):
        samu.set_check_finite("no")
    previous = samu.set_check_finite(True)
    assert samu.set_check_finite(previous) is True


def test_finite_check_can_be_turned_off():
    args = _samu_args()
    args[1] = torch.full((3,), math.nan)
    previous = samu.set_check_finite(False)
    try:
        y, _ = samu.samu_mixer(*args, backend="torch")
        assert torch.isnan(y).any()
    finally:
        samu.set_check_finite(previous)
