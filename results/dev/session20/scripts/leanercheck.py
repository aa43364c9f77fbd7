"""Session 20, call 7: which LEANER entry faults (call 6: an illegal address at head dim 160, and a later one).
One RG-LRU fwd + bwd (bf16, triton_chunked) with one extra LEANER entry set in this process:
    python leanercheck.py PASS HEAD_DIM HOW B,L,D [DOCS]       e.g. dx 160 stage 1,2100,2560
Run it under compute-sanitizer --tool memcheck: it names the kernel and the source line."""
import sys

import torch

import samu
from samu.ops.rglru import triton_fwd
from samu.gates.inputs import document_offsets

sys.path.insert(0, "tests")
from helpers import randn, rglru_params  # noqa: E402

kernel_pass, n, how, shape = sys.argv[1], int(sys.argv[2]), sys.argv[3], tuple(int(v) for v in sys.argv[4].split(","))
docs = int(sys.argv[5]) if len(sys.argv) > 5 else 0
if how != "none":
    triton_fwd.LEANER[kernel_pass][n] = how
DEV = "cuda" if torch.cuda.is_available() else "cpu"   # cpu: TRITON_INTERPRET=1, a smoke test
samu.set_check_finite(False)
x = randn(shape, 0, device=DEV, dtype=torch.bfloat16).requires_grad_()
params = rglru_params(shape[2], 16, 1, device=DEV)
cu = document_offsets(shape[1], docs, 1) if docs else None
y = samu.rglru_mixer(x, *params, backend="triton_chunked", cu_seqlens=cu)[0]
y.backward(torch.randn_like(y))
if DEV == "cuda":
    torch.cuda.synchronize()
print("ok", kernel_pass, n, how, shape, docs, float(x.grad.float().abs().sum()))
