"""Registers and stack of decoding's row products as a decode launches them on sm_90 (session 27, no GPU): every
launch of samu.ops.rowprod_triton.row_product at the 400m preset's four products (bf16, with PDL), through
tests/sm90.py's compiler, which specialises each launch as a real one does. At 1 row with and without the L2
prefetch; at 8 and 64 rows with the tiles rows_tiles gives and with other warps and BK at 64 rows.
    TRITON_INTERPRET=0 python results/dev/session27/scripts/rowprod_regs.py \
        > results/dev/session27/offline/rowprod_regs.txt
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../../.."))

import torch  # noqa: E402

from samu.ops import rowprod_triton as rp  # noqa: E402
from tests.sm90 import Compiler  # noqa: E402

W = 1664
bf16 = dict(dtype=torch.bfloat16)


def products(M):
    """(name, x, weight, bias, norm, geglu, residual) of the four products at M rows."""
    x, res = torch.zeros(M, W, **bf16), torch.zeros(M, W, **bf16)
    norm = (torch.ones(W, **bf16), 1e-6)
    return (("in (norm)", x, torch.zeros(2 * W, W, **bf16), torch.zeros(2 * W, **bf16), norm, False, None),
            ("out (+res)", x, torch.zeros(W, W, **bf16), torch.zeros(W, **bf16), None, False, res),
            ("gate_up (norm)", x, torch.zeros(6 * W, W, **bf16), torch.zeros(6 * W, **bf16), norm, False, None),
            ("down (geglu, +res)", torch.zeros(M, 6 * W, **bf16), torch.zeros(W, 3 * W, **bf16), torch.zeros(W, **bf16),
             None, True, res))


def compile_all(M, label):
    compiler = Compiler()
    rp.launch = compiler
    for name, x, w, b, norm, geglu, res in products(M):
        compiler.rows.clear()
        rp.row_product(x, w, b, norm=norm, geglu=geglu, residual=res)
        for row in compiler.rows.values():
            print(f"{label:34} {name:20} warps {row['warps']} regs {row['regs']:3d} stack {row['spills']:3d} "
                  f"shared {row['shared']:6d}")


rp.pdl = lambda device: {"launch_pdl": True}
for prefetch in (False, True):
    rp.PREFETCH = prefetch
    compile_all(1, f"1 row, prefetch {'on' if prefetch else 'off'}")
rp.PREFETCH = False
tiles = rp.rows_tiles
for M in (8, 64):
    compile_all(M, f"{M} rows, rows_tiles {tiles(M, W, W)[:3]}")
for warps, BK in ((8, 64), (4, 128), (8, 128)):
    rp.rows_tiles = lambda M, N, K, warps=warps, BK=BK: (*tiles(M, N, K)[:2], BK, warps)
    compile_all(64, f"64 rows, BK {BK}, {warps} warps")
