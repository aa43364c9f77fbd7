"""Compile the RG-LRU kernels for sm_90 on this machine (no GPU needed) and report, per kernel:
registers, spill bytes, shared memory, tensor-core instructions, and the SASS instruction count
of each loop body (innermost first) with the elements one thread handles per pass of that loop.

Usage: python scripts/sass_report_rglru.py [--n 64,128,160] [--dtype bf16] [--K 16] [--WC 4] [--ops]
Launches are specialised as at run time (16-aligned pointers; D = 16 n, H = 16, as constants).
Needs triton's bundled ptxas/cuobjdump (the Linux x86-64 wheel has them).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from samu.ops.rglru import triton_bwd, triton_fwd  # noqa: E402

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
IO = ("x", "y", "dy", "dx")
INTS = ("L", "D", "NC", "G", "NG", "one", "n_rows", "M", "HNN")


def signature(fn, io: str):
    sig = {}
    for p in fn.params:
        if p.is_constexpr:
            sig[p.name] = "constexpr"
        elif p.name in IO:
            sig[p.name] = "*" + io
        elif p.name == "w3":
            sig[p.name] = "*bf16"
        elif p.name == "c":
            sig[p.name] = "fp32"
        elif p.name in INTS:
            sig[p.name] = "i32"
        else:
            sig[p.name] = "*fp32"
    return sig


def compile_sm90(fn, io: str, constexprs: dict, warps: int, div16=("D",), stages: int = 2):
    """cubin SASS and ptxas -v output of one specialisation."""
    sig = signature(fn, io)
    attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(fn.params)
             if not p.is_constexpr and (sig[p.name].startswith("*") or p.name in div16)}
    compiled = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
    with tempfile.TemporaryDirectory() as tmp:
        ptx, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(ptx, "w") as f:
            f.write(compiled.asm["ptx"])
        info = subprocess.run([os.path.join(BIN, "ptxas"), "-v", "--gpu-name", "sm_90a", ptx, "-o", cubin],
                              capture_output=True, text=True).stderr
        sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", cubin], capture_output=True, text=True).stdout
    return sass, info, compiled.metadata.shared


def loop_bodies(sass: str):
    """(first, last) instruction index of every backward branch's body, innermost (shortest) first."""
    insts = re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)
    pcs = [int(a, 16) for a, _ in insts]
    spans = []
    for k, (_, text) in enumerate(insts):
        m = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))", text)
        if m and m.group(1) and int(m.group(1), 16) < pcs[k]:
            spans.append((pcs.index(int(m.group(1), 16)), k))
    return sorted(spans, key=lambda s: s[1] - s[0]), [t for _, t in insts]


def opcode_mix(texts):
    return collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for t in texts)


def kernels(n: int, args):
    """(name, kernel, constexprs, warps, elements one thread handles per pass of the main loop, times
    the innermost loop runs per pass of the main loop)."""
    H = 16
    (NPA, NPB), BJ = triton_fwd.head_pieces(n), triton_fwd.channel_block(n)
    XP = {"bf16": 1, "fp16": 2, "fp32": 3}[args.dtype]
    K, WC = args.K, args.WC
    shape = dict(D=H * n, n=n, H=H, K=K, WC=WC, NPA=NPA, NPB=NPB, NPW=triton_fwd.weight_width(n), BJ=BJ,
                 X_PARTS=XP, MATH=2)
    per_thread = K * WC * BJ / (32 * WC)
    NJ = triton.cdiv(n, BJ)
    grouped = dict(shape, NGP=triton_fwd.MAX_GROUPS, HAS_H0=True, VARLEN=False)
    y_order = 2 if args.dtype == "fp32" else 1
    return [
        ("fwd summary", triton_fwd._rglru_chunk_kernel,
         dict(grouped, Y_ORDER=y_order, SUMMARY=True, HAS_FINAL=True), WC, per_thread, 1),
        ("fwd replay", triton_fwd._rglru_chunk_kernel,
         dict(grouped, Y_ORDER=y_order, SUMMARY=False, HAS_FINAL=True), WC, per_thread, 1),
        ("bwd summary", triton_bwd._rglru_bwd_summary_kernel, shape, WC, per_thread, 1),
        ("bwd dW", triton_bwd._rglru_bwd_dw_kernel, dict(grouped, M=2 * H * n * n + 3 * H * n, HAS_DH=True), WC,
         per_thread, 1),
        # the dx kernel's main loop runs an inner loop over the head's NJ channel tiles
        ("bwd dx", triton_bwd._rglru_bwd_dx_kernel, dict(shape, DX_ORDER=y_order), WC, per_thread * NJ, NJ),
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", default="64,128,160", help="head dims (D / H)")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    ap.add_argument("--K", type=int, default=16, help="chunk length (tokens per thread)")
    ap.add_argument("--WC", type=int, default=4, help="chunks per step = warps")
    ap.add_argument("--stages", type=int, default=2, help="software-pipelining stages (num_stages; the launches use 2)")
    ap.add_argument("--ops", action="store_true", help="print the opcode mix of each kernel's main loop")
    args = ap.parse_args()
    print(f"{'kernel':12s} {'n':>4s} {'regs':>4s} {'spill':>6s} {'smem':>7s} {'mma':>4s}  loop bodies (instructions)"
          f"  -> instructions per element")
    for n in (int(v) for v in args.n.split(",")):
        for name, fn, consts, warps, elems, inner_runs in kernels(n, args):
            sass, info, smem = compile_sm90(fn, args.dtype, consts, warps, stages=args.stages)
            regs = re.search(r"Used (\d+) registers", info)
            spill = re.search(r"(\d+) bytes spill stores", info)
            spans, texts = loop_bodies(sass)
            sizes = [b - a + 1 for a, b in spans]
            mma = len(re.findall(r"\bH[G]?MMA\b", sass))
            # the outermost loop walks the steps; its body covers `elems` elements per thread and
            # contains the innermost loop's body once, which runs `inner_runs` times
            outer = max(sizes) if sizes else 0
            inner = min(sizes) if len(sizes) > 1 else 0
            per = (outer + (inner_runs - 1) * inner) / elems
            print(f"{name:12s} {n:4d} {regs.group(1) if regs else '?':>4s} {spill.group(1) if spill else '?':>6s} "
                  f"{smem:7d} {mma:4d}  {sizes}  -> {per:.0f}", flush=True)
            if args.ops and spans:
                a, b = max(spans, key=lambda s: s[1] - s[0])
                print("     ", ", ".join(f"{k} {v}" for k, v in opcode_mix(texts[a:b + 1]).most_common(24)))


if __name__ == "__main__":
    main()
