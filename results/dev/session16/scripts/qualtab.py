"""Session 16 (issue 10): does gate_up's bias gradient out of the GeGLU backward ("fused", as shipped) train as well as
the product then the gate with a bias-gradient sum of its own ("split")? `samu train --preset 400m` at 4 x 2048,
compiled, one validation at the end (16 batches), at a given seed. "splitrev" is the control: split, with every
linear's bias-gradient sum taken over the rows in reverse order (the same fp32 sum in another order, as
results/dev/session15/scripts/chaos_cpu.py does on the CPU).
Usage: python qualtab.py TAG fused|split|splitrev SEED STEPS; writes $W/qual_TAG.json."""
import json
import os
import sys

import torch

import samu.modules.layers as layers
import samu.ops.linear as lin

tag, mode, seed, steps = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
if mode not in ("fused", "split", "splitrev"):
    raise SystemExit(f"mode must be fused, split or splitrev, got {mode!r}")
if mode != "fused":
    # modules bound as defaults: Dynamo looks globals up in __main__
    layers.linear_geglu = lambda x, w, b, low, backend, L=layers: L.geglu(L.linear(x, w, b, low), backend)
if mode == "splitrev":
    plain = lin.autocast_product_grads

    def reversed_sums(ctx, dy, xc, wc, bias_grad=None, plain=plain, torch=torch):
        rows = dy.reshape(-1, dy.shape[-1]).to(ctx.low)
        return plain(ctx, dy, xc, wc, rows.flip(0).sum(0, dtype=torch.float32) if bias_grad is None else bias_grad)

    lin.autocast_product_grads = reversed_sums
from samu.cli import main  # noqa: E402

out = f"/tmp/runs/{tag}"
main(["train", "--preset", "400m", "--steps", steps, "--batch-size", "4", "--seq-len", "2048", "--eval-every", steps,
      "--eval-batches", "16", "--checkpoint-every", "100000", "--warmup", "20", "--seed", seed, "--no-progress",
      "--out", out])
log = json.load(open(f"{out}/log.json"))
rec = {"tag": tag, "mode": mode, "seed": int(seed), "steps": int(steps), "train": log["train"], "val": log["val"],
       "bf16_weight_copies": log.get("bf16_weight_copies")}
json.dump(rec, open(os.path.join(os.environ["W"], f"qual_{tag}.json"), "w"), indent=1)
ivs = [e["recent_tokens_per_s"] for e in log["train"][2:]]
print(f"{tag} {mode} seed {seed}: validation {log['val'][-1]['val_loss']:.5f}, last train loss "
      f"{log['train'][-1]['loss']:.5f}, intervals mean {sum(ivs) / len(ivs) / 1e3:.1f}K tokens/s")
import shutil  # noqa: E402

shutil.rmtree(out)   # ~5 GB of checkpoint a run
