"""The fused glue, GeGLU, RMSNorm, decoding-step, one-row product, sequence-parallel correction and AdamW kernels
compile for sm_90 (H100/H200) on any machine, no GPU needed.

The Triton interpreter runs kernels as Python, so it accepts some code the compiler refuses (a plain
global read inside a kernel, say); compiling each specialisation the block launches catches that on CPU.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
pytestmark = pytest.mark.skipif(not os.path.exists(PTXAS), reason="this triton wheel carries no ptxas")

# pointers to I/O tensors in the storage dtype; every other pointer is fp32, every other scalar i32
IO = {"z", "state", "xc", "a", "dxc", "da", "dz", "x", "y", "dy", "dx", "cw", "cb", "shift", "shifted", "add", "dadd"}
SCALARS = ("L", "E", "R", "W", "n_l", "N", "D", "HD", "sx", "B", "H")


def _signature(fn, floats=(), types=None):
    """Each argument's type: ``types`` where it names one (names fn does not take are left out), else by the
    rules above."""
    names = {p.name for p in fn.params}
    out = {k: v for k, v in (types or {}).items() if k in names}
    for p in fn.params:
        if p.name in out:
            continue
        if p.is_constexpr:
            out[p.name] = "constexpr"
        elif p.name in floats:
            out[p.name] = "fp32"
        elif p.name in SCALARS or p.name.startswith(("sz_", "ss_", "so_")):
            out[p.name] = "i32"
        else:
            out[p.name] = "*bf16" if p.name in IO else "*fp32"
    return out


def _cases():
    from samu.ops import adamw_triton as aw
    from samu.ops import geglu_triton as gg
    from samu.ops import glue_triton as g
    from samu.ops import rmsnorm_triton as r
    from samu.ops import rowprod_triton as rp
    from samu.ops.triton_utils import PDL_WAIT, next_power_of_2
    from samu.ops import step_triton as s
    from samu.ops.samu import triton_shift as sh

    for K in (1, 2, 4):
        for state in (False, True):
            yield g._conv_gelu_fwd, {}, dict(K=K, HAS_STATE=state, BL=g.BL, BE=g.BE), 4
            yield g._conv_gelu_bwd, {}, dict(K=K, HAS_STATE=state, ROWS=g.ROWS, BL=g.BWD_BL, BE=g.BWD_BE), 4
    for BW in (1024, 2048):
        for rows in (1, r.ROWS):   # one row a program (decoding) or many
            # the decoding step's norm also writes x + shift; a residual sum's norm (add_rms_norm) writes the sum
            for add, shift in ((False, False), (False, True), (True, False)):
                yield (r._rmsnorm_fwd, ("eps",), dict(BW=BW, ROWS=rows, HAS_ADD=add, HAS_SHIFT=shift),
                       4 if BW <= 2048 else 8)
        for dtotal in (False, True):
            yield r._rmsnorm_bwd, (), dict(BW=BW, ROWS=r.ROWS, HAS_DTOTAL=dtotal, HAS_DADD=dtotal), 4
        # the language model's case under autocast: the fp32 residual stream plus a bf16 block output
        yield (r._rmsnorm_fwd, ("eps",), dict(BW=BW, ROWS=r.ROWS, HAS_ADD=True, HAS_SHIFT=False), 4,
               {"x": "*fp32", "add": "*bf16", "total": "*fp32", "y": "*bf16"})
        yield (r._rmsnorm_bwd, (), dict(BW=BW, ROWS=r.ROWS, HAS_DTOTAL=True, HAS_DADD=True), 4,
               {"dy": "*bf16", "x": "*fp32", "dtotal": "*fp32", "dx": "*fp32", "dadd": "*bf16"})
    for block in (gg.BLOCK, gg.FEW_BLOCK):
        yield gg._geglu_fwd, (), dict(BLOCK=block), 4
        yield gg._geglu_bwd, (), dict(BLOCK=block), 4
    for K in (0, 1, 4):   # the mixer's own step, and the block's with Conv1D widths 1 and 4
        for BN in (32, 64, 256, 512, 1024):   # the GPU tests', the presets' and the 400m's
            yield (s._samu_step, ("radial_bound",), dict(BN=BN, K=K, WAIT=PDL_WAIT),
                   max(1, min(s.SAMU_WARPS, BN // 32)))
        scratch = {"xc": "*fp32", "NI": "i32"}   # RG-LRU's phase-1 outputs are fp32
        for BH in (16, 32, 64, 128, 256):
            yield (s._rglru_step_gates, (), dict(BB=s.STEP_ROWS, BH=BH, ROWS=s.GATE_ROWS, K=K), s.RGLRU_WARPS,
                   scratch)
        for MATH in (1, 2):
            yield (s._rglru_step_update, ("c",), dict(BB=s.STEP_ROWS, BC=s.UPDATE_CHANNELS, MATH=MATH, K=K),
                   s.UPDATE_WARPS, scratch)
    # decoding's one-row products: every prologue with the tiles it takes (the 400m preset's four products),
    # with and without the residual, launched as on sm_90 (PDL; SAMU's step above too)
    rows = {**{n: "*bf16" for n in ("w", "b", "x", "res", "nw", "y")}, "K": "i32"}
    for pro, N, K in ((rp.PLAIN, 1664, 1664), (rp.GEGLU, 1664, 4992), (rp.NORM, 3328, 1664), (rp.NORM, 9984, 1664)):
        BN, BK = rp.tiles(N, K, pro)
        for res in (False, True):
            KP = next_power_of_2(K) if pro == rp.NORM else 1   # as row_product, which passes None for absent pointers
            absent = {n: None for n, there in (("res", res), ("nw", pro == rp.NORM)) if not there}
            yield (rp._row_product, ("eps",), dict(BN=BN, BK=BK, KP=KP, PRO=pro, HAS_RES=res, WAIT=PDL_WAIT, **absent),
                   rp.WARPS, {**rows, **{n: "constexpr" for n in absent}})
    # SAMU's sequence-parallel correction (float64 sums and turns)
    sums = {"mass": "*fp64", "drift": "*fp64", "omega": "*fp64", "n_ttiles": "i32", "n_ntiles": "i32"}
    yield sh._shift_fwd, (), dict(BT=sh.BT, BN=sh.BN), 4, {**sums, "y0": "*bf16"}
    yield sh._shift_bwd, (), dict(BT=sh.BT, BN=sh.BN), 4, sums
    # the clipped AdamW step (int64 tables of offsets and float64 bits)
    tables = {"table": "*i64", "chunks": "*i64", "C": "i32"}
    yield aw._sum_squares, (), dict(BLOCK=aw.BLOCK, PASSES=aw.PASSES), aw.WARPS, tables
    yield aw._clip, ("max_norm",), dict(BLOCK=aw.BLOCK), aw.WARPS, tables
    yield aw._adamw, (), dict(BLOCK=aw.BLOCK, PASSES=aw.PASSES), aw.WARPS, tables


def compile_all(part: int = 0, parts: int = 1):
    """Compile every ``parts``-th case from ``part`` on (the test splits them over processes)."""
    for i, (fn, floats, constexprs, warps, *types) in enumerate(_cases()):   # each with the warps it launches with
        if i % parts == part:
            source = ASTSource(fn=fn, signature=_signature(fn, floats, *types), constexprs=constexprs)
            triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    print("compiled")


def _in_children(calls, timeout):
    """Run each Python statement in its own child process, all at once (compiling is CPU-bound and a CI
    machine has cores to spare while pytest runs one test), outside the interpreter: this process decorated
    the kernels for the interpreter (conftest), which cannot compile. Asserts every child printed "compiled"."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    root = Path(__file__).resolve().parents[2]
    children = [subprocess.Popen([sys.executable, "-c", call], cwd=root, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for call in calls]
    deadline = time.monotonic() + timeout
    try:
        for call, child in zip(calls, children):
            out, err = child.communicate(timeout=max(1.0, deadline - time.monotonic()))
            assert child.returncode == 0 and "compiled" in out, (call, err[-3000:])
    finally:
        for child in children:
            child.kill()
            child.wait()


def test_fused_kernels_compile_for_sm90():
    _in_children([f"from tests.ops.test_offline_compile import compile_all; compile_all({i}, 2)" for i in range(2)],
                 timeout=300)


def test_mixer_kernels_compile_for_sm90():
    """Every kernel one SAMU and one RG-LRU variant launch, unpacked and packed, with and without states
    (tests/sm90.py): the interpreter does not check what the compiler does (a loop-carried name whose type
    changes broke a packed kernel on the GPU alone)."""
    _in_children([f"from tests.sm90 import compile_mixers; compile_mixers({op!r})" for op in ("samu", "rglru")],
                 timeout=900)
