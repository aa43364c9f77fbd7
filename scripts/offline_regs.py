"""Registers, spills and shared memory of every Triton kernel a mixer variant's forward + backward launches,
compiled for the H200 (sm_90) on a machine without a GPU.

The compiling is tests/sm90.py's (Triton's own compiler and the ptxas it ships; nothing runs); the counts
match what the GPU's driver reports for the same compile, so register pressure can be tuned here and a
device call spent on timing. Needs no CUDA device, no driver, no TRITON_INTERPRET.

Usage: python scripts/offline_regs.py [--ops samu,rglru] [--variants NAMES] [--rglru-config K,WC]
                                      [--shape 1,4096,2048] [--documents 0,16] [--dtype bfloat16] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from samu.environment import environment  # noqa: E402
from samu.ops import dispatch  # noqa: E402
from tests.sm90 import Compiler, patch, run_case  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default="samu,rglru")
    ap.add_argument("--shape", default="1,4096,2048")
    ap.add_argument("--documents", default="0,16")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--variants", default=None, help="comma-separated variant names (default: every one)")
    ap.add_argument("--rglru-config", default=None, help="K,WC: RG-LRU launch settings to try in place of the "
                    "variants' (one run, named by them)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    shape = tuple(int(s) for s in args.shape.split(","))
    dtype = getattr(torch, args.dtype)
    rglru_config = tuple(int(s) for s in args.rglru_config.split(",")) if args.rglru_config else None
    rows = []
    for op in args.ops.split(","):
        for variant in sorted(dispatch.variants(op)):
            if args.variants and variant not in args.variants.split(","):
                continue
            if op == "rglru" and rglru_config:
                if variant != "triton_chunked":
                    continue
                variant = "K={},WC={}".format(*rglru_config)
            for n in (int(s) for s in args.documents.split(",")):
                compiler = Compiler()
                patch(compiler)
                run_case(op, variant, shape, dtype, n, rglru_config if op == "rglru" else None)
                for row in compiler.rows.values():
                    rows.append(dict(row, op=op, variant=variant, documents=n))
                    flags = ",".join(f"{k}={v}" for k, v in row["flags"].items())
                    print(f"{op:5s} {variant:22s} docs={n:<4d} {row['kernel']:30s} regs {row['regs']:3d} "
                          f"spills {row['spills']:4d} shared {row['shared']:6d} warps {row['warps']} "
                          f"stages {row['stages']} maxnreg {row['maxnreg']}  {flags}",
                          flush=True)
    if args.json:
        record = {"env": environment("cpu"), "target": "sm_90", "shape": shape, "dtype": args.dtype,
                  "rglru_config": rglru_config, "rows": rows}
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
