"""Where a training step's time goes: one model of the bench's model scope, per kernel and per kind.

Usage: python scripts/gpu_model_profile.py --model samu|rglru|sdpa-transformer --impl compiled|auto
       [--shape 4x2048x1664] [--preset 400m] [--steps 10] [--device cuda] [--deterministic] [--host]
       [--out DIR]

Builds the candidate the bench times (``samu.bench.scopes.module_candidate``: the same model, bf16 autocast,
fused AdamW, one step = forward, loss, backward, optimizer step), times ``--steps`` steps with CUDA events
after warm-ups, profiles 3 more, and sorts every kernel into a kind (GEMM, attention, the mixers' kernels,
the block's glue, norms, Inductor-generated, optimizer, other). Writes DIR/model_profile_<model>_<impl>_<shape>.json
and prints the kinds and the top kernels. ``--deterministic`` runs it all under the settings `samu train` runs with
by default (samu.train's _deterministic: PyTorch's deterministic algorithms, warn-only, their cuBLAS warning
silenced); its file's name ends in _deterministic. ``--host`` profiles the host too and adds its ops by self time
(``host_ops``: where a step waits on the GPU shows as a synchronising call); the file's name ends in _host.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import samu  # noqa: E402
from samu.environment import environment  # noqa: E402
from samu.bench.scopes import module_candidate  # noqa: E402
from samu.bench.shapes import parse_shapes  # noqa: E402
from samu.train import _deterministic  # noqa: E402

# first match wins; the names are the kernels' own (Triton jit names, cuBLAS/CUTLASS, Inductor's triton_*)
KINDS = (
    ("attention", r"flash|fmha|attention|sdpa"),
    ("gemm", r"gemm|cutlass|xmma|nvjet|cublas|wgmma|splitk"),
    ("samu mixer", r"^_(main|dx|summary|replay|controller|adjoint_summary|reduce)_kernel"),
    ("rglru mixer", r"^_rglru"),
    ("packing", r"chunk_boundaries"),
    ("block glue", r"^_conv_gelu"),
    ("geglu", r"^_geglu"),
    ("rmsnorm", r"^_rmsnorm"),
    ("optimizer", r"adam|multi_tensor|foreach"),
    ("inductor", r"^triton_"),
    ("loss / softmax", r"softmax|cross_entropy|nll|log_softmax"),
    ("copy / fill", r"copy|fill|memset|memcpy|cat|Memcpy|Memset"),
)


def kind_of(name: str) -> str:
    for kind, pattern in KINDS:
        if re.search(pattern, name, flags=re.IGNORECASE):
            return kind
    return "other"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="samu")
    ap.add_argument("--impl", default="compiled")
    ap.add_argument("--shape", default="4x2048x1664")
    ap.add_argument("--preset", default="400m")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--host", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    with _deterministic(args.deterministic):
        profile(args)


def profile(args):
    cuda = args.device == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize()

    samu.set_check_finite(False)
    (shape,) = parse_shapes(args.shape)
    t0 = time.perf_counter()
    cand, skipped = module_candidate("model", args.model, shape, torch.bfloat16, args.device, 0, args.preset,
                                     args.impl)
    if cand is None:
        raise SystemExit(f"no candidate: {skipped}")
    for _ in range(3):
        cand.run()
    sync()
    warm_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(args.steps):
        cand.run()
    sync()
    step_ms = (time.perf_counter() - t0) / args.steps * 1e3
    activities = [torch.profiler.ProfilerActivity.CUDA] if cuda else []
    if args.host or not cuda:
        activities.append(torch.profiler.ProfilerActivity.CPU)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(3):
            cand.run()
        sync()
    averages = prof.key_averages()
    kernels = []
    for e in averages:
        if not cuda and e.self_cpu_time_total > 0:  # a smoke run on the CPU: its ops, self time
            kernels.append({"name": e.key[:120], "kind": kind_of(e.key), "per_step": e.count / 3,
                            "ms_per_step": e.self_cpu_time_total / 3 / 1e3})
        elif cuda and e.device_type != torch.autograd.DeviceType.CPU and e.self_device_time_total > 0:  # kernels
            kernels.append({"name": e.key[:120], "kind": kind_of(e.key), "per_step": e.count / 3,
                            "ms_per_step": e.self_device_time_total / 3 / 1e3})
    host = [e for e in averages if cuda and args.host and e.device_type == torch.autograd.DeviceType.CPU]
    host_ops = sorted(({"name": e.key[:120], "per_step": e.count / 3, "ms_per_step": e.self_cpu_time_total / 3 / 1e3}
                       for e in host if e.self_cpu_time_total > 0), key=lambda h: -h["ms_per_step"])[:40]
    kernels.sort(key=lambda k: -k["ms_per_step"])
    kinds: dict = {}
    for k in kernels:
        kinds[k["kind"]] = kinds.get(k["kind"], 0.0) + k["ms_per_step"]
    tokens = shape[0] * shape[1]
    flops = 6 * cand.params * tokens
    record = {"env": environment(args.device), "command": " ".join(sys.argv), "model": args.model, "impl": args.impl,
              "deterministic": args.deterministic,
              "shape": shape, "preset": args.preset, "params": cand.params, "warmup_s": warm_s,
              "step_ms": step_ms, "tokens_per_s": tokens / step_ms * 1e3,
              "mfu": flops / (step_ms / 1e3) / 989e12 if cuda else None, "kernel_ms": sum(kinds.values()),
              "kinds_ms": dict(sorted(kinds.items(), key=lambda kv: -kv[1])), "kernels": kernels, "host_ops": host_ops}
    name = (f"model_profile_{args.model}_{args.impl}_{'x'.join(map(str, shape))}"
            f"{'_deterministic' if args.deterministic else ''}{'_host' if args.host else ''}.json")
    with open(os.path.join(args.out, name), "w") as f:
        json.dump(record, f, indent=1)
    print(f"{args.model} {args.impl} {shape}{' deterministic' if args.deterministic else ''}: step {step_ms:.2f} ms, "
          f"{record['tokens_per_s'] / 1e3:.1f}K tok/s, MFU {record['mfu'] or 0:.1%}, kernels {record['kernel_ms']:.2f} ms "
          f"(warm-up {warm_s:.0f} s)")
    for kind, ms in record["kinds_ms"].items():
        print(f"    {kind:16s} {ms:8.2f} ms")
    for k in kernels[:25]:
        print(f"    {k['ms_per_step']:8.3f} ms x{k['per_step']:<5.0f} {k['kind']:12s} {k['name'][:70]}")
    for h in host_ops[:25]:
        print(f"    host {h['ms_per_step']:8.3f} ms x{h['per_step']:<6.0f} {h['name'][:70]}")


if __name__ == "__main__":
    main()
