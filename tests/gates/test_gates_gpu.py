"""The spec §7 gates on the GPU at every gate shape (samu/bench/shapes.py: GATE, L up to 131,072),
for every Triton variant of both mixers, in bf16, fp16 and fp32: the same code as `samu gate`.

Set SAMU_GPU_GATE_OUT to a folder to keep each run's JSON record there.
"""

import os

import pytest
import torch

from samu.bench.shapes import GATE
from samu.gates.runner import run_gates
from samu.ops import dispatch

pytestmark = [pytest.mark.gpu, pytest.mark.gates,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.skipif(not dispatch.triton_available(), reason="triton is not installed")]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("op", ["samu", "rglru"])
def test_every_variant_passes_its_gates_at_the_gate_shapes(op, dtype, tmp_path):
    out = os.environ.get("SAMU_GPU_GATE_OUT")
    record = run_gates([op], GATE, [dtype], ["variants"], "cuda", progress=False,
                       out=os.path.join(out, f"gates_{op}_{str(dtype)[6:]}.json") if out else None)
    assert record["complete"]
    assert not [s for s in record["skipped"] if "reference failed" in s.get("reason", "")], record["skipped"]
    variants = set(dispatch.variants(op))
    assert {(r["backend"], tuple(r["shape"])) for r in record["rows"]} == {(v, s) for v in variants for s in GATE}
    failed = [(r["backend"], r["shape"], r.get("exception") or [q for q, ok in r["passed"].items() if not ok])
              for r in record["rows"] if not r["pass"]]
    assert not failed, failed
