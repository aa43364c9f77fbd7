"""`samu train` (400m, 4 x 2048, compiled, the defaults) with every step's time on the GPU's stream and the clipped
optimizer step's own time (CUDA events around train.clipped_step). Usage: python optab.py TAG MODE [STEPS]
MODE: kernels (as shipped on CUDA: samu.ops.adamw.ClippedAdamW), torch (torch's fused AdamW with the norm before it,
as before session 12: train._adamw_kernels patched to say no)."""
import json, os, sys, time
import torch
import samu.train as tr
from torch.optim.lr_scheduler import LambdaLR

tag, mode = sys.argv[1], sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 100
W = os.environ["W"]
if mode == "torch":
    tr._adamw_kernels = lambda device: False
orig_step, orig_clip = LambdaLR.step, tr.clipped_step
st = {"ev": [], "clip": [], "host": []}


def clip(model, optimizer, max_norm):
    a = torch.cuda.Event(enable_timing=True); a.record()
    r = orig_clip(model, optimizer, max_norm)
    b = torch.cuda.Event(enable_timing=True); b.record()
    st["clip"].append((a, b))
    return r


def step(self, *a, **k):
    r = orig_step(self, *a, **k)
    e = torch.cuda.Event(enable_timing=True); e.record()
    st["ev"].append(e)
    st["host"].append(time.time())   # wall clock: set beside nvidia-smi's samples
    return r


LambdaLR.step = step
tr.clipped_step = clip
from samu.cli import main  # noqa: E402

main(["train", "--preset", "400m", "--steps", str(steps), "--batch-size", "4", "--seq-len", "2048", "--eval-every",
      "100000", "--eval-batches", "1", "--checkpoint-every", "100000", "--warmup", "10", "--no-progress", "--out",
      f"/tmp/runs/{tag}"])
torch.cuda.synchronize()
ev = st["ev"][1:]   # [0] is the constructor's call
gpu = [a.elapsed_time(b) for a, b in zip(ev, ev[1:])]
clipms = [a.elapsed_time(b) for a, b in st["clip"]]
log = json.load(open(f"/tmp/runs/{tag}/log.json"))
rec = {"tag": tag, "mode": mode, "steps": steps, "optimizer_kernels": log.get("optimizer_kernels"), "gpu_ms": gpu,
       "clip_ms": clipms, "host_time": st["host"][1:], "log": log["train"]}
json.dump(rec, open(os.path.join(W, f"optab_{tag}.json"), "w"), indent=1)
s, c = sorted(gpu[20:]), sorted(clipms[20:])
print(f"{tag} {mode} (kernels {log.get('optimizer_kernels')}): step median {s[len(s) // 2]:.2f} ms, mean "
      f"{sum(s) / len(s):.2f}; clipped step median {c[len(c) // 2]:.3f} ms, mean {sum(c) / len(c):.3f}")
print(f"   intervals tok/s: {[round(e['recent_tokens_per_s']) for e in log['train']]}")
