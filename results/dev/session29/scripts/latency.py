# Session 29: why one eager SAMU fwd+bwd takes 1.2-1.5 ms in `samu bench` (a latency: synchronise, events, one
# call, synchronise) while session 28's pipelined loop put its host time at ~0.6 ms. Medians of 30 samples, ms.
#   OUT=$OUT python results/dev/session29/scripts/latency.py          (~1 minute on an H100)
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402

import samu  # noqa: E402
from tests.helpers import randn, samu_params  # noqa: E402

dev = "cuda" if torch.cuda.is_available() else "cpu"
samu.set_check_finite(False)
B, L, D = (1, 8192, 1024)
x = randn((B, L, D), 0, device=dev, dtype=torch.bfloat16).requires_grad_(True)
params = [p.requires_grad_(True) for p in samu_params(D, 1, device=dev)]
dy = torch.randn(B, L, D, device=dev, dtype=torch.bfloat16)
leaves = [x, *params]
out = {}


def sync():
    if dev == "cuda":
        torch.cuda.synchronize()


def fwd():
    return samu.samu_mixer(x, *params)[0]


def fb_grad():
    # the harness's fb call (samu.bench.scopes.mixer_candidates)
    return torch.autograd.grad(fwd(), leaves, dy)


def fb_backward():
    fwd().backward(dy)
    for t in leaves:
        t.grad = None


class Ident(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a):
        return a.clone()

    @staticmethod
    def backward(ctx, g):
        return g


a = torch.zeros(16, device=dev, requires_grad=True)


def trivial():
    return torch.autograd.grad(Ident.apply(a), [a], torch.ones(16, device=dev))


def latency(name, fn, n=30, spin_ms=0.0):
    """One call between two synchronisations, as samu.bench.timing.Clock times it (no L2 flush): CUDA events and the
    host's own time in the call."""
    for _ in range(3):
        fn()
    events, hosts = [], []
    for _ in range(n):
        sync()
        if spin_ms:   # the host kept busy (not asleep in a synchronisation) just before the call
            t = time.perf_counter() + spin_ms / 1e3
            while time.perf_counter() < t:
                pass
        if dev == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        if dev == "cuda":
            end.record()
            end.synchronize()
            events.append(start.elapsed_time(end))
        hosts.append((t1 - t0) * 1e3)
    out[name] = {"event_ms": statistics.median(events) if events else None, "host_ms": statistics.median(hosts)}
    print(f"{name:44s} event {out[name]['event_ms'] or 0:7.3f}  host {out[name]['host_ms']:7.3f}", flush=True)


def pipelined(name, fn, n=100):
    """n calls back to back: the host's time a call, and the wall time a call until the GPU is done."""
    for _ in range(3):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    sync()
    t2 = time.perf_counter()
    out[name] = {"host_ms": (t1 - t0) / n * 1e3, "wall_ms": (t2 - t0) / n * 1e3}
    print(f"{name:44s} host {out[name]['host_ms']:7.3f}  wall {out[name]['wall_ms']:7.3f}", flush=True)


for rnd in (1, 2):
    pipelined(f"r{rnd} pipelined fb .backward", fb_backward)
    pipelined(f"r{rnd} pipelined fb autograd.grad", fb_grad)
    latency(f"r{rnd} latency fb autograd.grad (the bench)", fb_grad)
    latency(f"r{rnd} latency fb .backward", fb_backward)
    latency(f"r{rnd} latency fb autograd.grad, 2 ms spin", fb_grad, spin_ms=2.0)
    latency(f"r{rnd} latency fwd", fwd)
    with torch.no_grad():
        latency(f"r{rnd} latency fwd no_grad", fwd)
    latency(f"r{rnd} latency trivial fn grad", trivial)
    latency(f"r{rnd} latency trivial fn grad, 2 ms spin", trivial, spin_ms=2.0)
    json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "latency.json"), "w"), indent=1)
