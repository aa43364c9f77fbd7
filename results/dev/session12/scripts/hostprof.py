"""Where samu train's host time goes: `samu train --preset 400m` at 4 x 2048 compiled, 70 steps, cProfile on from
step 30 to step 60 (turned on and off at LambdaLR.step), the top functions by own time and by cumulative time.
Usage: python hostprof.py OUT_PREFIX"""
import cProfile, io, pstats, sys, time
import torch
from torch.optim.lr_scheduler import LambdaLR

out = sys.argv[1]
prof = cProfile.Profile()
orig = LambdaLR.step
st = {"n": 0, "t": []}


def step(self, *a, **k):
    r = orig(self, *a, **k)
    st["n"] += 1
    st["t"].append(time.perf_counter())
    if st["n"] == 31:
        prof.enable()
    if st["n"] == 61:
        prof.disable()
    return r


LambdaLR.step = step
from samu.cli import main  # noqa: E402

main(["train", "--preset", "400m", "--steps", "70", "--batch-size", "4", "--seq-len", "2048", "--eval-every",
      "100000", "--eval-batches", "1", "--checkpoint-every", "100000", "--warmup", "10", "--no-progress", "--out",
      "/tmp/runs/hostprof"])
torch.cuda.synchronize()
t = st["t"]
for key in ("tottime", "cumulative"):
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats(key).print_stats(45)
    open(f"{out}_{key}.txt", "w").write(s.getvalue())
print(f"profiled steps 31-60: {1e3 * (t[60] - t[30]) / 30:.2f} ms a step on the host's clock")
s = io.StringIO()
pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(12)
print("\n".join(s.getvalue().splitlines()[-16:]))
