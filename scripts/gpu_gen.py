"""Where a decoding step's time goes: the 400m preset in bf16, one token per row through generate()'s
Decoder, graphed and eager, with the kernels of one step and the weight-read floor.

Usage: python scripts/gpu_gen.py [--out DIR] [--batches 1,8,64] [--mixers samu,rglru] [--no-kernels]
The weight floor is the weights' bytes at this GPU's measured copy bandwidth (samu.bench.timing.copy_bandwidth).
Writes DIR/gen_profile.json and prints a table. Times are of a real decode: every step streams the weights
from memory (a loop over one product alone would find them in L2).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from gpu_profile import kernel_table  # noqa: E402
from samu.bench.timing import copy_bandwidth  # noqa: E402
from samu.environment import environment  # noqa: E402
from samu.models import LanguageModel, LMConfig  # noqa: E402
from samu.models.generate import decoder  # noqa: E402


def replay_ms(fn, iters):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--mixers", default="samu,rglru")
    ap.add_argument("--no-kernels", action="store_true")
    args = ap.parse_args()
    bandwidth = copy_bandwidth("cuda")
    out = {"env": environment(torch.device("cuda")), "command": "python scripts/gpu_gen.py " + " ".join(sys.argv[1:]),
           "copy_bandwidth": bandwidth, "rows": []}
    path = os.path.join(args.out, "gen_profile.json")
    for mixer in args.mixers.split(","):
        torch.manual_seed(0)
        model = LanguageModel(LMConfig.preset("400m", mixer=mixer), device="cuda").to(torch.bfloat16).eval()
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        for B in map(int, args.batches.split(",")):
            with torch.no_grad():
                prompt = torch.randint(256, (B, 16), device="cuda")
                logits, state = model(prompt, return_state=True)
                rows = torch.arange(B, device="cuda")
                row = {"mixer": mixer, "batch": B, "weight_bytes": weight_bytes}
                for graph in (True, False):
                    dec = decoder(model, B, 0.0, None, graph)
                    dec.load(rows, state)
                    row["row_products"] = all(dec.plan)
                    dec.run(model, logits[:, -1], 2, None)
                    dec.counter.zero_()   # the steps below index the chunk's buffers by it: fewer than CHUNK
                    step = dec.graph.replay if graph else (lambda d=dec, m=model: d._step(m))
                    iters = 200 if graph else 30
                    assert iters + 10 < dec.chunk   # the timed steps, one untimed, 3 + 5 profiled
                    row["graph_ms" if graph else "eager_ms"] = replay_ms(step, iters)
                    if B in (1, 64) and not graph and not args.no_kernels:
                        row["kernels"] = kernel_table(step, [])
                        row["kernel_ms"] = sum(k[2] for k in row["kernels"]) / 1e3
                row["graph_tokens_per_s"] = B / row["graph_ms"] * 1e3
                row["weight_floor_ms"] = weight_bytes / bandwidth["bytes_per_s"] * 1e3
            out["rows"].append(row)
            with open(path, "w") as f:
                json.dump(out, f, indent=1)
            print(f"{mixer:6} B={B:3} graph {row['graph_ms']:.3f} ms/step ({row['graph_tokens_per_s']:,.0f} tok/s) "
                  f"eager {row['eager_ms']:.3f} ms/step  weight floor {row['weight_floor_ms']:.3f} ms"
                  + (f"  kernels (eager) {row['kernel_ms']:.3f} ms" if "kernel_ms" in row else "")
                  + ("  row products" if row["row_products"] else ""), flush=True)
        del model
        torch.cuda.empty_cache()
    for row in out["rows"]:
        if "kernels" in row:
            print(f"--- {row['mixer']} B={row['batch']} kernels of one eager step (count, us)")
            for name, count, us in row["kernels"][:14]:
                print(f"  {name:70} {count:5.1f} {us:8.1f}")


if __name__ == "__main__":
    main()
