"""Development run of the SAMU Triton kernels on a GPU: correctness per config, then timings.

Usage: python scripts/gpu_samu.py [--out DIR] [--quick]
Writes samu_dev.json under --out (default $OUT or .) and prints a table last.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import traceback

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import samu  # noqa: E402
from samu.bench.timing import copy_bandwidth, peak_memory  # noqa: E402
from samu.ops.samu.function import Config, grouped_config, run  # noqa: E402
from tests.helpers import gate_check, randn, rel_err, samu_params  # noqa: E402

SHAPES = [(1, 8192, 1024), (4, 2048, 2048), (2, 4096, 2560), (1, 32768, 1024), (1, 32768, 2048)]
# G = 0: the grouped variant's group size for each shape (about sqrt(#chunks))
# (K, BN, G, warps, slots_per_sm, unroll[, main_BN])
CONFIGS = [Config(32, 64, 0, 1, 16, 2), Config(32, 64, 0, 1, 16, 1), Config(32, 64, 0, 1, 32, 2),
           Config(32, 64, 0, 1, 16, 4), Config(32, 32, 0, 1, 32, 1), Config(32, 32, 0, 1, 32, 2),
           Config(16, 64, 0, 1, 16, 2), Config(32, 128, 0, 2, 16, 2), Config(64, 64, 0, 1, 16, 2),
           Config(32, 64, 1, 1, 16, 2)]


def check(config):
    """fp32 outputs and gradients against the float64 torch path at a mid-size shape."""
    B, L, D = 2, 1000, 256
    if config.G == 0:
        config = dataclasses.replace(config, G=4)
    x = randn((B, L, D), 0, device="cuda")
    params = samu_params(D, 1, device="cuda")
    h0 = randn((B, D), 2, device="cuda")
    gy = torch.randn(B, L, D, device="cuda")
    gh = torch.randn(B, D, device="cuda")
    y, h = run(x, *params, h0, 2.0, config)
    got = [y, h, *torch.autograd.grad((y * gy).sum() + (h * gh).sum(), [x, h0, *params])]
    wide = [t.detach().double().requires_grad_() for t in (x, h0, *params)]
    yr, hr = samu.samu_mixer(wide[0], *wide[2:], initial_state=wide[1], output_final_state=True, backend="torch")
    ref = [yr, hr, *torch.autograd.grad((yr * gy).sum() + (hr * gh).sum(), wide)]
    return max(rel_err(a, b) for a, b in zip(got, ref))


def time_shape(config, shape, dtype=torch.bfloat16):
    B, L, D = shape
    if config.G == 0:
        config = dataclasses.replace(config, G=grouped_config(B, L, D).G)
    x = randn(shape, 3, device="cuda", dtype=dtype)
    params = samu_params(D, 4, device="cuda")
    dy = torch.randn(shape, device="cuda", dtype=dtype)
    fwd_ms = triton.testing.do_bench(lambda: run(x, *params, None, 2.0, config), warmup=25, rep=100,
                                     return_mode="median")

    def fb():
        y, _ = run(x, *params, None, 2.0, config)
        y.backward(dy)

    fb_ms = triton.testing.do_bench(fb, warmup=25, rep=100, grad_to_none=[x, *params], return_mode="median")
    for t in (x, *params):
        t.grad = None
    return fwd_ms, fb_ms, peak_memory(fb, "cuda")["peak_alloc"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--configs", help="K,BN,G,warps,slots_per_sm[,unroll (default 2)[,main_BN (default 0: BN)]];... "
                    "with G=0 for the grouped default (default: the built-in sweep)")
    ap.add_argument("--shapes", help="B,L,D;... (default: the primary shapes)")
    ap.add_argument("--no-gates", action="store_true")
    ap.add_argument("--gate-variants", default="triton_serial,triton_grouped")
    args = ap.parse_args()
    samu.set_check_finite(False)
    global SHAPES, CONFIGS
    if args.configs:
        CONFIGS = [Config(*(int(v) for v in c.split(","))) for c in args.configs.split(";")]
    if args.shapes:
        SHAPES = [tuple(int(v) for v in c.split(",")) for c in args.shapes.split(";")]
    t0 = time.time()
    bw = copy_bandwidth("cuda")["bytes_per_s"]
    record = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "copy_bandwidth_Bps": bw, "configs": [], "gates": []}
    print(f"{record['gpu']} torch {torch.__version__} triton {triton.__version__} copy {bw / 1e12:.2f} TB/s",
          flush=True)
    for dtype in (() if args.no_gates else (torch.float32, torch.bfloat16)):
        for name in args.gate_variants.split(","):
            try:
                v = gate_check("samu", lambda *a, **k: samu.samu_mixer(*a, backend=name, **k), dtype,
                               1, 4096, 1024, seed=5, device="cuda")
                res = {q: (v["errors"][q], v["thresholds"][q]) for q in v["passed"]}
                record["gates"].append({"variant": name, "dtype": str(dtype), "pass": v["pass"], "errors": res})
                print(f"gate {name} {dtype}: {'PASS' if v['pass'] else 'FAIL'} "
                      + " ".join(f"{k}={e:.1e}/{t:.1e}" if e is not None and t is not None else f"{k}=inf"
                                 for k, (e, t) in res.items()), flush=True)
            except Exception:
                record["gates"].append({"variant": name, "dtype": str(dtype), "error": traceback.format_exc()})
                print(f"gate {name} {dtype}: ERROR\n{traceback.format_exc()}", flush=True)
    configs = CONFIGS[:3] if args.quick else CONFIGS
    rows = []
    for config in configs:
        entry = {"config": config.__dict__}
        try:
            entry["max_rel_err_fp32"] = check(config)
            entry["times"] = {}
            for shape in SHAPES:
                fwd_ms, fb_ms, peak = time_shape(config, shape)
                B, L, D = shape
                floor_fb = 10 * B * L * D / bw * 1e3
                entry["times"][str(shape)] = {"fwd_ms": fwd_ms, "fb_ms": fb_ms, "peak_bytes": peak,
                                              "floor_fb_ms": floor_fb}
                rows.append((str(config.__dict__), str(shape), fwd_ms, fb_ms, fb_ms / floor_fb,
                             peak / (4 * B * L * D)))
                print(f"{config} {shape}: fwd {fwd_ms:.3f} ms, fb {fb_ms:.3f} ms ({fb_ms / floor_fb:.2f}x floor), "
                      f"peak {peak / 2**20:.0f} MiB", flush=True)
        except Exception:
            entry["error"] = traceback.format_exc()
            print(f"{config}: ERROR\n{entry['error']}", flush=True)
        record["configs"].append(entry)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "samu_dev.json"), "w") as f:
        json.dump(record, f, indent=1)
    print(f"\n{'config':48s} {'shape':20s} {'fwd ms':>8s} {'fb ms':>8s} {'xfloor':>7s} {'peak/(y+dx)':>11s}")
    for r in rows:
        print(f"{r[0]:48s} {r[1]:20s} {r[2]:8.3f} {r[3]:8.3f} {r[4]:7.2f} {r[5]:11.2f}")
    print(f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
