"""Prepared in session 13 for the next device call (issue 10): what the host does in `samu train`'s slow phases.

Every run of `samu train --preset 400m` at 4 x 2048 compiled slows in the same four phases of a few steps
(results/dev/session13/call1). This runs it for STEPS steps with, at every scheduler step, a CUDA event (the step's
time on the GPU's stream) and the host's clock, and a sampling thread that reads the main thread's stack every
INTERVAL seconds (each thread's innermost samu/torch frame; on CUDA the backward runs on autograd's thread). Each sample is filed under the step the host was in; the steps
are split into slow (GPU step > 1.03 x the median) and the others, and the frames' shares are compared.
Writes $W/hostsample_<TAG>.json and prints the frames whose share differs most.

Usage: python hostsample.py TAG [STEPS] [PRESET] [BATCH] [SEQ]   (CPU: the tiny preset works for a dry run)
"""
import collections
import json
import os
import sys
import threading
import time

import torch
from torch.optim.lr_scheduler import LambdaLR

tag = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 100
preset = sys.argv[3] if len(sys.argv) > 3 else "400m"
batch = sys.argv[4] if len(sys.argv) > 4 else "4"
seq = sys.argv[5] if len(sys.argv) > 5 else "2048"
INTERVAL = 0.002
W = os.environ.get("W", ".")
cuda = torch.cuda.is_available()
marks = []          # (host time, CUDA event or None) after each scheduler step
samples = []        # (host time, frames)
stop = threading.Event()


def frames_of(frame, depth=4):
    """The innermost ``depth`` frames in samu or torch (file:line function), innermost first."""
    out = []
    while frame is not None and len(out) < depth:
        name = frame.f_code.co_filename
        if "/samu/" in name or "/torch/" in name or "/triton/" in name:
            short = name.split("/site-packages/")[-1].split("/main/")[-1]
            out.append(f"{short}:{frame.f_lineno} {frame.f_code.co_name}")
        frame = frame.f_back
    return tuple(out)


def sampler():
    # every thread but this one: on CUDA the backward (the custom ops' Python) runs on autograd's device thread
    me = threading.get_ident()
    while not stop.is_set():
        now = time.perf_counter()
        tops = [frames_of(frame)[:1] for tid, frame in sys._current_frames().items() if tid != me]
        samples.append((now, tuple(f[0] for f in tops if f) or ("(outside samu and torch)",)))
        time.sleep(INTERVAL)


orig_step = LambdaLR.step


def step(self, *a, **k):
    r = orig_step(self, *a, **k)
    event = None
    if cuda:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
    marks.append((time.perf_counter(), event))
    return r


LambdaLR.step = step
from samu.cli import main  # noqa: E402

thread = threading.Thread(target=sampler, daemon=True)
thread.start()
main(["train", "--preset", preset, "--steps", str(steps), "--batch-size", batch, "--seq-len", seq, "--eval-every",
      "100000", "--eval-batches", "1", "--checkpoint-every", "100000", "--warmup", "10", "--no-progress", "--out",
      f"/tmp/runs/hostsample-{tag}"])
stop.set()
thread.join()
if cuda:
    torch.cuda.synchronize()
marks = marks[1:]   # [0] is the scheduler's constructor
host = [t for t, _ in marks]
if cuda:
    step_ms = [a.elapsed_time(b) for (_, a), (_, b) in zip(marks, marks[1:])]
else:
    step_ms = [(b - a) * 1e3 for a, b in zip(host, host[1:])]
# step i runs between marks i and i + 1; its samples are the host's between those marks
settled = sorted(step_ms[20:]) or sorted(step_ms)
median = settled[len(settled) // 2]
slow = [i for i, ms in enumerate(step_ms) if i >= 15 and ms > 1.03 * median]
counts = {"slow": collections.Counter(), "other": collections.Counter()}
totals = {"slow": 0, "other": 0}
j = 0
for i in range(15, len(step_ms)):
    kind = "slow" if i in slow else "other"
    while j < len(samples) and samples[j][0] < host[i]:
        j += 1
    while j < len(samples) and samples[j][0] < host[i + 1]:
        for f in samples[j][1]:
            counts[kind][f] += 1
        totals[kind] += 1
        j += 1
share = {kind: {f: n / max(1, totals[kind]) for f, n in c.items()} for kind, c in counts.items()}
frames = set(share["slow"]) | set(share["other"])
diff = sorted(frames, key=lambda f: share["slow"].get(f, 0) - share["other"].get(f, 0), reverse=True)
record = {"tag": tag, "steps": steps, "preset": preset, "batch": int(batch), "seq": int(seq), "cuda": cuda,
          "interval_s": INTERVAL, "step_ms": step_ms, "host_time": host, "median_ms": median, "slow_steps": slow,
          "samples": totals, "share": share}
with open(os.path.join(W, f"hostsample_{tag}.json"), "w") as f:
    json.dump(record, f, indent=1)
print(f"{tag}: median step {median:.2f} ms, slow steps {slow}; samples slow {totals['slow']}, other {totals['other']}")
print(f"{'frame (innermost samu/torch)':90} {'slow':>6} {'other':>6}")
for f in diff[:12] + diff[-5:]:
    print(f"{f[:90]:90} {share['slow'].get(f, 0):6.1%} {share['other'].get(f, 0):6.1%}")
