"""Whether a change leaves every SAMU kernel's machine code as it was: the SASS of each kernel launch the
SAMU variants make, compiled for the H200 (sm_90) on this machine without a GPU (tests/sm90.py's compiler),
over both variants, three dtypes, packed and not, every combination of initial state and final-state
cotangent, and shapes that give the integer arguments each specialisation Triton makes (SHAPES).

Unchanged SASS computes the same bits, so the gate records of the code before still speak for a change
made inside the kernels (@triton.jit functions) with the host code unchanged; any difference, even in
register allocation, needs the gates again. It cannot see host-side changes (grids, argument values,
buffers): those need the gates too.

Usage: python scripts/sass_same.py dump FILE.json          (the checkout as it is, without TRITON_INTERPRET;
                                                           ~10 minutes)
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

import tests.sm90 as sm90  # noqa: E402


class Dumper(sm90.Compiler):
    """tests/sm90.py's compiler, keeping each distinct launch's SASS (addresses stripped) in ``rows``, keyed by
    everything its code depends on: the integer arguments' specialisations (signature, attrs) too."""

    def key(self, kernel, constexprs, signature, attrs, options):
        return repr((kernel.fn.__name__, sorted((str(k), str(v)) for k, v in constexprs.items()), str(signature),
                     str(attrs), options.num_warps))

    def record(self, kernel, constexprs, options, compiled):
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(compiled.asm["cubin"])
            f.flush()
            out = subprocess.run([sm90._CUOBJDUMP, "-sass", f.name], capture_output=True, text=True, check=True).stdout
        return [re.sub(r"/\*[0-9a-f]+\*/", "", m.group(1)).strip()
                for m in re.finditer(r"^\s+/\*[0-9a-f]{4,}\*/\s+([^;]*;)", out, re.M)]


# Shapes whose integer arguments take every specialisation Triton makes (values of 1, multiples of 16, neither):
# the gate shapes (L and D multiples of 16; one chunk, tile or group), long ones (G >= 16), narrow ones (mode
# tiles below 64) and odd ones
SHAPES = ((1, 16, 1664), (1, 512, 1664), (1, 8192, 1024), (1, 32768, 2048), (1, 131072, 1024), (2, 4096, 2560),
          (4, 2048, 1664), (16, 256, 128), (64, 16, 1664), (1, 300, 256), (2, 1000, 250), (1, 63, 10),
          (2, 100, 64))
# (initial state, final-state cotangent): both, neither, and each alone
STATES = ((True, True), (False, False), (True, False), (False, True))


def dump(path):
    dumper = Dumper()
    sm90.patch(dumper)
    for variant in ("triton_grouped", "triton_serial"):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for shape in SHAPES:
                for documents in ((0, 5) if shape[0] == 1 and shape[1] >= 300 else (0,)):
                    for has_h0, has_df in STATES:
                        sm90.run_case("samu", variant, shape, dtype, documents, with_state=has_h0,
                                      final_grad=has_df)
    with open(path, "w") as f:
        json.dump(dumper.rows, f)
    print(f"{len(dumper.rows)} kernel launches dumped to {path}")


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
