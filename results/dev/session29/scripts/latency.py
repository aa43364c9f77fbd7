# Session 29: why one eager SAMU fwd+bwd takes 1.2-1.4 ms in `samu bench` (a latency: synchronise, events, one
# call, synchronise) while session 28's pipelined loop put its host time at ~0.6 ms. Medians of 30 samples, ms.
import json, os, statistics, sys, time
sys.path.insert(0, os.getcwd())
import torch
import samu
from tests.helpers import randn, samu_params
dev = "cuda" if torch.cuda.is_available() else "cpu"
samu.set_check_finite(False)
B, L, D = (1, 8192, 1024)
x = randn((B, L, D), 0, device=dev, dtype=torch.bfloat16).requires_grad_(True)
params = [p.requires_grad_(True) for p in samu_params(D, 1, device=dev)]
dy = torch.randn(B, L, D, device=dev, dtype=torch.bfloat16)
leaves = [x, *params]
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
out = {}
def fwd():
    return samu.samu_mixer(x, *params)[0]
def fb_grad():
    return torch.autograd.grad(fwd(), leaves, dy)
def fb_backward():
    fwd().backward(dy)
    for t in leaves: t.grad = None
class Ident(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a): return a.clone()
    @staticmethod
    def backward(ctx, g): return g
a = torch.zeros(16, device=dev, requires_grad=True)
def trivial(): return torch.autograd.grad(Ident.apply(a), [a], torch.ones(16, device=dev))
def latency(name, fn, n=30, spin_ms=0.0):
    for _ in range(3): fn()
    evs, hosts = [], []
    for _ in range(n):
        sync()
        if spin_ms:   # keep the host busy (not asleep in a synchronise) just before the call
            t = time.perf_counter() + spin_ms / 1e3
            while time.perf_counter() < t: pass
        if dev == "cuda":
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        if dev == "cuda":
            e.record(); e.synchronize(); evs.append(s.elapsed_time(e))
        hosts.append((t1 - t0) * 1e3)
    out[name] = {"event_ms": statistics.median(evs) if evs else None, "host_ms": statistics.median(hosts)}
    print(f"{name:44s} event {out[name]['event_ms'] or 0:7.3f}  host {out[name]['host_ms']:7.3f}", flush=True)
def pipelined(name, fn, n=100):
    for _ in range(3): fn()
    sync(); t0 = time.perf_counter()
    for _ in range(n): fn()
    t1 = time.perf_counter(); sync(); t2 = time.perf_counter()
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
