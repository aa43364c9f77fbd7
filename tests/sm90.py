"""Compiling samu's Triton kernels for the H200 (sm_90) on a machine without a GPU: each launch a mixer
variant makes goes through Triton's own compiler and the ptxas it ships, and does not run (its buffers
hold garbage, which no host code reads). The interpreter, which runs kernels as Python, accepts code the
compiler refuses (a loop-carried value whose type changes, a dot under 16 deep); this catches it on CPU,
and reports each kernel's registers and spills as the GPU's driver would (spills = the stack frame and
local bytes per thread / 4, Triton's ``n_spills``). Run it with TRITON_INTERPRET=0 (kernels decorated for
the interpreter cannot compile): tests/ops/test_offline_compile.py runs it in a child process,
scripts/offline_regs.py prints its table."""

import glob
import os
import re
import subprocess
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature

import samu.ops.packing_triton as packing_triton
import samu.ops.rglru.triton_fwd as rglru_fwd
import samu.ops.samu.triton_bwd as samu_bwd
import samu.ops.samu.triton_fwd as samu_fwd
from samu.gates.inputs import document_offsets
from samu.ops import dispatch
from samu.ops.rglru.function import Config
from samu.ops.rglru.function import run as rglru_run
from tests.helpers import randn, rglru_params, samu_params

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
    """A stand-in for samu's ``launch``: compiles each distinct launch for sm_90 and records its usage
    (``rows``, keyed by kernel, constexprs and warps). Subclasses change what a launch is keyed by and what is
    recorded of it (``key``, ``record``)."""

    def __init__(self):
        self.rows = {}

    def key(self, kernel, constexprs, signature, attrs, options):
        return (kernel.fn.__name__, tuple(sorted((str(k), str(v)) for k, v in constexprs.items())), options.num_warps,
                options.num_stages, options.maxnreg)

    def record(self, kernel, constexprs, options, compiled):
        flags = {kernel.params[path[0]].name: value for path, value in constexprs.items()
                 if kernel.params[path[0]].name in FLAGS}
        usage = _usage(compiled.asm["cubin"])
        return dict(kernel=kernel.fn.__name__, flags=flags, warps=options.num_warps, stages=options.num_stages,
                    maxnreg=options.maxnreg, regs=usage["reg"], spills=(usage["stack"] + usage["local"]) // 4,
                    shared=compiled.metadata.shared)

    def __call__(self, kernel, grid, *args, **kwargs):
        binder = create_function_from_signature(kernel.signature, kernel.params, _BACKEND)
        bound, spec, opts = binder(*args, **kwargs)
        options, signature, constexprs, attrs = kernel._pack_args(_BACKEND, kwargs, bound, spec, opts)
        key = self.key(kernel, constexprs, signature, attrs, options)
        if key not in self.rows:
            compiled = triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=TARGET,
                                      options=options.__dict__)
            self.rows[key] = self.record(kernel, constexprs, options, compiled)


def patch(compiler):
    """Route every mixer kernel launch (and the packing words') through ``compiler``."""
    for module, name in ((rglru_fwd, "triton_launch"), (samu_fwd, "launch"), (samu_bwd, "launch"),
                         (packing_triton, "launch")):
        setattr(module, name, compiler)


def run_case(op, variant, shape, dtype, documents, rglru_config=None, with_state=False, final_grad=None):
    """One forward + backward of a variant (or, for RG-LRU, of ``rglru_config`` = (K, WC)); with_state: an
    initial state and a final-state cotangent (what the gates run), else neither (what training runs);
    ``final_grad`` (default: with_state) sets the final-state cotangent apart: without it the final state is
    not asked for either (the forward then skips it, as a training call's does)."""
    B, L, D = shape
    x = randn(shape, 0, dtype=dtype).requires_grad_(True)
    if op == "samu":
        params = samu_params(D, 1)
    else:
        params = rglru_params(D, 16, 1)
    params = [p.requires_grad_(True) for p in params]
    cu = torch.tensor(document_offsets(L, documents, 1), dtype=torch.int32) if documents else None
    h0 = randn((documents or B, D), 2).requires_grad_(True) if with_state else None
    extra = (h0, 8.0) if op == "rglru" else (h0, 2.0)
    final = with_state if final_grad is None else final_grad
    if op == "rglru" and rglru_config:
        y, h = rglru_run(x, *params, *extra, Config(*rglru_config), cu_seqlens=cu, final=final)
    else:
        y, h = dispatch.variants(op)[variant].run(x, *params, *extra, cu_seqlens=cu, final=final)
    outputs = [y, h] if final else [y]
    torch.autograd.backward(outputs, [torch.zeros_like(o) for o in outputs])


def compile_mixers(op: str):
    """Every specialisation the packing and plain calls of one variant of ``op`` launch, with and without
    states, compiled for sm_90 (the guard tests/ops/test_offline_compile.py runs, one op per process)."""
    variant = {"samu": "triton_grouped", "rglru": "triton_chunked"}[op]
    compiler = Compiler()
    patch(compiler)
    for documents in (0, 5):
        for with_state in (False, True):
            run_case(op, variant, (1, 300, 256), torch.bfloat16, documents, with_state=with_state)
    if op == "rglru":
        # head dims 64, 96, 128 and 160 in bf16 and fp16: the passes LEANER runs unpipelined or at 128 registers
        for dtype in (torch.bfloat16, torch.float16):
            for D in (1024, 1536, 2048, 2560):
                run_case(op, variant, (1, 300, D), dtype, 0)
    print(op, len(compiler.rows), "kernels")
    print("compiled")
