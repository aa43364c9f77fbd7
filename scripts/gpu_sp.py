"""Sequence parallelism against one GPU (issue 16): one rank per GPU under torchrun.

    torchrun --standalone --nproc-per-node P scripts/gpu_sp.py --out DIR [--ops samu,rglru] [--length 262144]
        [--width 2048] [--dtype bfloat16] [--reps 10] [--longest] [--device cuda]

* mixer: each rank holds L / P tokens of one (1, L, D) sequence and times the sequence-parallel mixer's
  forward + backward (samu.ops.sequence_parallel; with P = 1 the plain mixer on the whole sequence), the
  slowest rank's time of each repetition (CUDA events; a barrier before each), medians.
* --longest: the longest sequence one RecurrentBlock layer (width D, its mixer split the same way) trains
  on, forward + backward: L doubles from 8,192 until a rank runs out of memory (every rank stops together).

Writes DIR/sp_<P>.json (the rows and the environment) and prints a table; compare the P = 1 and P = 2 files.
On the CPU (--device cpu, gloo) it runs as a dry run of the same code at small sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from samu.environment import environment  # noqa: E402
from samu.modules import RecurrentBlock, RGLRUMixer, SAMUMixer  # noqa: E402


def shard(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """This rank's part of a [B, L, ...] tensor along L (equal parts)."""
    size = t.shape[1] // world
    return t[:, rank * size:(rank + 1) * size].contiguous()


def mixer_call(op: str, width: int, device, world: int):
    """A function x -> y of the op's mixer module, sequence-parallel over the world when it has several ranks."""
    torch.manual_seed(0)
    mixer = (SAMUMixer if op == "samu" else RGLRUMixer)(width).to(device)
    group = dist.group.WORLD if world > 1 else None
    return lambda x: mixer(x, group=group)[0]


def slowest(ms: float, device) -> float:
    t = torch.tensor([ms], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def time_fb(call, x, dy, reps: int, device) -> list[float]:
    times = []
    for i in range(reps + 3):
        dist.barrier()
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        x.grad = None
        call(x).backward(dy)
        if device.type == "cuda":
            end.record()
            torch.cuda.synchronize()
            ms = start.elapsed_time(end)
        else:
            ms = (time.perf_counter() - t0) * 1e3
        if i >= 3:   # warm-ups: compilation and autotuning
            times.append(slowest(ms, device))
    return times


def longest(width: int, dtype, device, rank: int, world: int, limit: int) -> int:
    """The longest L (doubling from 8,192) that one block trains on with its sequence split over the world."""
    torch.manual_seed(0)
    block = RecurrentBlock(width, mixer="samu").to(device)
    if world > 1:
        block.sequence_parallel = dist.group.WORLD
    best, L = 0, 8192
    while L <= limit:
        fits = 1.0
        try:
            u = torch.randn(1, L // world, width, device=device, dtype=dtype, requires_grad=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
                out = block(u)[0]
            out.float().square().mean().backward()
            del u, out
        except torch.OutOfMemoryError:
            fits = 0.0
        block.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        t = torch.tensor([fits], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        if not float(t):
            break
        best, L = L, 2 * L
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--ops", default="samu,rglru")
    ap.add_argument("--length", type=int, default=262144)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--longest", action="store_true")
    ap.add_argument("--limit", type=int, default=8 * 2**20, help="the longest L --longest tries")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = getattr(torch, args.dtype)
    record = {"env": environment(device), "world": world, "length": args.length, "width": args.width,
              "dtype": args.dtype, "rows": []}
    for op in args.ops.split(","):
        call = mixer_call(op, args.width, device, world)
        g = torch.Generator(device=device).manual_seed(1)
        x = shard(torch.randn(1, args.length, args.width, device=device, dtype=dtype, generator=g), rank, world)
        dy = shard(torch.randn(1, args.length, args.width, device=device, dtype=dtype, generator=g), rank, world)
        x.requires_grad_()
        times = time_fb(call, x, dy, args.reps, device)
        row = {"scope": "mixer", "op": op, "fb_ms": statistics.median(times), "samples_ms": times}
        record["rows"].append(row)
        if rank == 0:
            print(f"{op} L={args.length} D={args.width} on {world}: fwd+bwd {row['fb_ms']:.3f} ms", flush=True)
        del x, dy
    if args.longest:
        best = longest(args.width, dtype, device, rank, world, args.limit)
        record["rows"].append({"scope": "longest", "op": "samu", "block_L": best})
        if rank == 0:
            print(f"longest block fwd+bwd on {world}: L = {best}", flush=True)
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, f"sp_{world}.json")
        with open(path, "w") as f:
            json.dump(record, f, indent=1)
        print(f"record: {path}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
