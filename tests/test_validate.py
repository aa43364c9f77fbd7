"""samu.validate: one wording for bad counts and rates, with or without the argument's name."""

import math

import pytest

from samu.validate import finite_number, nonneg_int, positive_int


def test_good_values_pass_through():
    assert positive_int("n", 3) == 3 and nonneg_int("n", 0) == 0
    assert finite_number("lr", 0) == 0 and finite_number("lr", 2.5, positive=True) == 2.5


@pytest.mark.parametrize("check,value,message", [
    (positive_int, 0, "n must be a positive integer, got 0"),
    (positive_int, 2.0, "n must be a positive integer, got 2.0"),
    (positive_int, True, "n must be a positive integer, got True"),
    (nonneg_int, -1, "n must be a non-negative integer, got -1"),
    (nonneg_int, "3", "n must be a non-negative integer, got '3'"),
    (finite_number, -0.5, "n must be a finite number >= 0, got -0.5"),
    (finite_number, math.inf, "n must be a finite number >= 0, got inf"),
    (finite_number, math.nan, "n must be a finite number >= 0, got nan"),
    (finite_number, None, "n must be a finite number >= 0, got None"),
])
def test_bad_values_name_the_argument(check, value, message):
    with pytest.raises(ValueError) as e:
        check("n", value)
    assert str(e.value) == message
    with pytest.raises(ValueError) as e:
        check(None, value)
    assert str(e.value) == message[len("n "):]


def test_positive_number():
    with pytest.raises(ValueError, match="eps must be a finite number > 0, got 0"):
        finite_number("eps", 0, positive=True)
