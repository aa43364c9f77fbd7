"""Session 17 (issue 15): the RG-LRU Triton variant's outputs and gradients at a set of shapes, packed (the form
training runs, without states, and with them) and not, saved, so that two trees can be compared to the bit (the
packed backward's gate a recomputed after the scans must not move a bit).
Usage: python bitsame_rglru.py ROOT OUT.pt  (imports samu and tests.helpers from ROOT);
       python bitsame.py compare OLD.pt NEW.pt  (session 16's comparison)."""
import sys

root, out = sys.argv[1], sys.argv[2]
sys.path.insert(0, root)
import torch  # noqa: E402

import samu  # noqa: E402
from samu.gates.inputs import document_offsets  # noqa: E402
from samu.ops import dispatch  # noqa: E402
from tests.helpers import randn, rglru_params  # noqa: E402

assert samu.__file__.startswith(root), samu.__file__
# (B, L, D, dtype, documents, with_state[, final]): final (the final state asked for, with a cotangent) is with_state
# unless given; the last case (packed, no initial states, a final-state cotangent) was added after call 4
CASES = [
    (1, 8192, 1024, torch.bfloat16, 0, False), (1, 8192, 1024, torch.bfloat16, 16, False),
    (1, 8192, 1024, torch.bfloat16, 16, True), (1, 32768, 2048, torch.bfloat16, 16, False),
    (1, 32768, 2048, torch.bfloat16, 256, False), (1, 5000, 256, torch.float32, 7, False),
    (1, 5000, 256, torch.float32, 7, True), (1, 4099, 1536, torch.float16, 9, False),
    (1, 2100, 2560, torch.bfloat16, 5, False), (1, 8192, 1024, torch.bfloat16, 16, False, True),
]
results = {}
for B, L, D, dtype, docs, with_state, *rest in CASES:
    final = rest[0] if rest else with_state
    for name in dispatch.variants("rglru"):
        x = randn((B, L, D), 0, dtype=dtype, device="cuda")
        params = [p.requires_grad_(True) for p in rglru_params(D, 16, 1, device="cuda")]
        cu = torch.tensor(document_offsets(L, docs, 1), dtype=torch.int32, device="cuda") if docs else None
        rows = docs or B
        h0 = randn((rows, D), 2, device="cuda") if with_state else None
        y, h = dispatch.variants("rglru")[name].run(x, *params, h0, 8.0, cu_seqlens=cu, final=final)
        dy = randn((B, L, D), 3, dtype=dtype, device="cuda", requires_grad=False)
        outs, cots = [y], [dy]
        if final:
            outs.append(h)
            cots.append(randn((rows, D), 4, device="cuda", requires_grad=False))
        leaves = [x, *params] + ([h0] if with_state else [])
        grads = torch.autograd.grad(outs, leaves, cots)
        key = f"{name} {B}x{L}x{D} {dtype} docs={docs} state={with_state}" + (f" final={final}" if rest else "")
        results[key] = [t.detach().cpu() for t in (*outs, *grads)]
        print(key, "done", flush=True)
torch.save(results, out)
