# The torch profiler's host view of an eager SAMU fwd+bwd (session 28): where the backward's host time goes.
import os, sys
sys.path.insert(0, os.getcwd())
import torch
import samu
from tests.helpers import randn, samu_params
samu.set_check_finite(False)
shape = (1, 8192, 1024)
x = randn(shape, 0, device="cuda", dtype=torch.bfloat16)
dy = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
params = samu_params(1024, 1, device="cuda")
leaves = [x, *params]
def fb():
    samu.samu_mixer(x, *params)[0].backward(dy)
    for t in leaves: t.grad = None
for _ in range(5): fb()
torch.cuda.synchronize()
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(20): fb()
    torch.cuda.synchronize()
t = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=70)
print(t)
open(os.path.join(os.environ.get("OUT", "."), "engine.txt"), "w").write(t)
prof.export_chrome_trace(os.path.join(os.environ.get("OUT", "."), "engine_trace.json"))
