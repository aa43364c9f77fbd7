"""The block glue's tiles (samu.ops.glue_triton BL, BE; BWD_BL, BWD_BE, ROWS) swept on the GPU: each kernel alone in a
CUDA graph, forward and backward, bf16, Conv1D width 4, against its bytes at the measured copy bandwidth.

The backward's weight gradient is a per-program partial sum, so its tiles change its bits (each setting is
deterministic on its own); the tests pass at any tiles. Writes $OUT/glue_sweep.json and prints a table.
Usage: python scripts/gpu_glue_sweep.py [--shapes "4,2048,2048;1,32768,2048"] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from gpu_profile import graph_time  # noqa: E402

from samu.environment import environment  # noqa: E402
from samu.bench.timing import copy_bandwidth  # noqa: E402
from samu.ops import glue_triton  # noqa: E402

CURRENT = (glue_triton.BL, glue_triton.BE, glue_triton.BWD_BL, glue_triton.BWD_BE, glue_triton.ROWS)

K = 4
# (BL, BE) pairs whose five [BL, BE] fp32 accumulators fit the registers of 4 warps, and rows per program
TILES = ((16, 64), (16, 128), (16, 256), (32, 64), (32, 128))
ROWS = (256, 512, 1024)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--shapes", default="4,2048,2048;1,32768,2048")
    args = ap.parse_args()
    bw = copy_bandwidth("cuda")["bytes_per_s"]
    record = {"env": environment(torch.device("cuda")), "command": " ".join(sys.argv), "copy_bandwidth": bw, "rows": []}
    for shape in args.shapes.split(";"):
        B, L, E = (int(v) for v in shape.split(","))
        z = torch.randn(B, L, 2 * E, device="cuda", dtype=torch.bfloat16)
        w, bias = torch.randn(K, E, device="cuda") * 0.3, torch.randn(E, device="cuda")
        dxc, da = (torch.randn(B, L, E, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        elt = 2 * B * L * E   # bytes of one [B, L, E] bf16 tensor
        floors = {"fwd": 4 * elt / bw * 1e3, "bwd": 6 * elt / bw * 1e3}   # fwd: z in, x_c, a out; bwd: dx_c, da, z in, dz out
        for BL, BE in TILES:
            glue_triton.BL, glue_triton.BE = glue_triton.BWD_BL, glue_triton.BWD_BE = BL, BE
            ms = graph_time(lambda: glue_triton.conv_gelu_fwd(z, w, bias, None), [])
            record["rows"].append(dict(shape=[B, L, E], kernel="fwd", BL=BL, BE=BE, ms=ms, floor_ms=floors["fwd"]))
            for rows in ROWS:
                glue_triton.ROWS = rows
                ms = graph_time(lambda: glue_triton.conv_gelu_bwd(dxc, da, z, w, None), [])
                record["rows"].append(dict(shape=[B, L, E], kernel="bwd", BL=BL, BE=BE, ROWS=rows, ms=ms,
                                           floor_ms=floors["bwd"]))
            with open(os.path.join(args.out, "glue_sweep.json"), "w") as f:
                json.dump(record, f, indent=1)
    for shape in {tuple(r["shape"]) for r in record["rows"]}:
        for kernel in ("fwd", "bwd"):
            rows = sorted((r for r in record["rows"] if tuple(r["shape"]) == shape and r["kernel"] == kernel),
                          key=lambda r: r["ms"])
            for r in rows[:4]:
                tiles = ", ".join(f"{k}={r[k]}" for k in ("BL", "BE", "ROWS") if k in r)
                print(f"{shape} {kernel}: {r['ms']:.3f} ms ({r['ms'] / r['floor_ms']:.2f}x floor)  {tiles}")
    print("committed tiles: forward BL={}, BE={}; backward BL={}, BE={}, ROWS={}".format(*CURRENT))


if __name__ == "__main__":
    main()
