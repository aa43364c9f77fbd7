"""Session 14 (issue 13, a prediction, no kernel of samu's): the tensor-core products of an RG-LRU built from
cuBLAS products (bf16 input and output; the gates and dW at fp32 accuracy: weights as three bf16 parts, cotangents
as three; dx at the order a bf16 dx needs, as the shipped kernel's) and elementwise scan passes, at (1, 32768, 2048),
16 heads of 128. The inputs are made head-major and the [x, x, x] copy in advance: no copy is timed, so the sum is
a lower bound. Times each product (CUDA events, median of 20) and writes $W/gemmdesign.json:
  fwd_gates   x_h [L, n] @ [Wa parts | Wx parts] [n, 6n] -> fp32 [L, 6n]   (the three parts' sums left out)
  fwd_gates_k [x, x, x] [L, 3n] @ [W_hi; W_mid; W_lo] [3n, 2n] -> fp32 [L, 2n] (parts summed by the GEMM)
  dx          [dza parts | dzx parts] [L, 6n] @ [6n, n] -> bf16 [L, n]
  dw          x_h^T [n, S] @ dz parts [S, 6n] per slice of S tokens -> fp32 [L/S, n, 6n], then summed
"""
import json
import os

import torch

L, D, H = 32768, 2048, 16
n = D // H
W = os.environ.get("W", ".")
dev = "cuda"
bf = torch.bfloat16
torch.manual_seed(0)


def timed(fn, reps=20):
    for _ in range(3):
        fn()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


x = torch.randn(H, L, n, device=dev, dtype=bf)
w6 = torch.randn(H, n, 6 * n, device=dev, dtype=bf)
x3 = torch.randn(H, L, 3 * n, device=dev, dtype=bf)
w3 = torch.randn(H, 3 * n, 2 * n, device=dev, dtype=bf)
dz = torch.randn(H, L, 6 * n, device=dev, dtype=bf)
wt = torch.randn(H, 6 * n, n, device=dev, dtype=bf)
rec = {"shape": [1, L, D], "heads": H}
rec["fwd_gates"] = timed(lambda: torch.bmm(x, w6, out_dtype=torch.float32))
rec["fwd_gates_k"] = timed(lambda: torch.bmm(x3, w3, out_dtype=torch.float32))
rec["dx"] = timed(lambda: torch.bmm(dz, wt))
for S in (512, 2048, 8192):
    xs = x.view(H, L // S, S, n).transpose(-1, -2).reshape(H * L // S, n, S)
    ds = dz.view(H * L // S, S, 6 * n)
    rec[f"dw_S{S}"] = timed(lambda: torch.bmm(xs, ds, out_dtype=torch.float32).view(H, L // S, n, 6 * n).sum(1))
# the elementwise passes' bandwidth: read fp32 [L, 2n] per head and bf16 x, write bf16 y (one pass of the scan)
za = torch.randn(H, L, 2 * n, device=dev)
rec["pass_read_fp32_gates"] = timed(lambda: (za[..., :n] * za[..., n:]).to(bf))
flop = {"fwd_gates": 2 * L * n * 6 * n * H, "fwd_gates_k": 2 * L * 3 * n * 2 * n * H, "dx": 2 * L * 6 * n * n * H,
        "dw_S512": 2 * L * 6 * n * n * H}
rec["tflops"] = {k: flop[k] / rec[k] / 1e9 for k in flop}
with open(os.path.join(W, "gemmdesign.json"), "w") as f:
    json.dump(rec, f, indent=1)
for k, v in rec.items():
    if isinstance(v, float):
        print(f"{k:24} {v * 1e3:9.1f} us")
print("TFLOP/s", {k: round(v) for k, v in rec["tflops"].items()})
