"""Registers and spills of the small kernels tests/ops/test_offline_compile.py compiles for sm_90, as that test
launches them (no GPU needed). Usage: python offline_small.py OUT.json NAME [NAME ...] (kernel function names)."""
import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, os.getcwd())
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from tests.ops.test_offline_compile import _cases, _signature  # noqa: E402
from tests.sm90 import _usage  # noqa: E402

rows = []
for fn, floats, constexprs, warps, *types in _cases():
    if fn.__name__ not in sys.argv[2:]:
        continue
    compiled = triton.compile(ASTSource(fn=fn, signature=_signature(fn, floats, *types), constexprs=constexprs),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    usage = _usage(compiled.asm["cubin"])
    rows.append({"kernel": fn.__name__, "constexprs": {k: str(v) for k, v in constexprs.items()}, "warps": warps,
                 "regs": usage["reg"], "spill_bytes": usage["stack"] + usage["local"]})
    print(rows[-1])
with open(sys.argv[1], "w") as f:
    json.dump({"triton": triton.__version__, "rows": rows}, f, indent=1)
