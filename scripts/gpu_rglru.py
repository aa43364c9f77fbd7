"""Development run of the RG-LRU Triton kernels on a GPU: gates, timings, a config sweep, a profile.

The next run after the v2 rewrite (chunk-parallel kernels):
    python scripts/gpu_rglru.py --budget 540 --warm-budget 240 --jobs 14

Usage: python scripts/gpu_rglru.py [--out DIR] [--budget SECONDS] [--jobs N] [--phases LIST]
Phases (default all, in this order): warm (compile every config in parallel worker processes so
the Triton cache serves the rest), gate (spec §7 gates at realistic shapes), time (fwd and
fwd+bwd medians, peak memory, bf16), profile (per-kernel CUDA times of one fwd+bwd).
Writes rglru_dev.json under --out (default $OUT or .) after every item, so a run cut short keeps
what it measured; compile or launch errors are recorded per item, never fatal. Prints a table last.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
import traceback
from dataclasses import asdict, replace

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from samu.bench.timing import copy_bandwidth, peak_memory  # noqa: E402

SHAPES = [(1, 8192, 1024), (4, 2048, 2048), (2, 4096, 2560), (1, 32768, 1024), (1, 32768, 2048)]
# fwd+bwd ms of RG-LRU from torch gate ops + fla chunk_hgrn on an H200 (NOTES.md), for the 20x target
PEER_FB_MS = {(1, 8192, 1024): 3.15, (4, 2048, 2048): 3.61, (2, 4096, 2560): 4.36, (1, 32768, 1024): 9.04,
              (1, 32768, 2048): 13.5}
# head dims 64, 128, 96 and 160 (D = 1024, 2048, 1536, 2560 with 16 heads)
GATE_SHAPES = [(2, 2048, 1024), (1, 8192, 2048), (3, 1000, 1536), (1, 4100, 2560)]
H = 16


def configs():
    from samu.ops.rglru.function import CHUNKED

    base = CHUNKED
    return {
        "chunked": base,
        "chunked_precise": replace(base, fast=False),
        "c_wc8": replace(base, WC=8),
        "c_dx8": replace(base, WC_dx=8),
        "c_t264": replace(base, target_programs=264),
        "c_t1056": replace(base, target_programs=1056),
        "c_k8wc8": replace(base, K=8, WC=8),
    }


# which configs are timed at which shapes (the first two everywhere)
SWEEP_SHAPES = [(1, 8192, 1024), (1, 32768, 2048), (2, 4096, 2560)]


def plan():
    names = list(configs())
    timing = [(n, s) for n in names for s in (SHAPES if n in ("chunked", "chunked_precise") else SWEEP_SHAPES)]
    gates = [(n, s, dt) for n in ("chunked", "chunked_precise") for s in GATE_SHAPES for dt in ("bfloat16", "float32")]
    gates += [(n, GATE_SHAPES[0], "bfloat16") for n in names if n not in ("chunked", "chunked_precise")]
    return timing, gates


def params(D, seed=0, device="cuda"):
    from tests.helpers import rglru_params

    return rglru_params(D, H, seed, device=device)


def run_cfg(cfg, x, ps, h0=None, c=8.0):
    from samu.ops.rglru.function import run

    return run(x, *ps, h0, c, cfg)


# ----------------------------------------------------------------------------------------------
# warm: compile in parallel


def _warm(item):
    """Run one (config, D, dtype, grad, with_state) at a short length with the launch's specialisation."""
    name, D, dtype, grad, with_state = item
    t0 = time.time()
    try:
        import samu.ops.rglru.function  # noqa: F401

        cfg = configs()[name]
        dt = getattr(torch, dtype)
        # lengths are not specialised on (every kernel compiles at any L)
        B, L = 1, 4 * cfg.K * cfg.WC
        x = torch.randn(B, L, D, device="cuda", dtype=dt, requires_grad=grad)
        ps = [p.detach().requires_grad_(grad) for p in params(D)]
        h0 = torch.randn(B, D, device="cuda", requires_grad=grad) if with_state else None
        with torch.set_grad_enabled(grad):
            y, h = run_cfg(cfg, x, ps, h0)
            if grad:
                loss = y.float().sum() + (h.sum() if with_state else 0)
                loss.backward()
        torch.cuda.synchronize()
        return item, time.time() - t0, None
    except Exception as e:  # noqa: BLE001
        return item, time.time() - t0, f"{type(e).__name__}: {str(e)[:800]}"


def warm_items(timing, gates):
    # a backward run compiles the forward too; the gates' runs differ (initial state, final-state cotangent)
    items = set()
    for name, (B, L, D) in timing:
        items.add((name, D, "bfloat16", True, False))
    for name, (B, L, D), dt in gates:
        items.add((name, D, dt, True, True))
    return sorted(items)


# ----------------------------------------------------------------------------------------------
# gate


def gate(name, shape, dtype):
    from tests.helpers import gate_check

    cfg = configs()[name]

    def mixer(x, w_a, b_a, w_x, b_x, a_param, *, initial_state=None, output_final_state=False, c=8.0):
        return run_cfg(cfg, x, [w_a, b_a, w_x, b_x, a_param], initial_state, c)

    B, L, D = shape
    v = gate_check("rglru", mixer, getattr(torch, dtype), B, L, D, H=H, seed=L, device="cuda")
    return {q: {"error": v["errors"][q], "threshold": v["thresholds"][q], "pass": v["passed"][q]} for q in v["passed"]}


# ----------------------------------------------------------------------------------------------
# time


def bf16_inputs(name, shape):
    """The config ``name``, a bf16 x (requiring grad), parameters and a bf16 output cotangent."""
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    return configs()[name], x, params(shape[2], 1), torch.randn(shape, device="cuda", dtype=torch.bfloat16)


def time_one(name, shape, bw):
    import triton

    cfg, x, ps, dy = bf16_inputs(name, shape)

    def fwd():
        with torch.no_grad():
            return run_cfg(cfg, x, ps)

    def fb():
        y, _ = run_cfg(cfg, x, ps)
        y.backward(dy)

    fwd_ms = triton.testing.do_bench(fwd, warmup=20, rep=60, return_mode="median")
    fb_ms = triton.testing.do_bench(fb, warmup=20, rep=60, grad_to_none=[x, *ps], return_mode="median")
    for t in (x, *ps):
        t.grad = None
    peak = peak_memory(fb, "cuda")["peak_alloc"]
    nbytes = x.numel() * x.element_size()
    floor_fb_ms = 5 * nbytes / bw * 1e3
    floor_f_ms = 2 * nbytes / bw * 1e3
    return {"fwd_ms": fwd_ms, "fb_ms": fb_ms, "floor_fwd_ms": floor_f_ms, "floor_fb_ms": floor_fb_ms,
            "fb_over_floor": fb_ms / floor_fb_ms, "fwd_over_floor": fwd_ms / floor_f_ms,
            "peak_alloc_bytes": peak, "peak_over_y_dx": peak / (2 * nbytes),
            "speedup_vs_torch_fla": PEER_FB_MS.get(shape, float("nan")) / fb_ms}


def profile(name, shape):
    from torch.profiler import ProfilerActivity, profile as prof

    cfg, x, ps, dy = bf16_inputs(name, shape)
    for _ in range(3):
        y, _ = run_cfg(cfg, x, ps)
        y.backward(dy)
    torch.cuda.synchronize()
    with prof(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(5):
            y, _ = run_cfg(cfg, x, ps)
            y.backward(dy)
        torch.cuda.synchronize()
    rows = []
    for e in p.key_averages():
        us = getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0)
        if us > 0:
            rows.append({"kernel": e.key[:90], "us_per_iter": us / 5, "calls_per_iter": e.count / 5})
    rows.sort(key=lambda r: -r["us_per_iter"])
    return rows[:14]


def compiled_kernels():
    """Registers, spills and shared memory of every RG-LRU kernel compiled in this process."""
    import samu.ops.rglru.triton_bwd as bwd
    import samu.ops.rglru.triton_fwd as fwd

    out = []
    for mod in (fwd, bwd):
        for attr in dir(mod):
            for cache in getattr(getattr(mod, attr), "device_caches", {}).values():
                for compiled in cache[0].values():
                    out.append({"kernel": attr, "regs": getattr(compiled, "n_regs", None),
                                "spills": getattr(compiled, "n_spills", None), "warps": compiled.metadata.num_warps,
                                "smem": compiled.metadata.shared})
    return out


# ----------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget", type=float, default=285.0, help="seconds; later items are skipped past it")
    ap.add_argument("--jobs", type=int, default=12, help="parallel compile processes")
    ap.add_argument("--warm-budget", type=float, default=150.0, help="seconds for the parallel compile phase")
    ap.add_argument("--phases", default="warm,gate,time,profile")
    args = ap.parse_args()
    t_start = time.time()
    phases = args.phases.split(",")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "rglru_dev.json")
    import triton

    import samu  # noqa: F401

    rec = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "configs": {k: asdict(v) for k, v in configs().items()},
           "warm": [], "gate": [], "time": [], "profile": {}, "skipped": []}

    def save():
        rec["elapsed_s"] = time.time() - t_start
        with open(path, "w") as f:
            json.dump(rec, f, indent=1, default=str)

    def left():
        return args.budget - (time.time() - t_start)

    timing, gates = plan()
    if "warm" in phases:
        items = warm_items(timing, gates)
        t0 = time.time()
        pool = mp.get_context("spawn").Pool(min(args.jobs, len(items)))
        pending = [(item, pool.apply_async(_warm, (item,))) for item in items]
        for item, res in pending:
            try:
                item, secs, err = res.get(timeout=max(1.0, args.warm_budget - (time.time() - t0)))
            except mp.TimeoutError:
                secs, err = time.time() - t0, "timeout: not compiled within --warm-budget"
            rec["warm"].append({"item": item, "s": secs, "error": err})
            print(f"warm {item} {secs:.1f}s {'OK' if err is None else 'ERROR ' + err[:300]}", flush=True)
        # a worker that died or hangs must not hold the run
        pool.terminate()
        rec["warm_wall_s"] = time.time() - t0
        save()
    broken = {(w["item"][0], w["item"][1]) for w in rec["warm"] if w["error"] and not w["error"].startswith("timeout")}

    rec["copy_bandwidth"] = bw = copy_bandwidth("cuda")["bytes_per_s"]
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)

    if "gate" in phases:
        for name, shape, dt in gates:
            if left() < 60:
                rec["skipped"].append(["gate", name, shape, dt])
                continue
            t0 = time.time()
            try:
                res = gate(name, shape, dt)
                worst = max(res.items(), key=lambda kv: kv[1]["error"] / kv[1]["threshold"])
                entry = {"name": name, "shape": shape, "dtype": dt, "result": res,
                         "pass": all(v["pass"] for v in res.values()), "s": time.time() - t0}
                print(f"gate {name} {shape} {dt}: {'PASS' if entry['pass'] else 'FAIL'} worst {worst[0]} "
                      f"{worst[1]['error']:.2e}/{worst[1]['threshold']:.2e} ({entry['s']:.1f}s)", flush=True)
            except Exception as e:  # noqa: BLE001
                entry = {"name": name, "shape": shape, "dtype": dt, "error": traceback.format_exc()[-1500:]}
                print(f"gate {name} {shape} {dt}: ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
            rec["gate"].append(entry)
            save()

    if "time" in phases:
        for name, shape in timing:
            if left() < 25:
                rec["skipped"].append(["time", name, shape])
                continue
            if (name, shape[2]) in broken:
                rec["time"].append({"name": name, "shape": shape, "error": "compile failed in warm"})
                continue
            try:
                r = time_one(name, shape, bw)
                print(f"time {name:16s} {str(shape):18s} fwd {r['fwd_ms']:.3f} fb {r['fb_ms']:.3f} ms "
                      f"({r['fb_over_floor']:.1f}x floor, {r['speedup_vs_torch_fla']:.0f}x peer) "
                      f"peak {r['peak_over_y_dx']:.2f}x(y+dx)", flush=True)
                rec["time"].append({"name": name, "shape": shape, **r})
            except Exception as e:  # noqa: BLE001
                rec["time"].append({"name": name, "shape": shape, "error": traceback.format_exc()[-1500:]})
                print(f"time {name} {shape}: ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
            save()

    if "profile" in phases:
        for shape in [(1, 32768, 2048), (1, 8192, 1024), (2, 4096, 2560)]:
            if left() < 15:
                rec["skipped"].append(["profile", shape])
                continue
            try:
                rec["profile"][str(shape)] = profile("chunked", shape)
            except Exception:  # noqa: BLE001
                rec["profile"][str(shape)] = traceback.format_exc()[-1500:]
            save()
        rec["compiled"] = compiled_kernels()
        save()

    save()
    print("\n== profile (us per fwd+bwd) ==")
    for shape, rows in rec["profile"].items():
        print(shape)
        if isinstance(rows, str):
            print(rows)
            continue
        for r in rows:
            print(f"  {r['us_per_iter']:9.1f}  x{r['calls_per_iter']:.0f}  {r['kernel']}")
    for k in rec.get("compiled", []):
        print(f"  {k['kernel']:32s} regs {k['regs']} spills {k['spills']} warps {k['warps']} smem {k['smem']}")
    print("\n== gates ==")
    for g in rec["gate"]:
        status = "ERROR" if "error" in g else ("PASS" if g["pass"] else "FAIL " + ", ".join(
            f"{k} {v['error']:.2e}>{v['threshold']:.2e}" for k, v in g["result"].items() if not v["pass"]))
        print(f"  {g['name']:16s} {str(g['shape']):18s} {g['dtype']:9s} {status}")
    print("\n== timings (bf16, ms; floor = bytes / copy bandwidth) ==")
    print(f"  {'config':16s} {'shape':18s} {'fwd':>7s} {'fb':>7s} {'fb/floor':>8s} {'vs peer':>7s} {'peak/(y+dx)':>11s}")
    for t in rec["time"]:
        if "error" in t:
            print(f"  {t['name']:16s} {str(t['shape']):18s} ERROR {t['error'].splitlines()[-1][:80]}")
            continue
        print(f"  {t['name']:16s} {str(t['shape']):18s} {t['fwd_ms']:7.3f} {t['fb_ms']:7.3f} {t['fb_over_floor']:8.1f} "
              f"{t['speedup_vs_torch_fla']:7.1f} {t['peak_over_y_dx']:11.2f}")
    errors = [w for w in rec["warm"] if w["error"]]
    if errors:
        print("\n== compile/launch errors ==")
        for w in errors:
            print(f"  {w['item']}: {w['error'][:400]}")
    if rec["skipped"]:
        print(f"\nskipped (budget): {len(rec['skipped'])} items")
    print(f"\nelapsed {time.time() - t_start:.0f}s; JSON: {path}")


if __name__ == "__main__":
    main()
