"""Locate the RG-LRU fp32 fault at head dim 160 and the SAMU torch path's fp16 dx excess (issue 8).

    python scripts/gpu_diag.py [--out DIR] [--jobs 8]

RG-LRU: each configuration (head dim, dtype, dx-kernel warps, pipelining stages, dx product order)
runs fwd+bwd in a child process of its own (a fault poisons a CUDA context), once plainly at a
shape that faulted and once under compute-sanitizer memcheck at a small one, and reports dx's
relative error against the float64
reference. SAMU: the torch path's dx at (1, 16384, 1024) fp16 on the gate's inputs, with its fp32
result before rounding, beside the serial fp32 evaluation's (results/dev/gpu_diag_3_samu.json is the
earlier form of this part, with fp32 and float64 rotations patched in, at commit a18596f). fla:
chunk_hgrn against a float64 scan, by position in its chunks, and its repeatability. Writes
diag[_PART].json as it goes and prints each result.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

RGLRU_CASES = [
    # (n, dtype, WC_dx, stages, dx order): the fault's cell first, then one change at a time
    (160, "float32", 4, "auto", "auto"),
    (160, "float32", 4, "1", "auto"),
    (160, "float32", 4, "auto", "1"),
    (160, "float32", 2, "auto", "auto"),
    (160, "float32", 8, "auto", "auto"),
    (128, "float32", 4, "auto", "auto"),
    (96, "float32", 4, "auto", "auto"),
    (160, "bfloat16", 4, "auto", "auto"),
]


def child(args) -> None:
    import torch

    from samu import reference
    from samu.gates.inputs import make_inputs
    from samu.gates.rules import rel_error
    from samu.ops.rglru import function, triton_bwd

    if args.stages != "auto":
        stages = int(args.stages)
        triton_bwd.launch = lambda kernel, grid, *a, **meta: kernel[grid](*a, **dict(meta, num_stages=stages))
    if args.order != "auto":
        triton_bwd.out_order = lambda dtype: int(args.order)
    dtype = getattr(torch, args.dtype)
    D = 16 * args.n
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    inp = make_inputs("rglru", (1, args.L, D), dtype, dev, 7)
    config = function.Config(WC_dx=args.wc_dx)
    x = inp["x"].clone().requires_grad_()
    params = [p.clone().requires_grad_() for p in inp["params"].values()]
    y, h = function.run(x, *params, None, 8.0, config)
    (dx,) = torch.autograd.grad([y], [x], [inp["dy"]])
    if dev == "cuda":
        torch.cuda.synchronize()
    xr = inp["x"].double().requires_grad_()
    pr = [p.double() for p in inp["params"].values()]
    yr, _ = reference.rglru_mixer(xr, *pr, c=8.0, output_final_state=True)
    (dxr,) = torch.autograd.grad([yr], [xr], [inp["dy"].double()])
    print("RESULT " + json.dumps({"dx_error": rel_error(dx, dxr), "y_error": rel_error(y, yr)}), flush=True)


def _one(case, L: int, sanitize: bool, timeout: float) -> dict:
    n, dtype, wc_dx, stages, order = case
    cmd = [sys.executable, __file__, "--child", "--n", str(n), "--dtype", dtype, "--wc-dx", str(wc_dx),
           "--stages", stages, "--order", order, "--L", str(L)]
    if sanitize:
        cmd = ["compute-sanitizer", "--tool", "memcheck", "--print-limit", "3"] + cmd
    start = time.time()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        text, rc = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as err:
        text, rc = f"timeout: {err}", -1
    result = next((json.loads(line[7:]) for line in text.splitlines() if line.startswith("RESULT ")), None)
    errors = [line.strip() for line in text.splitlines() if "Out-of-range" in line or "Invalid" in line
              or "illegal" in line.lower() or (" at " in line and ".py:" in line)][:6]
    return {"case": dict(n=n, dtype=dtype, WC_dx=wc_dx, stages=stages, order=order, L=L), "sanitize": sanitize,
            "rc": rc, "result": result, "errors": errors, "tail": text[-1500:],
            "seconds": round(time.time() - start, 1)}


def run_rglru(args, out: list, path: str) -> None:
    """Every case twice, in parallel children: plainly at L = 2100 (a fault shape) and under memcheck at L."""
    from concurrent.futures import ThreadPoolExecutor

    jobs = [(case, 2100, False) for case in RGLRU_CASES] + [(case, args.L, True) for case in RGLRU_CASES]
    with ThreadPoolExecutor(args.jobs) as pool:
        for row in pool.map(lambda j: _one(*j, args.timeout), jobs):
            out.append(row)
            with open(path, "w") as f:
                json.dump(out, f, indent=1)
            c = row["case"]
            print(f"rglru n={c['n']} {c['dtype']} WC_dx={c['WC_dx']} stages={c['stages']} order={c['order']} "
                  f"L={c['L']} sanitize={row['sanitize']}: rc={row['rc']} {row['result']} {row['errors'][:2]}",
                  flush=True)


def run_samu(out: list, path: str) -> None:
    import torch

    from samu.gates.inputs import derive_seed, make_inputs
    from samu.gates.rules import load_rules, rel_error
    from samu.gates.runner import evaluate
    from samu.ops.samu.torch import samu_mixer_torch

    B, L, D = 1, 16384, 1024
    rules = load_rules()
    inp = make_inputs("samu", (B, L, D), torch.float16, "cuda", derive_seed(0, "samu", B, L, D, "float16"),
                      rules.inputs)
    ref = evaluate("samu", inp, ref_dtype=torch.float64)
    got = evaluate("samu", inp, backend="torch")
    # the same computation on fp32 copies of the fp16 values: y and dx before their rounding
    x32 = inp["x"].float().requires_grad_()
    params = [p.clone().requires_grad_() for p in inp["params"].values()]
    h0 = inp["initial_state"].clone().requires_grad_()
    y32, h = samu_mixer_torch(x32, *params, h0, 2.0)
    (dx32,) = torch.autograd.grad([y32, h], [x32], [inp["dy"].float(), inp["dh"]])
    serial = evaluate("samu", inp, ref_dtype=torch.float32)
    row = {"shape": [B, L, D], "torch_fp32": {"y": rel_error(y32, ref["y"]), "dx": rel_error(dx32, ref["dx"])},
           "serial_fp32": {"y": rel_error(serial["y"], ref["y"]), "dx": rel_error(serial["dx"], ref["dx"])},
           "dx_error_fp16": rel_error(got["dx"], ref["dx"]),
           "dx_rounded_ref": rel_error(ref["dx"].to(torch.float16), ref["dx"]),
           "dx32_rounded_error": rel_error(dx32.half(), ref["dx"]),
           "y_error_fp16": rel_error(got["y"], ref["y"]), "y_rounded_ref": rel_error(ref["y"].half(), ref["y"]),
           "dx_fp16_vs_dx32_rounded_equal": bool(torch.equal(got["dx"], dx32.half())),
           "dx_max_abs": ref["dx"].abs().max().item(),
           "dx_min_normal_fraction": (ref["dx"].abs() < 6.1e-5).double().mean().item()}
    out.append({"samu_torch_fp16": row})
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print("samu torch fp16:", json.dumps(row), flush=True)


def run_fla(out: list, path: str) -> None:
    """fla's chunk_hgrn on the RG-LRU gate inputs of (1, 8192, 1024): error against a float64 scan
    by token position inside its 128-token chunks, and whether two calls on the same inputs agree
    to the bit (a race between warps would show in both)."""
    import torch

    try:
        from fla.ops.hgrn import chunk_hgrn
    except ImportError as err:
        out.append({"fla": f"not installed: {err}"})
        return
    from samu.gates.inputs import make_inputs
    from samu.reference import rglru_gates

    inp = make_inputs("rglru", (1, 8192, 1024), torch.bfloat16, "cuda", 3)
    a, b = rglru_gates(inp["x"].float(), *inp["params"].values(), 8.0)
    g = torch.log(a)
    runs = [chunk_hgrn(b, g)[0] for _ in range(3)]
    h, ref = torch.zeros_like(b[:, 0]).double(), torch.empty_like(b).double()
    for t in range(b.shape[1]):
        h = a[:, t].double() * h + b[:, t].double()
        ref[:, t] = h
    err = (runs[0].double() - ref).norm(dim=(0, 2)) / ref.norm(dim=(0, 2)).clamp_min(1e-30)  # per token
    by_pos = err.view(-1, 128).mean(0)
    row = {"rel_error": ((runs[0].double() - ref).norm() / ref.norm()).item(),
           "bitwise_equal_repeats": [bool(torch.equal(runs[0], r)) for r in runs[1:]],
           "mean_error_tokens_0_95": by_pos[:96].mean().item(), "mean_error_tokens_96_127": by_pos[96:].mean().item(),
           "mean_error_first_chunk": err[:128].mean().item()}
    out.append({"fla": row})
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print("fla chunk_hgrn:", json.dumps(row), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--L", type=int, default=100)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--n", type=int, default=160)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--wc-dx", type=int, default=4)
    ap.add_argument("--stages", default="auto")
    ap.add_argument("--order", default="auto")
    ap.add_argument("--only", choices=("rglru", "samu", "fla"), default=None, help="run one part only")
    args = ap.parse_args()
    if args.child:
        return child(args)
    path = os.path.join(args.out, f"diag_{args.only}.json" if args.only else "diag.json")
    out: list = []
    for name, part in (("rglru", lambda: run_rglru(args, out, path)), ("samu", lambda: run_samu(out, path)),
                       ("fla", lambda: run_fla(out, path))):
        if args.only in (None, name):
            part()


if __name__ == "__main__":
    main()
