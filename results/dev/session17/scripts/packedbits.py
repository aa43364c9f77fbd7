"""Session 17 (issue 15): the fast RG-LRU variant's packed training form (no states) at (1, 32768, 2048) in 16 and 256
sequences, outputs and gradients saved for a comparison to the bit (session 16's bitsame.py compare); also compiles
what gpu_packed_profile.py times. Usage: python packedbits.py ROOT OUT.pt"""
import sys

root, out = sys.argv[1], sys.argv[2]
sys.path.insert(0, root)
import torch  # noqa: E402

import samu  # noqa: E402
from samu.gates.inputs import document_offsets  # noqa: E402
from samu.ops import dispatch  # noqa: E402
from tests.helpers import randn, rglru_params  # noqa: E402

assert samu.__file__.startswith(root), samu.__file__
results = {}
for docs in (0, 16, 256):
    B, L, D = 1, 32768, 2048
    x = randn((B, L, D), 0, dtype=torch.bfloat16, device="cuda")
    params = [p.requires_grad_(True) for p in rglru_params(D, 16, 1, device="cuda")]
    cu = torch.tensor(document_offsets(L, docs, 1), dtype=torch.int32, device="cuda") if docs else None
    y, _ = dispatch.variants("rglru")["triton_chunked"].run(x, *params, None, 8.0, cu_seqlens=cu, final=False)
    dy = randn((B, L, D), 3, dtype=torch.bfloat16, device="cuda", requires_grad=False)
    grads = torch.autograd.grad([y], [x, *params], [dy])
    results[f"triton_chunked docs={docs}"] = [t.detach().cpu() for t in (y, *grads)]
    print(docs, "done", flush=True)
torch.save(results, out)
