"""Registers, spills and shared memory of every Triton kernel a mixer variant's forward + backward launches,
compiled for the H200 (sm_90) on a machine without a GPU.

Each launch compiles through Triton's own compiler and the ptxas it ships, and nothing runs (the buffers
hold garbage, which no host code reads). The counts are what the GPU's driver reports for the same
compile: spills = the stack frame and local bytes per thread / 4, as Triton's ``n_spills``. So register pressure can be
tuned here, and a device call spent on timing. Needs no CUDA device, no driver, no TRITON_INTERPRET.

Usage: python scripts/offline_regs.py [--ops samu,rglru] [--variants NAMES] [--rglru-config K,WC]
                                      [--shape 1,4096,2048] [--documents 0,16] [--dtype bfloat16] [--json FILE]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import samu.ops.packing_triton as packing_triton  # noqa: E402
import samu.ops.rglru.triton_fwd as rglru_fwd  # noqa: E402
import samu.ops.samu.triton_bwd as samu_bwd  # noqa: E402
import samu.ops.samu.triton_fwd as samu_fwd  # noqa: E402
from samu.gates.inputs import document_offsets  # noqa: E402
from samu.ops import dispatch  # noqa: E402
from tests.helpers import randn, rglru_params, samu_params  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
FLAGS = ("VARLEN", "HAS_H0", "HAS_DH", "HAS_DF", "HAS_FINAL", "SUMMARY", "MATH", "K", "WC", "BJ", "BN")
_BACKEND = make_backend(TARGET)
_CUOBJDUMP = glob.glob(os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump"))[0]


def _usage(cubin: bytes) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([_CUOBJDUMP, "--dump-resource-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
    return {k.lower(): int(v) for k, v in re.findall(r"\b(REG|STACK|LOCAL):(\d+)", out)}


class Compiler:
    """A stand-in for samu's ``launch``: compiles each distinct launch for sm_90 and records its usage."""

    def __init__(self):
        self.rows = {}

    def __call__(self, kernel, grid, *args, **kwargs):
        binder = create_function_from_signature(kernel.signature, kernel.params, _BACKEND)
        bound, spec, opts = binder(*args, **kwargs)
        options, signature, constexprs, attrs = kernel._pack_args(_BACKEND, kwargs, bound, spec, opts)
        flags = {kernel.params[path[0]].name: value for path, value in constexprs.items()
                 if kernel.params[path[0]].name in FLAGS}
        key = (kernel.fn.__name__, tuple(sorted(flags.items())), options.num_warps)
        if key not in self.rows:
            compiled = triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=TARGET,
                                      options=options.__dict__)
            usage = _usage(compiled.asm["cubin"])
            self.rows[key] = dict(kernel=key[0], flags=flags, warps=options.num_warps, regs=usage["reg"],
                                  spills=(usage["stack"] + usage["local"]) // 4, shared=compiled.metadata.shared)


def patch(compiler):
    for module, name in ((rglru_fwd, "triton_launch"), (samu_fwd, "launch"), (samu_bwd, "launch"),
                         (packing_triton, "launch")):
        setattr(module, name, compiler)


def run_case(op, variant, shape, dtype, documents, rglru_config=None):
    B, L, D = shape
    x = randn(shape, 0, dtype=dtype).requires_grad_(True)
    if op == "samu":
        params = samu_params(D, 1)
    else:
        params = rglru_params(D, 16, 1)
    params = [p.requires_grad_(True) for p in params]
    cu = None
    if documents:
        cu = torch.tensor(document_offsets(L, documents, 1), dtype=torch.int32)
    extra = (None, 8.0) if op == "rglru" else (None, 4.0)
    if op == "rglru" and rglru_config:
        from samu.ops.rglru.function import Config, run

        y, _ = run(x, *params, *extra, Config(*rglru_config), cu_seqlens=cu)
    else:
        y, _ = dispatch.variants(op)[variant].run(x, *params, *extra, cu_seqlens=cu)
    y.backward(torch.zeros_like(y))


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
                          f"spills {row['spills']:4d} shared {row['shared']:6d} warps {row['warps']}  {flags}",
                          flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"target": "sm_90", "shape": shape, "dtype": args.dtype, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
