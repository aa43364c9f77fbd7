"""Launch settings of the fused block steps at the 400m preset's shapes (warps; RG-LRU gate rows per pass),
each timed alone in a CUDA graph (20 launches per replay, so no host launch cost; their few reads stay in
L2, as in a decode). A setting that fails to launch (shared memory, say) is recorded with its error.

Usage: python scripts/gpu_decode_sweep.py [--out DIR]   writes DIR/decode_sweep.json, prints a table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from gpu_profile import graph_time  # noqa: E402
from samu.environment import environment  # noqa: E402
from samu.ops import step, step_triton  # noqa: E402
from tests.helpers import rglru_params, samu_params  # noqa: E402

D, K_CONV = 1664, 4


def timed(rows, row, fn):
    try:
        row["us"] = graph_time(fn, [], iters=20, per_replay=20) * 1e3
    except Exception as err:   # a setting the GPU cannot launch
        row["error"] = f"{type(err).__name__}: {str(err)[:200]}"
    rows.append(row)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    rows = []
    dev = "cuda"
    saved = step_triton.SAMU_WARPS, step_triton.RGLRU_WARPS, step_triton.GATE_ROWS
    for B in (1, 64):
        z = torch.randn(B, 2 * D, device=dev, dtype=torch.bfloat16)
        cw = (0.3 * torch.randn(K_CONV, D, device=dev)).to(torch.bfloat16)
        cb = torch.zeros(D, device=dev, dtype=torch.bfloat16)
        cs = torch.zeros(B, K_CONV - 1, D, device=dev, dtype=torch.bfloat16)
        h = torch.zeros(B, D, device=dev)
        sp = [p.detach() for p in samu_params(D, 1, device=dev)]
        rp = [p.detach() for p in rglru_params(D, 16, 1, device=dev)]
        for warps in (4, 8, 16):
            step_triton.SAMU_WARPS = warps
            timed(rows, {"kernel": "samu_block_step", "B": B, "warps": warps},
                  lambda: step.samu_block_step(z, cw, cb, cs, *sp, h))
        for warps, gate_rows in itertools.product((4, 8), (32, 64)):
            step_triton.RGLRU_WARPS, step_triton.GATE_ROWS = warps, gate_rows
            timed(rows, {"kernel": "rglru_block_step", "B": B, "warps": warps, "rows": gate_rows},
                  lambda: step.rglru_block_step(z, cw, cb, cs, *rp, h))
        step_triton.SAMU_WARPS, step_triton.RGLRU_WARPS, step_triton.GATE_ROWS = saved
        with open(os.path.join(args.out, "decode_sweep.json"), "w") as f:
            json.dump({"env": environment(torch.device("cuda")), "rows": rows}, f, indent=1)
    for key in sorted({(r["kernel"], r["B"]) for r in rows}):
        best = min((r for r in rows if (r["kernel"], r["B"]) == key and "us" in r), key=lambda r: r["us"])
        cfg = {k: v for k, v in best.items() if k not in ("kernel", "B", "us")}
        failed = sum("error" in r for r in rows if (r["kernel"], r["B"]) == key)
        cfg = {**cfg, **({"settings failed": failed} if failed else {})}
        print(f"{key[0]:18} B={key[1]:3} best {best['us']:7.2f} us  {cfg}")


if __name__ == "__main__":
    main()
