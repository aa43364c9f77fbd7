"""The clipped optimizer step alone for the 400m preset's parameters (random gradients, no model run): torch's
norm + fused AdamW with grad_scale (train.clipped_step on a torch AdamW) against samu.ops.adamw.ClippedAdamW,
alternating, CUDA events. Usage: python optbench.py OUT.json"""
import json, sys
import torch
from samu.models import LanguageModel, LMConfig
from samu.train import TrainConfig, _optimizer, clipped_step
import samu.train as tr

torch.manual_seed(0)
model = LanguageModel(LMConfig.preset("400m", mixer="samu"), device="cuda")
n = sum(p.numel() for p in model.parameters())
config = TrainConfig(model=LMConfig.preset("400m", mixer="samu"), out_dir="/tmp/unused", grad_clip=1.0)
opts = {}
for name, kernels in (("torch", False), ("kernels", True)):
    tr._adamw_kernels = lambda device, k=kernels: k
    opts[name] = _optimizer(model, config, torch.device("cuda"))
print({k: type(v).__name__ for k, v in opts.items()})
for p in model.parameters():
    p.grad = torch.randn_like(p) * 1e-3
times = {k: [] for k in opts}
for rnd in range(6):
    for name in (("torch", "kernels") if rnd % 2 == 0 else ("kernels", "torch")):
        opt = opts[name]
        for i in range(3):
            clipped_step(model, opt, 1.0)
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for i in range(20):
            clipped_step(model, opt, 1.0)
        b.record()
        torch.cuda.synchronize()
        times[name].append(a.elapsed_time(b) / 20)
floor = 32 * n / 4.2e12 * 1e3
out = {"params": n, "floor_ms_32B_per_param": floor, "ms": times}
json.dump(out, open(sys.argv[1], "w"), indent=1)
for k, v in times.items():
    v = sorted(v)
    print(f"{k:8} median {v[len(v) // 2]:.3f} ms  min {v[0]:.3f}  ({32 * n / v[0] / 1e9:.2f} TB/s at 32 B a param; floor {floor:.3f} ms)")
