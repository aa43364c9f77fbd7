"""The gate rules of ``gates.toml`` (spec §7): loading, relative errors and threshold arithmetic."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

GATES_FILE = Path(__file__).with_name("gates.toml")
LOW_PRECISION = (torch.bfloat16, torch.float16)
# the name of a result of the call a caller that drops the final state makes (training does): a forward that
# returns no final state and a backward of y's cotangent alone ("dx" -> "dx|no_final"); the kernels compile
# that form apart
NO_FINAL = "|no_final"
# the call training makes: no initial state and no final state ("dx" -> "dx|no_state"); the kernels compile a call
# without an initial state apart too (packed, the restarts at every sequence's start are a different code path)
NO_STATE = "|no_state"


def base_quantity(quantity: str) -> str:
    """The result a quantity is of, in any call: "dx|no_final" -> "dx", "dx|no_state" -> "dx"."""
    return quantity.split("|")[0]


@dataclass(frozen=True)
class Rules:
    version: int
    inputs: dict
    fp32_factor: float
    fp32_floor: float
    low_factor: float
    low_floor: float
    stored_in_io_dtype: tuple

    def threshold(self, quantity: str, io_dtype: torch.dtype, serial_fp32_error: float,
                  rounded_error: "float | None") -> tuple[float, str]:
        """(threshold, rule name) for one result of a backend run with ``io_dtype`` inputs.

        ``serial_fp32_error``: error of the serial fp32 evaluation on the same rounded inputs;
        ``rounded_error``: error of the float64 result rounded to ``io_dtype`` (low precision only).
        """
        if io_dtype in LOW_PRECISION and base_quantity(quantity) in self.stored_in_io_dtype:
            if rounded_error is None:
                raise ValueError(f"{quantity} in {io_dtype} needs the rounded-float64 error")
            return self.low_factor * rounded_error + self.low_floor, "low_precision"
        return self.fp32_factor * serial_fp32_error + self.fp32_floor, "fp32"


def load_rules(path=GATES_FILE) -> Rules:
    data = tomllib.loads(Path(path).read_text())
    fp32, low = data["rules"]["fp32"], data["rules"]["low_precision"]
    return Rules(version=int(data["version"]), inputs=dict(data["inputs"]),
                 fp32_factor=float(fp32["factor"]), fp32_floor=float(fp32["floor"]),
                 low_factor=float(low["factor"]), low_floor=float(low["floor"]),
                 stored_in_io_dtype=tuple(low["stored_in_io_dtype"]))


def rel_error(a: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error |a - ref| / |ref| in float64; |a| when ref is zero; inf if a is not finite."""
    a, ref = a.detach().double(), ref.detach().double()
    if a.shape != ref.shape:
        raise ValueError(f"shape mismatch: {list(a.shape)} vs reference {list(ref.shape)}")
    if not bool(torch.isfinite(a).all()):
        return math.inf
    diff = torch.linalg.vector_norm(a - ref).item()
    scale = torch.linalg.vector_norm(ref).item()
    return diff / scale if scale > 0 else diff
