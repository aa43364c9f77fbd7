"""Where the time goes: per-kernel CUDA time, CUDA-graph replay time, host launch time, registers.

Usage: python scripts/gpu_profile.py [--op samu|rglru] [--backend NAME] [--shapes "B,L,D;..."] [--dtype NAME]
                                     [--out DIR]

Writes DIR/profile_<op>_<backend>.json (the environment, the command, per shape the times and the kernel
table, and the registers of every kernel compiled).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import samu  # noqa: E402
from samu.environment import environment  # noqa: E402
from samu.gates.inputs import document_offsets  # noqa: E402
from tests.helpers import randn, rglru_params, samu_params  # noqa: E402


def make(op, shape, backend, dtype=torch.bfloat16, documents=0):
    """(forward, forward + backward, leaves) of one mixer call on fresh inputs; ``documents`` > 0 packs the row into
    that many sequences (samu.gates.inputs.document_offsets(L, documents, 1), the offsets as ints, as `samu train`
    passes them)."""
    B, L, D = shape
    cu_seqlens = document_offsets(L, documents, 1) if documents else None
    x = randn(shape, 0, device="cuda", dtype=dtype)
    params = samu_params(D, 1, device="cuda") if op == "samu" else rglru_params(D, 16, 1, device="cuda")
    dy = torch.randn(shape, device="cuda", dtype=dtype)
    fn = samu.samu_mixer if op == "samu" else samu.rglru_mixer

    def fwd():
        return fn(x, *params, backend=backend, cu_seqlens=cu_seqlens)[0]

    def fb():
        y = fwd()
        y.backward(dy)

    return fwd, fb, [x, *params]


def graph_time(step, leaves, iters=50, per_replay=1):
    """Median-free mean time of one step in a captured graph replay (no host launch overhead); a graph of
    per_replay steps for steps of a few microseconds, whose replay alone would cost as much."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
            for t in leaves:
                t.grad = None
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(per_replay):
            step()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (iters * per_replay)


def host_time(step, leaves, iters=50, warmup=0, until_done=False):
    """Mean ms per back-to-back eager call: the host's launch time, or with ``until_done`` the wall time
    until the GPU finishes (host cost shows where it exceeds the kernels)."""
    for _ in range(warmup):
        step()
        for t in leaves:
            t.grad = None
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
        for t in leaves:
            t.grad = None
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return ((time.perf_counter() if until_done else t1) - t0) / iters * 1e3


def kernel_table(step, leaves):
    for _ in range(3):
        step()
        for t in leaves:
            t.grad = None
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
            for t in leaves:
                t.grad = None
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        if e.device_time_total > 0:
            rows.append((e.key[:60], e.count // 5, e.device_time_total / 5))
    return sorted(rows, key=lambda r: -r[2])


def registers(module_names):
    out = []
    for name in module_names:
        mod = sys.modules.get(name)
        if mod is None:
            continue
        for attr in dir(mod):
            fn = getattr(mod, attr)
            caches = getattr(fn, "device_caches", None)
            if not caches:
                continue
            for dev_cache in caches.values():
                for compiled in dev_cache[0].values():
                    out.append((attr, getattr(compiled, "n_regs", None), getattr(compiled, "n_spills", None),
                                compiled.metadata.num_warps, compiled.metadata.shared))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", default="samu")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--shapes", default="1,8192,1024;1,32768,2048")
    ap.add_argument("--backend", default="triton_grouped")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    samu.set_check_finite(False)
    shapes = [tuple(int(v) for v in s.split(",")) for s in args.shapes.split(";")]
    record = []
    for shape in shapes:
        print(samu.dispatch.explain(shape, args.op, dtype=dtype, backend=args.backend), flush=True)
        fwd, fb, leaves = make(args.op, shape, args.backend, dtype=dtype)
        entry = {"shape": shape, "dtype": args.dtype}
        entry["fwd_graph_ms"] = graph_time(fwd, leaves)
        entry["fb_graph_ms"] = graph_time(fb, leaves)
        entry["fb_host_ms"] = host_time(fb, leaves)
        entry["fb_bench_ms"] = triton.testing.do_bench(fb, grad_to_none=leaves, return_mode="median")
        entry["kernels"] = kernel_table(fb, leaves)
        record.append(entry)
        print(f"{shape}: fwd graph {entry['fwd_graph_ms']:.3f} ms, fb graph {entry['fb_graph_ms']:.3f} ms, "
              f"fb host-side {entry['fb_host_ms']:.3f} ms, fb do_bench {entry['fb_bench_ms']:.3f} ms", flush=True)
        for name, count, us in entry["kernels"]:
            print(f"    {us:9.1f} us  x{count:<3d} {name}")
    regs = registers([f"samu.ops.{args.op}.triton_fwd", f"samu.ops.{args.op}.triton_bwd"])
    for r in regs:
        print(f"  {r[0]:28s} regs {r[1]} spills {r[2]} warps {r[3]} smem {r[4]}")
    with open(os.path.join(args.out, f"profile_{args.op}_{args.backend}.json"), "w") as f:
        json.dump({"env": environment("cuda"), "command": " ".join(sys.argv), "op": args.op, "backend": args.backend,
                   "rows": record, "registers": regs}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
