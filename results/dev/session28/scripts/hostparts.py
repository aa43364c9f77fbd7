# Host cost of an eager mixer fwd+bwd, piece by piece, on the GPU's host (session 28): each piece n times, host
# time only (the GPU queue absorbs the launches), microseconds.
import json, os, sys, time
sys.path.insert(0, os.getcwd())
import torch
import samu
from samu.ops import dispatch, gate_status, checks
from samu.ops.samu import function as sf
from samu.ops.rglru import function as rf
from tests.helpers import randn, samu_params, rglru_params

dev = torch.device("cuda", 0)
out = {}
def per(name, fn, n=200, sync_each=0):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    ts = []
    for r in range(5):
        t0 = time.perf_counter()
        for _ in range(n): fn()
        ts.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    out[name] = sorted(ts)[2]
    print(f"{name:40s} {out[name]:8.2f} us", flush=True)

samu.set_check_finite(False)
shape = (1, 8192, 1024)
B, L, D = shape
x = randn(shape, 0, device="cuda", dtype=torch.bfloat16)
dy = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
t32 = torch.empty(1 << 20, device="cuda")
per("torch.empty cuda", lambda: torch.empty(4, 1024, device=dev, dtype=torch.float32), 2000)
per("torch.empty cuda (positional shape)", lambda: torch.empty((4, 1024), device=dev, dtype=torch.float32), 2000)
per("as_strided cuda", lambda: t32.as_strided((4, 1024), (1024, 1), 128), 2000)
per("slice+view cuda", lambda: t32[128:4224].view(4, 1024), 2000)
per("x.new_empty(0, D)", lambda: x.new_empty(0, D, dtype=torch.float32), 2000)
per("float().contiguous()", lambda: t32.float().contiguous(), 2000)
per("cuda.is_available", torch.cuda.is_available, 2000)
per("is_current_stream_capturing", torch.cuda.is_current_stream_capturing, 2000)
per("get_device_properties.mpc", lambda: torch.cuda.get_device_properties(dev).multi_processor_count, 2000)
per("_cuda_getDevice+stream", lambda: torch._C._cuda_getCurrentRawStream(torch._C._cuda_getDevice()), 2000)

class Ident(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a):
        return a.new_empty(a.shape)
    @staticmethod
    def backward(ctx, g):
        return g
for where in ("cuda", "cpu"):
    a = torch.zeros(16, device=where, requires_grad=True)
    g = torch.zeros(16, device=where)
    def fb():
        Ident.apply(a).backward(g)
        a.grad = None
    per(f"trivial autograd fn fwd+bwd {where}", fb, 1000)
    per(f"trivial autograd fn fwd {where}", lambda: Ident.apply(a), 1000)

for op in ("samu", "rglru"):
    params = samu_params(D, 1, device="cuda") if op == "samu" else rglru_params(D, 16, 1, device="cuda")
    fn = samu.samu_mixer if op == "samu" else samu.rglru_mixer
    leaves = [x, *params]
    fn(x, *params)[0].backward(dy)
    print(dispatch.explain(shape, op), flush=True)
    per(f"{op} choose auto", lambda: dispatch.choose(op, B, L, D, x.dtype, x.device, "auto",
                                                     heads=16), 1000)
    c = dispatch.choose(op, B, L, D, x.dtype, x.device, "auto", heads=16)
    if op == "samu":
        per(f"{op} checks", lambda: checks.check_samu_inputs(x, *params, None, 2.0), 1000)
    else:
        per(f"{op} checks", lambda: checks.check_rglru_inputs(x, *params, None, 8.0), 1000)
    per(f"{op} verdict x1", lambda: gate_status.verdict(op, c.variant.name, "bfloat16|L<=8192|D<=1024", x.device), 1000)
    def fwd():
        return fn(x, *params)[0]
    def fb():
        fwd().backward(dy)
        for t in leaves: t.grad = None
    per(f"{op} fwd+bwd eager", fb, 200)
    per(f"{op} fwd eager", fwd, 200)
    with torch.no_grad():
        per(f"{op} fwd eager no_grad", fwd, 200)
        per(f"{op} variant.run no_grad", lambda: c.variant.run(x, *params, None, 2.0 if op == "samu" else 8.0,
                                                               final=False), 200)
    if op == "samu":
        cfg = sf.grouped_config(B, L, D) if c.variant.name == "triton_grouped" else sf.serial_config(B, L, D)
        cl = cfg.as_list()
        ps = [p.detach() for p in params]
        per("samu _fwd direct", lambda: sf._fwd(x.detach(), *ps, None, None, 2.0, cl, False), 200)
        y, fin, ctl, rnorm, bound, count = sf._fwd(x.detach(), *ps, None, None, 2.0, cl, False)
        per("samu _bwd direct", lambda: sf._bwd(dy, None, x.detach(), *ps, False, ctl, rnorm, bound, count, None,
                                                None, 2.0, cl), 200)
    y = fwd()
    def bwd_only():
        y2 = fwd()
        torch.cuda.synchronize()
    # the backward alone: forward outside the timed region
    ys = [fwd() for _ in range(100)]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for yy in ys:
        yy.backward(dy)
        for t in leaves: t.grad = None
    out[f"{op} backward() alone"] = (time.perf_counter() - t0) / len(ys) * 1e6
    print(f"{op} backward() alone {out[f'{op} backward() alone']:.2f} us", flush=True)
    del ys
    torch.cuda.synchronize()
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "hostparts.json"), "w"), indent=1)
