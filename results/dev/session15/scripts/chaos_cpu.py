"""Session 15 (issue 10), on the CPU: how far two training runs drift apart when only the order of the linears' bias
gradient sums differs (a control for call 3/4's fused and split runs, whose losses differed from step 10 on).
A 4-layer model of width 128 on the embedded corpus, bf16 autocast, the PyTorch paths; run A as shipped, run B
with every linear's bias gradient summed over the rows in reverse order (the same fp32 sum, another order). Prints
both loss logs.
Usage: python chaos_cpu.py STEPS OUT.json"""
import json
import sys
import tempfile

import torch

import samu.ops.linear as lin
from samu.data import load_data
from samu.models import LMConfig
from samu.train import TrainConfig, train

steps, out = int(sys.argv[1]), sys.argv[2]
tmp = tempfile.mkdtemp()
data = load_data("stdlib")
model = LMConfig(width=128, num_layers=4, lru_width=128)


def run(name):
    config = TrainConfig(model=model, out_dir=f"{tmp}/{name}", steps=steps, batch_size=8, seq_len=128,
                         warmup_steps=10, eval_every=steps, eval_batches=8, checkpoint_every=steps, log_every=10,
                         lr=3e-3, autocast="bf16", progress=False)
    return train(config, data=data).log


a = run("a")
plain = lin.autocast_product_grads


def reversed_sums(ctx, dy, xc, wc, bias_grad=None):
    rows = dy.reshape(-1, dy.shape[-1]).to(ctx.low)
    return plain(ctx, dy, xc, wc, rows.flip(0).sum(0, dtype=torch.float32) if bias_grad is None else bias_grad)


lin.autocast_product_grads = reversed_sums
b = run("b")
rec = {"steps": steps, "a": [(e["step"], e["loss"]) for e in a["train"]],
       "b": [(e["step"], e["loss"]) for e in b["train"]], "val": [a["val"][-1]["val_loss"], b["val"][-1]["val_loss"]]}
json.dump(rec, open(out, "w"), indent=1)
for (s, x), (_, y) in zip(rec["a"], rec["b"]):
    print(f"step {s}: {x:.5f} {y:.5f} diff {y - x:+.5f}")
print("validation", rec["val"])
