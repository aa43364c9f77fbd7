"""Whether a change leaves a mixer's kernels' machine code as it was: the SASS of each kernel launch the
variants of one mixer make, compiled for the H200 (sm_90) on this machine without a GPU (tests/sm90.py's
compiler), over its variants, three dtypes, packed and not, every combination of initial state and final-state
cotangent, and shapes that give the integer arguments each specialisation Triton makes (SHAPES).

Unchanged SASS computes the same bits, so the gate records of the code before still speak for a change
made inside the kernels (@triton.jit functions) with the host code unchanged; any difference, even in
register allocation, needs the gates again. It cannot see host-side changes (grids, argument values,
buffers): those need the gates too. A launch is keyed by its kernel, its constexprs and its arguments'
specialisations, each by parameter name; ``--drop NAME`` compares A's launches that set the flag NAME true,
with NAME left out, against B (a flag a change removed by keeping its true form: B must hold each such
launch, and no launch A lacks). Dumps made before 2026-12-02 (results/dev/issue12/sass_same_*) keyed launches by
parameter position and compare only with dumps of that older script.

Usage: python scripts/sass_same.py dump FILE.json [--op samu|rglru]   (the checkout as it is, without
                                                                    TRITON_INTERPRET; ~10 minutes for SAMU,
                                                                    far longer for RG-LRU on two cores)
       python scripts/sass_same.py compare A.json B.json [--drop NAME]  (exit 1 where any launch differs)
"""

from __future__ import annotations

import argparse
import ast
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
        def named(paths):
            return sorted((kernel.params[path[0]].name, str(value)) for path, value in paths.items())

        return repr((kernel.fn.__name__, named(constexprs), sorted(signature.items()), named(attrs),
                     options.num_warps))

    def record(self, kernel, constexprs, options, compiled):
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(compiled.asm["cubin"])
            f.flush()
            out = subprocess.run([sm90._CUOBJDUMP, "-sass", f.name], capture_output=True, text=True, check=True).stdout
        return [re.sub(r"/\*[0-9a-f]+\*/", "", m.group(1)).strip()
                for m in re.finditer(r"^\s+/\*[0-9a-f]{4,}\*/\s+([^;]*;)", out, re.M)]


# Shapes whose integer arguments take every specialisation Triton makes (values of 1, multiples of 16, neither):
# the gate shapes (L and D multiples of 16; one chunk, tile or group), long ones (G >= 16), narrow ones (mode
# tiles below 64) and odd ones; RG-LRU's (16 heads) at its head dims 16, 64, 96, 104, 128 and 160
SHAPES = {"samu": ((1, 16, 1664), (1, 512, 1664), (1, 8192, 1024), (1, 32768, 2048), (1, 131072, 1024),
                   (2, 4096, 2560), (4, 2048, 1664), (16, 256, 128), (64, 16, 1664), (1, 300, 256), (2, 1000, 250),
                   (1, 63, 10), (2, 100, 64)),
          "rglru": ((1, 300, 256), (2, 1000, 1024), (1, 777, 1536), (64, 16, 1664), (4, 2048, 2048),
                    (1, 2100, 2560))}
# (initial state, final-state cotangent): both, neither, and each alone
STATES = ((True, True), (False, False), (True, False), (False, True))


def dump(path, op="samu"):
    from samu.ops import dispatch

    dumper = Dumper()
    sm90.patch(dumper)
    for variant in sorted(dispatch.variants(op)):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for shape in SHAPES[op]:
                for documents in ((0, 5) if shape[0] == 1 and shape[1] >= 300 else (0,)):
                    for has_h0, has_df in STATES:
                        sm90.run_case(op, variant, shape, dtype, documents, with_state=has_h0, final_grad=has_df)
    with open(path, "w") as f:
        json.dump(dumper.rows, f)
    print(f"{len(dumper.rows)} kernel launches dumped to {path}")


def _dropped(rows, name):
    """rows whose flag ``name`` is true, keyed without it (rows where it is false are left out)."""
    out = {}
    for key, sass in rows.items():
        kernel, constexprs, signature, *rest = ast.literal_eval(key)
        if (name, "False") in constexprs:
            continue
        out[repr((kernel, [c for c in constexprs if c[0] != name], [s for s in signature if s[0] != name],
                  *rest))] = sass
    return out


def compare(a_path, b_path, drop=None):
    a, b = json.load(open(a_path)), json.load(open(b_path))
    if drop:
        a = _dropped(a, drop)
    differ = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    for key in differ:
        print("differs:" if key in a and key in b else "only in " + ("A:" if key in a else "B:"), key[:160])
    print(f"{len(set(a) | set(b)) - len(differ)} of {len(set(a) | set(b))} kernel launches have the same SASS")
    return 1 if differ else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=("dump", "compare"))
    ap.add_argument("files", nargs="+")
    ap.add_argument("--op", choices=("samu", "rglru"), default="samu")
    ap.add_argument("--drop", help="compare: a flag A has and B does not (A's true form against B)")
    args = ap.parse_args()
    if args.action == "dump" and len(args.files) == 1:
        dump(args.files[0], args.op)
    elif args.action == "compare" and len(args.files) == 2:
        sys.exit(compare(*args.files, drop=args.drop))
    else:
        ap.error("dump takes one file, compare two")
