"""`samu train` (400m, 4 x 2048, compiled) with steps 31-35 profiled: where its step goes next to the bench's.
Usage: python ab/trainprof.py TAG [extra samu train args]"""
import json, os, sys, time
import torch
from torch.optim.lr_scheduler import LambdaLR
from torch.profiler import ProfilerActivity, profile

tag, extra = sys.argv[1], sys.argv[2:]
W = os.environ["W"]
orig = LambdaLR.step
st = {"n": 0}


def step(self, *a, **k):
    r = orig(self, *a, **k)
    st["n"] += 1          # 1 is the constructor's own call; n - 1 steps are done
    if st["n"] == 31:
        torch.cuda.synchronize()
        st["t0"] = time.perf_counter()
        st["p"] = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        st["p"].__enter__()
    if st["n"] == 36:
        torch.cuda.synchronize()
        wall = (time.perf_counter() - st["t0"]) / 5
        st["p"].__exit__(None, None, None)
        try:
            summarise(wall)
        except Exception as e:  # the run goes on
            print("summary failed:", repr(e))
    return r


def summarise(wall):
    if True:
        ev = st["p"].key_averages()
        dev = sorted([(e.key[:90], e.count / 5, e.device_time_total / 5e3) for e in ev if e.device_time_total > 0
                      and e.device_type.name == "CUDA"], key=lambda r: -r[2])
        host = sorted([(e.key[:90], e.count / 5, e.self_cpu_time_total / 5e3) for e in ev
                       if e.device_type.name == "CPU"], key=lambda r: -r[2])
        rec = {"tag": tag, "extra": extra, "wall_ms_per_step_profiled": wall * 1e3,
               "kernel_ms_per_step": sum(r[2] for r in dev), "kernels": dev[:60], "host_ops": host[:60]}
        json.dump(rec, open(os.path.join(W, f"trainprof_{tag}.json"), "w"), indent=1)
        print(f"{tag}: profiled step {wall * 1e3:.2f} ms, kernels {rec['kernel_ms_per_step']:.2f} ms a step")
        for r in dev[:15]:
            print(f"   dev  {r[2]:7.3f} ms x{r[1]:5.1f} {r[0]}")
        for r in host[:15]:
            print(f"   host {r[2]:7.3f} ms x{r[1]:5.1f} {r[0]}")


LambdaLR.step = step
from samu.cli import main  # noqa: E402

main(["train", "--preset", "400m", "--steps", "50", "--batch-size", "4", "--seq-len", "2048", "--eval-every", "1000",
      "--eval-batches", "1", "--checkpoint-every", "1000", "--warmup", "10", "--no-progress", "--out",
      f"/tmp/runs/{tag}", *extra])
log = json.load(open(f"/tmp/runs/{tag}/log.json"))
print(tag, [round(e["recent_tokens_per_s"]) for e in log["train"]])
json.dump(log, open(os.path.join(W, f"train_{tag}.json"), "w"), indent=1)
