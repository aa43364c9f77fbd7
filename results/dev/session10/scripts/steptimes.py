"""`samu train` (400m, 4 x 2048, compiled, the defaults) with every step's time on the GPU's stream and on the host,
and every garbage collection's pause. Usage: python ab/steptimes.py TAG MODE [STEPS]
MODE: base (as shipped), freeze (gc.collect(); gc.freeze() after step 3), nogc (gc.disable() after step 3)."""
import gc, json, os, sys, time
import torch
import samu.train as tr
from torch.optim.lr_scheduler import LambdaLR

tag, mode = sys.argv[1], sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 120
W = os.environ["W"]
orig_step, orig_clip = LambdaLR.step, tr.clipped_step
st = {"n": 0, "ev": [], "host": [], "clip": []}
pauses = []
gc_t = {}


def on_gc(phase, info):
    if phase == "start":
        gc_t["t"] = time.perf_counter()
    else:
        pauses.append({"step": st["n"] - 1, "gen": info["generation"], "ms": (time.perf_counter() - gc_t["t"]) * 1e3,
                       "collected": info["collected"]})


gc.callbacks.append(on_gc)


def clip(model, optimizer, max_norm):
    a = torch.cuda.Event(enable_timing=True); a.record()
    r = orig_clip(model, optimizer, max_norm)
    b = torch.cuda.Event(enable_timing=True); b.record()
    st["clip"].append((a, b))
    return r


def step(self, *a, **k):
    r = orig_step(self, *a, **k)
    st["n"] += 1          # 1 is the constructor's own call; n - 1 steps are done
    e = torch.cuda.Event(enable_timing=True); e.record()
    st["ev"].append(e)
    st["host"].append(time.perf_counter())
    if st["n"] == 4 and mode == "freeze":
        gc.collect(); gc.freeze()
    if st["n"] == 4 and mode == "nogc":
        gc.disable()
    return r


LambdaLR.step = step
tr.clipped_step = clip
from samu.cli import main  # noqa: E402

main(["train", "--preset", "400m", "--steps", str(steps), "--batch-size", "4", "--seq-len", "2048", "--eval-every",
      "100000", "--eval-batches", "1", "--checkpoint-every", "100000", "--warmup", "10", "--no-progress", "--out",
      f"/tmp/runs/{tag}"])
torch.cuda.synchronize()
ev, host = st["ev"][1:], st["host"][1:]   # [0] is the constructor's call
gpu = [a.elapsed_time(b) for a, b in zip(ev, ev[1:])]
hst = [(b - a) * 1e3 for a, b in zip(host, host[1:])]
clipms = [a.elapsed_time(b) for a, b in st["clip"]]
log = json.load(open(f"/tmp/runs/{tag}/log.json"))
rec = {"tag": tag, "mode": mode, "steps": steps, "gpu_ms": gpu, "host_ms": hst, "clip_ms": clipms, "gc": pauses,
       "log": log["train"]}
json.dump(rec, open(os.path.join(W, f"steptimes_{tag}.json"), "w"), indent=1)
s = sorted(gpu[10:])
med = s[len(s) // 2]
print(f"{tag} {mode}: step (GPU stream) median {med:.2f} ms, mean {sum(s) / len(s):.2f}, min {s[0]:.2f}, "
      f"max {s[-1]:.2f}; clip median {sorted(clipms)[len(clipms) // 2]:.2f} ms; over 50 ms: "
      f"{[(i + 11, round(g, 1)) for i, g in enumerate(gpu[10:]) if g > 50]}")
print(f"   gc pauses after step 10: {[(p['step'], p['gen'], round(p['ms'], 1)) for p in pauses if p['step'] > 10]}")
print(f"   intervals tok/s: {[round(e['recent_tokens_per_s']) for e in log['train']]}")
