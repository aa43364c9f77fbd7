"""RMSNorm + RecurrentBlock forward + backward on the GPU: in a CUDA graph and eagerly, with the fused
glue and with the PyTorch-op glue, against the block's two projection GEMMs alone (forward + backward).

bf16 autocast over fp32 parameters, as in training. Writes $OUT/block.json row by row and prints a table.
Usage: python scripts/gpu_block.py [--shapes "4,2048,2048;1,32768,2048"] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from gpu_profile import graph_time, host_time, kernel_table  # noqa: E402

from samu.environment import environment  # noqa: E402
from samu.modules import RecurrentBlock, RMSNorm  # noqa: E402
from samu.ops.checks import set_check_finite  # noqa: E402


def case(op, shape, glue):
    B, L, D = shape
    torch.manual_seed(0)
    norm = RMSNorm(D, device="cuda")
    block = RecurrentBlock(D, mixer=op, device="cuda")
    if glue == "torch":
        block.glue_backend = "torch"
    x = torch.randn(B, L, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(B, L, D, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(B, L, block.lru_width, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dz = torch.randn(B, L, 2 * block.lru_width, device="cuda", dtype=torch.bfloat16)
    params = [*norm.parameters(), *block.parameters()]
    proj = [block.linear_in.weight, block.linear_in.bias, block.linear_out.weight, block.linear_out.bias]

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = block(norm(x))[0]
        y.backward(dy)

    def gemms():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            z, out = block.linear_in(x), block.linear_out(g)
        torch.autograd.backward([z, out], [dz, dy])

    leaves = [x, g, *params]
    return step, gemms, leaves


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4,2048,2048;1,32768,2048;1,8192,1024")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--profile", action="store_true",
                    help="per-kernel CUDA time of each case instead of the timings (block_kernels.json)")
    args = ap.parse_args()
    set_check_finite(False)
    shapes = [tuple(int(v) for v in s.split(",")) for s in args.shapes.split(";")]
    record = {"env": environment("cuda"), "command": "python scripts/gpu_block.py " + " ".join(sys.argv[1:]),
              "rows": []}
    path = os.path.join(args.out, "block.json")
    if args.profile:
        path = os.path.join(args.out, "block_kernels.json")
        for shape in shapes:
            for op in ("samu", "rglru"):
                step, _, leaves = case(op, shape, "fused")
                table = kernel_table(step, leaves)
                record["rows"].append({"op": op, "shape": list(shape), "glue": "fused",
                                       "kernels": [{"name": n, "calls": c, "us": t} for n, c, t in table]})
                print(f"== {op} {shape}: {sum(t for _, _, t in table) / 1e3:.3f} ms of kernels")
                for n, c, t in table[:14]:
                    print(f"{t:9.1f} us  x{c:<3} {n}")
                with open(path, "w") as f:
                    json.dump(record, f, indent=1)
        return
    for shape in shapes:
        for op in ("samu", "rglru"):
            gemm_ms = None
            for glue in ("fused", "torch"):
                step, gemms, leaves = case(op, shape, glue)
                row = {"op": op, "shape": list(shape), "glue": glue}
                try:
                    row["eager_ms"] = host_time(step, leaves, iters=30, warmup=3, until_done=True)
                    row["graph_ms"] = graph_time(step, leaves)
                    if gemm_ms is None:
                        gemm_ms = graph_time(gemms, leaves)
                    row["gemm_graph_ms"] = gemm_ms
                    row["graph_over_gemm"] = row["graph_ms"] / gemm_ms
                    row["eager_over_graph"] = row["eager_ms"] / row["graph_ms"]
                except Exception as err:  # noqa: BLE001
                    row["error"] = f"{type(err).__name__}: {err}"[:500]
                record["rows"].append(row)
                with open(path, "w") as f:
                    json.dump(record, f, indent=1)
                del step, gemms, leaves
                torch.cuda.empty_cache()
    print(f"{'op':6} {'shape':16} {'glue':6} {'eager':>8} {'graph':>8} {'gemm':>8} {'g/gemm':>7} {'e/g':>5}")
    for r in record["rows"]:
        if "error" in r:
            print(r["op"], r["shape"], r["glue"], r["error"][:200])
            continue
        print(f"{r['op']:6} {'x'.join(map(str, r['shape'])):16} {r['glue']:6} {r['eager_ms']:8.3f} "
              f"{r['graph_ms']:8.3f} {r['gemm_graph_ms']:8.3f} {r['graph_over_gemm']:7.2f} {r['eager_over_graph']:5.2f}")


if __name__ == "__main__":
    main()
