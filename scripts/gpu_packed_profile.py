"""Where packing costs time: each mixer's forward + backward per kernel, unpacked and packed into N sequences
(the packed bench's offsets), in a CUDA graph and eagerly, side by side.

Usage: python scripts/gpu_packed_profile.py [--shape 1,32768,2048] [--documents 16,256] [--out DIR]
Writes DIR/packed_profile.json and prints a per-kernel table for each case.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from gpu_profile import graph_time, host_time, kernel_table, make, registers  # noqa: E402

from samu.environment import environment  # noqa: E402

BACKENDS = {"samu": "triton_grouped", "rglru": "triton_chunked"}


def case(op, shape, documents):
    """(forward + backward, leaves) of the op's variant, packed into ``documents`` sequences (0: unpacked)."""
    _, step, leaves = make(op, shape, BACKENDS[op], documents=documents)
    return step, leaves


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="1,32768,2048")
    ap.add_argument("--documents", default="16,256")
    ap.add_argument("--ops", default="samu,rglru")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    shape = tuple(int(s) for s in args.shape.split(","))
    record = {"env": environment("cuda"), "shape": shape, "rows": []}
    path = os.path.join(args.out, "packed_profile.json")
    for op in args.ops.split(","):
        for n in [0] + [int(s) for s in args.documents.split(",")]:
            step, leaves = case(op, shape, n)
            kernels = kernel_table(step, leaves)
            try:
                graph = graph_time(step, leaves)
            except (RuntimeError, ValueError) as e:  # a capture that fails is reported, not fatal
                print(f"{op} documents={n}: no graph: {e}".splitlines()[0])
                graph = float("nan")
            row = {"op": op, "documents": n, "graph_ms": graph,
                   "eager_ms": host_time(step, leaves, until_done=True), "kernels": kernels}
            record["rows"].append(row)
            with open(path, "w") as f:
                json.dump(record, f, indent=1)
            print(f"== {op} documents={n}: graph {row['graph_ms']:.3f} ms, eager {row['eager_ms']:.3f} ms")
            for name, count, us in kernels:
                print(f"   {us:9.1f} us  x{count:<3d} {name}")
    # every compiled form of each kernel (packed and not): registers, spills, warps, shared memory
    record["registers"] = registers([f"samu.ops.{op}.triton_{part}" for op in ("samu", "rglru")
                                     for part in ("fwd", "bwd")])
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
    for name, regs, spills, warps, shared in record["registers"]:
        print(f"   regs {regs} spills {spills} warps {warps} shared {shared}  {name}")


if __name__ == "__main__":
    main()
