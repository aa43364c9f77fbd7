"""Where an eager mixer call's host time goes (issues 10, 12, 13: host cost of a fwd+bwd <= 0.1 ms).

Usage: python scripts/gpu_host.py [--out DIR] [--shape 1,8192,1024]

For each mixer at the shape (bf16, backend auto): the host time of a back-to-back eager fwd+bwd with
the parameter finiteness check off and on, with samu's cached launches and with Triton's own (5 rounds
each, interleaved; medians), the CUDA-graph time beside it, and a cProfile of 30 calls (top functions
by own time and by cumulative time, written to host_<op>.txt). Then the cost of one launch of a
16-argument kernel through ``kernel[grid](...)``, through samu's cached ``launch`` and through the
compiled kernel's launcher (with the tensors, and with their addresses), and of one ``torch.empty``.
Writes host.json and host_<op>.txt under DIR.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

import samu  # noqa: E402
from gpu_profile import graph_time, host_time, make  # noqa: E402
from samu.ops import triton_utils  # noqa: E402


@triton.jit
def _noop(p0, p1, p2, p3, p4, p5, p6, p7, n0, n1, n2, n3, n4, n5, f0, BLOCK: tl.constexpr):
    if n0 < 0:  # never true: the kernel does nothing, only its launch is timed
        tl.store(p0 + tl.arange(0, BLOCK), tl.load(p1 + tl.arange(0, BLOCK)) * f0)


def per_call_us(fn, n=2000):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def launch_costs():
    ts = [torch.empty(1024, device="cuda") for _ in range(8)]
    ints = (8192, 1024, 512, 32, 256, 7)
    grid = (64, 2, 1)
    compiled = _noop[grid](*ts, *ints, 1.5, BLOCK=128)
    args = (*ts, *ints, 1.5, 128)
    device = torch.cuda.current_device()
    run = compiled.run

    def direct():
        stream = torch.cuda.current_stream(device).cuda_stream
        run(64, 2, 1, stream, compiled.function, compiled.packed_metadata, None, None, None, *args)

    def direct_addresses():
        stream = torch.cuda.current_stream(device).cuda_stream
        run(64, 2, 1, stream, compiled.function, compiled.packed_metadata, None, None, None,
            *[t.data_ptr() for t in ts], *args[len(ts):])

    return {
        "jit_launch_us": per_call_us(lambda: _noop[grid](*ts, *ints, 1.5, BLOCK=128)),
        "jit_launch_kw_us": per_call_us(lambda: _noop[grid](p0=ts[0], p1=ts[1], p2=ts[2], p3=ts[3], p4=ts[4],
                                                            p5=ts[5], p6=ts[6], p7=ts[7], n0=8192, n1=1024,
                                                            n2=512, n3=32, n4=256, n5=7, f0=1.5, BLOCK=128)),
        "direct_launch_us": per_call_us(direct),
        "direct_launch_addresses_us": per_call_us(direct_addresses),
        "samu_launch_us": per_call_us(lambda: triton_utils.launch(_noop, grid, *ts, *ints, 1.5, BLOCK=128)),
        "torch_empty_us": per_call_us(lambda: torch.empty(4, 8192, 1024, device="cuda", dtype=torch.bfloat16)),
        "torch_zeros_us": per_call_us(lambda: torch.zeros(4, 1024, device="cuda")),
    }


def profile_text(fb, leaves, calls=30):
    for _ in range(3):
        fb()
        for t in leaves:
            t.grad = None
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fb()
        for t in leaves:
            t.grad = None
    prof.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    out.write(f"# cProfile of {calls} eager fwd+bwd calls: by own time\n")
    stats.sort_stats("tottime").print_stats(35)
    out.write("\n# by cumulative time\n")
    stats.sort_stats("cumulative").print_stats(45)
    return out.getvalue()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--shape", default="1,8192,1024")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    shape = tuple(int(v) for v in args.shape.split(","))
    record = {"shape": shape, "launch": launch_costs(), "ops": {}}
    for op in ("samu", "rglru"):
        fwd, fb, leaves = make(op, shape, "auto")
        samu.set_check_finite(True)
        entry = {"fb_host_ms_check_on": host_time(fb, leaves, warmup=3)}
        # after the first calls, which gate a class no record covers
        entry["choice"] = samu.dispatch.explain(shape, op, backend="auto")
        samu.set_check_finite(False)
        rounds = {True: [], False: []}
        for _ in range(5):
            for cached in (False, True):
                triton_utils._CACHED_LAUNCH = cached
                rounds[cached].append(host_time(fb, leaves, warmup=3))
        triton_utils._CACHED_LAUNCH = True
        entry["fb_host_ms_triton_launch"] = sorted(rounds[False])[2]
        entry["fb_host_ms"] = sorted(rounds[True])[2]
        entry["fwd_host_ms"] = host_time(fwd, leaves, warmup=3)
        entry["fb_graph_ms"] = graph_time(fb, leaves)
        text = profile_text(fb, leaves)
        with open(os.path.join(args.out, f"host_{op}.txt"), "w") as f:
            f.write(text)
        record["ops"][op] = entry
        print(f"{op} {shape}: fwd+bwd host {entry['fb_host_ms']:.3f} ms (Triton's launches "
              f"{entry['fb_host_ms_triton_launch']:.3f}; check on {entry['fb_host_ms_check_on']:.3f}),"
              f" fwd host {entry['fwd_host_ms']:.3f}, graph {entry['fb_graph_ms']:.3f} ms", flush=True)
    with open(os.path.join(args.out, "host.json"), "w") as f:
        json.dump(record, f, indent=1, default=str)
    for k, v in record["launch"].items():
        print(f"  {k:20s} {v:7.2f} us")


if __name__ == "__main__":
    main()
