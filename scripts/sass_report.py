"""Compile the SAMU kernels for sm_90 on this machine (no GPU needed) and report, per kernel:
registers, spills, and the SASS instruction count of each loop body (innermost first).

It compiles each kernel from the signatures written out below (unpacked, no states), not from a launch, so
its counts are a guide to a loop body's size; the registers of the kernels a call launches are
`scripts/offline_regs.py`'s, and their exact SASS `scripts/sass_same.py`'s.

Usage: python scripts/sass_report.py [--K 32] [--BN 64] [--warps 1] [--dtype bf16] [--unroll 2] [--dump DIR]
Needs triton's bundled ptxas/cuobjdump (the Linux x86-64 wheel has them).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from samu.ops.samu import triton_bwd, triton_fwd  # noqa: E402

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def kernels(io: str):
    """(kernel, signature, constexprs) for the token-walking kernels."""
    f32 = "*fp32"
    ints = lambda *names: {n: "i32" for n in names}  # noqa: E731
    return [
        (triton_fwd._summary_kernel, {"x": io, "ctl": f32, "trig": f32, "modes": f32, "csum": f32,
                                      "ck": f32, "groups": f32, "start": f32, "init": f32, "count": "*i32",
                                      "words": f32, "h0": f32, **ints("L", "D", "N", "n_chunks", "G"),
                                      "K": "constexpr", "BN": "constexpr", "U": "constexpr", "VARLEN": "constexpr",
                                      "HAS_H0": "constexpr", "HAS_INIT": "constexpr"},
         {"VARLEN": False, "HAS_H0": False, "HAS_INIT": False}),
        (triton_fwd._replay_kernel, {"x": io, "ctl": f32, "trig": f32, "modes": f32, "ck": f32, "start": f32,
                                     "y": io, "bound": f32, "final": f32, **ints("L", "D", "N", "n_chunks", "n_groups"),
                                     "K": "constexpr", "BN": "constexpr", "U": "constexpr", "G": "i32", "HAS_FINAL": "constexpr"},
         {"HAS_FINAL": False}),
        (triton_bwd._adjoint_summary_kernel, {"dy": io, "ctl": f32, "trig": f32, "nu": f32, "theta_log": f32,
                                              "modes": f32, "rsum": f32, "rck": f32, "rgroups": f32, "right": f32,
                                              "init": f32, "count": "*i32", "words": f32, "dfinal": f32,
                                              **ints("L", "D", "N", "n_chunks", "G"), "K": "constexpr",
                                              "BN": "constexpr", "U": "constexpr", "VARLEN": "constexpr",
                                              "HAS_DF": "constexpr", "HAS_INIT": "constexpr"},
         {"VARLEN": False, "HAS_DF": False, "HAS_INIT": False}),
        (triton_bwd._main_kernel, {"x": io, "dy": io, "ctl": f32, "trig": f32, "modes": f32, "bound": f32,
                                   "rck": f32, "right": f32, "slots": f32, "part": f32, "rows": f32, "dh0": f32,
                                   **ints("L", "D", "N", "n_chunks", "n_groups", "n_tiles", "n_items"),
                                   "K": "constexpr", "BN": "constexpr", "U": "constexpr", "G": "i32", "HAS_H0": "constexpr"},
         {"HAS_H0": False}),
        (triton_bwd._dx_kernel, {"x": io, "dy": io, "ctl": f32, "trig": f32, "modes": f32, "directions": f32,
                                 "rnorm": f32, "rck": f32, "right": f32, "dp": f32, "dx": io, "rows": f32,
                                 **ints("L", "D", "N", "n_chunks", "n_groups"), "K": "constexpr",
                                 "BN": "constexpr", "U": "constexpr", "G": "i32"}, {}),
    ]


def loops(sass: str):
    """Instruction counts of the bodies of backward branches (loops), innermost first."""
    addr = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    spans = []
    for pc, text in addr:
        m = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))", text)
        if m and m.group(1) and int(m.group(1), 16) < pc:
            spans.append((pc - int(m.group(1), 16)) // 16 + 1)
    return sorted(spans)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--K", type=int, default=32)
    ap.add_argument("--BN", type=int, default=64)
    ap.add_argument("--warps", type=int, default=1)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--unroll", type=int, default=2)
    ap.add_argument("--dump", default=None, help="a folder to write each kernel's SASS into (KERNEL.sass)")
    args = ap.parse_args()
    target = GPUTarget("cuda", 90, 32)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.join(os.path.dirname(__file__), "..")).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "samu"], capture_output=True, text=True,
                           cwd=os.path.join(os.path.dirname(__file__), "..")).stdout.strip()
    print(f"# python scripts/sass_report.py {' '.join(sys.argv[1:])} | triton {triton.__version__} | commit "
          f"{commit}{' (samu/ modified)' if dirty else ''} | offline sm_90a build, static counts")
    for fn, sig, consts in kernels(f"*{args.dtype}"):
        constexprs = {k: v for k, v in {"K": args.K, "BN": args.BN, "U": args.unroll, **consts}.items() if k in sig}
        compiled = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs),
                                  target=target, options={"num_warps": args.warps})
        with tempfile.TemporaryDirectory() as tmp:
            ptx, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
            open(ptx, "w").write(compiled.asm["ptx"])
            info = subprocess.run([os.path.join(BIN, "ptxas"), "-v", "--gpu-name", "sm_90a", ptx, "-o", cubin],
                                  capture_output=True, text=True).stderr
            sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", cubin], capture_output=True,
                                  text=True).stdout
        if args.dump:
            os.makedirs(args.dump, exist_ok=True)
            with open(os.path.join(args.dump, fn.__name__ + ".sass"), "w") as f:
                f.write(sass)
        regs = re.search(r"Used (\d+) registers", info)
        spills = re.search(r"(\d+) bytes spill stores", info)
        mufu = len(re.findall(r"MUFU", sass))
        print(f"{fn.__name__:26s} regs {regs.group(1) if regs else '?':>3s} spill-stores {spills.group(1) if spills else '?':>4s}"
              f" MUFU {mufu:3d} loop bodies {loops(sass)}")


if __name__ == "__main__":
    main()
