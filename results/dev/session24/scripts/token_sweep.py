"""For the next session (written in session 24, not yet run): the whole-token kernel's settings in a real batch-1
decode of the 400m preset (bf16, SAMU), each a CUDA graph of one decoding step replayed 200 times, rounds
alternating with the five launches a layer (the shipped plan) as the reference (gpu_profile.graph_time):
programs a multiprocessor (PER_SM 1 or 2), SAMU modes a step task (STEP_MODES 64, 128, 1024 = one task), warps
a program (4, 8), and 16-row tiles for the in- and out-projections (fewer tasks, each moving twice the weights).
Each setting compiles the kernel once (constexprs and warps), so the first round pays it.

    PYTHONPATH=$PWD python results/dev/session24/scripts/token_sweep.py --out DIR [--rounds 2]

Writes DIR/token_sweep.json as it goes and prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "scripts"))

from gpu_profile import graph_time  # noqa: E402
from samu.environment import environment  # noqa: E402
from samu.models import LanguageModel, LMConfig  # noqa: E402
from samu.ops import decode_triton  # noqa: E402


def step_of(model, plan, state):
    """One greedy decoding step (model.decode with ``plan`` over ``state``, the token fed back)."""
    token = torch.zeros(1, dtype=torch.int64, device="cuda")

    def step():
        token.copy_(model.decode(token, state, plan).argmax(-1))

    return step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = LanguageModel(LMConfig.preset("400m", mixer="samu"), device="cuda").to(torch.bfloat16).eval()
    settings = [("launches", None, None, None, False)] + [
        (f"per_sm={p} modes={m} warps={w}" + (" rows=16" if big else ""), p, m, w, big)
        for p, m, w, big in ((2, 128, 4, False), (1, 128, 4, False), (2, 64, 4, False), (2, 1024, 4, False),
                             (1, 128, 8, False), (2, 128, 4, True))]
    shipped = decode_triton.tiles

    def rows16(N, K, pro):
        # 16-row tiles for a product of at most 2K outputs over at most 2,048 inputs: the in- and out-projections
        return (16, 512) if N <= 2 * K and K <= 2048 else shipped(N, K, pro)

    out = {"env": environment(torch.device("cuda")), "command": " ".join(sys.argv), "rows": []}
    path = os.path.join(args.out, "token_sweep.json")
    with torch.no_grad():
        for r in range(args.rounds):
            for name, per_sm, modes, warps, big in settings:
                state = model.init_state(1)
                if per_sm is None:
                    plan = model.decode_plan(1)
                else:
                    decode_triton.STEP_MODES = modes
                    decode_triton.tiles = rows16 if big else shipped
                    plan = model.decode_plan(1, state)
                    assert isinstance(plan, decode_triton.TokenKernel)
                    plan.grid = torch.cuda.get_device_properties(0).multi_processor_count * per_sm
                    plan.args["num_warps"] = warps
                ms = graph_time(step_of(model, plan, state), [], iters=200)
                out["rows"].append({"round": r, "setting": name, "graph_ms": ms, "tokens_per_s": 1e3 / ms})
                with open(path, "w") as f:
                    json.dump(out, f, indent=1)
                print(f"round {r} {name:32} {ms:.4f} ms  {1e3 / ms:,.0f} tok/s", flush=True)


if __name__ == "__main__":
    main()
