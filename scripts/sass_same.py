"""Whether a change leaves every SAMU kernel's machine code as it was: the SASS of each kernel launch the
SAMU variants make (both variants; packed and not; with and without states; bf16, fp16, fp32; two shapes),
compiled for the H200 (sm_90) on this machine, without a GPU (tests/sm90.py's compiler).

Unchanged SASS computes the same bits, so the gate records of the code before still speak for the code
after (a rename or a refactor needs no device call); any difference, even in register allocation, needs
the gates again.

Usage: python scripts/sass_same.py dump FILE.json          (the checkout as it is; ~3 minutes; without
                                                           TRITON_INTERPRET)
       python scripts/sass_same.py compare A.json B.json   (exit 1 where any kernel differs)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

import tests.sm90 as sm90  # noqa: E402


class Dumper(sm90.Compiler):
    """A stand-in for ``launch`` that keeps each distinct launch's SASS, addresses stripped."""

    def __init__(self):
        super().__init__()
        self.sass = {}

    def __call__(self, kernel, grid, *args, **kwargs):
        binder = create_function_from_signature(kernel.signature, kernel.params, sm90._BACKEND)
        bound, spec, opts = binder(*args, **kwargs)
        options, signature, constexprs, attrs = kernel._pack_args(sm90._BACKEND, kwargs, bound, spec, opts)
        key = repr((kernel.fn.__name__, sorted((str(k), str(v)) for k, v in constexprs.items()), str(signature),
                    str(attrs), options.num_warps))
        if key in self.sass:
            return
        compiled = triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=sm90.TARGET,
                                  options=options.__dict__)
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(compiled.asm["cubin"])
            f.flush()
            out = subprocess.run([sm90._CUOBJDUMP, "-sass", f.name], capture_output=True, text=True, check=True).stdout
        self.sass[key] = [re.sub(r"/\*[0-9a-f]+\*/", "", m.group(1)).strip()
                          for m in re.finditer(r"^\s+/\*[0-9a-f]{4,}\*/\s+([^;]*;)", out, re.M)]


def dump(path):
    dumper = Dumper()
    sm90.patch(dumper)
    for variant in ("triton_grouped", "triton_serial"):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for shape in ((1, 300, 256), (2, 1000, 250)):
                for documents in ((0, 5) if shape[0] == 1 else (0,)):
                    for with_state in (False, True):
                        sm90.run_case("samu", variant, shape, dtype, documents, with_state=with_state)
    with open(path, "w") as f:
        json.dump(dumper.sass, f)
    print(f"{len(dumper.sass)} kernel launches dumped to {path}")


def compare(a_path, b_path):
    a, b = json.load(open(a_path)), json.load(open(b_path))
    differ = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    for key in differ:
        print("differs:", key[:160])
    print(f"{len(set(a) | set(b)) - len(differ)} of {len(set(a) | set(b))} kernel launches have the same SASS")
    return 1 if differ else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "dump":
        dump(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(__doc__)
