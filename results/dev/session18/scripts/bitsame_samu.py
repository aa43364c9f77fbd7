"""Session 18, call 7 (issue 15): session 16's bitsame.py with two packed cases of the form training calls (no
states), as call 7 ran it: the SAMU Triton variants' outputs and gradients saved, so that two trees can be compared
to the bit (the one-word chunk bits must not move one). scripts/bitsame.py, for both mixers, supersedes it.
Usage: python bitsame_samu.py ROOT OUT.pt  (imports samu and tests.helpers from ROOT);
       python bitsame_samu.py compare OLD.pt NEW.pt  (each case same or DIFF, and a count)."""
import sys


def compare(old, new):
    import torch

    a, b = torch.load(old), torch.load(new)
    bad = 0
    for k in a:
        same = k in b and len(a[k]) == len(b[k]) and all(torch.equal(u, v) for u, v in zip(a[k], b[k]))
        bad += not same
        print(("same  " if same else "DIFF  ") + k)
    print(f"{len(a) - bad} of {len(a)} cases equal to the bit ({len(b)} new)")


if sys.argv[1] == "compare":
    compare(sys.argv[2], sys.argv[3])
    sys.exit()
root, out = sys.argv[1], sys.argv[2]
sys.path.insert(0, root)
import torch  # noqa: E402

import samu  # noqa: E402
from samu.ops import dispatch  # noqa: E402
from tests.helpers import randn, samu_params  # noqa: E402

assert samu.__file__.startswith(root), samu.__file__
CASES = [  # (B, L, D, dtype, documents, with_state)
    (1, 8192, 1024, torch.bfloat16, 0, False), (1, 8192, 1024, torch.bfloat16, 0, True),
    (4, 2048, 2048, torch.bfloat16, 0, False), (1, 32768, 2048, torch.bfloat16, 0, True),
    (1, 131072, 1024, torch.bfloat16, 0, True), (3, 1000, 96, torch.float32, 0, True),
    (2, 4099, 160, torch.float16, 0, True), (1, 8192, 1024, torch.bfloat16, 16, True),
    (1, 5000, 256, torch.float32, 7, False), (1, 32768, 2048, torch.bfloat16, 16, False),
    (1, 8192, 1024, torch.bfloat16, 256, False),
]
results = {}
for B, L, D, dtype, docs, with_state in CASES:
    for name in ("triton_serial", "triton_grouped"):
        x = randn((B, L, D), 0, dtype=dtype, device="cuda")
        params = [p.requires_grad_(True) for p in samu_params(D, 1, device="cuda")]
        cu = None
        if docs:
            cuts = torch.linspace(0, L, docs + 1).round().to(torch.int32)
            cu = cuts.cuda()
        rows = docs or B
        h0 = randn((rows, D), 2, device="cuda") if with_state else None
        y, h = dispatch.variants("samu")[name].run(x, *params, h0, 2.0, cu_seqlens=cu, final=with_state)
        dy = randn((B, L, D), 3, dtype=dtype, device="cuda", requires_grad=False)
        outs, cots = [y], [dy]
        if with_state:
            outs.append(h)
            cots.append(randn((rows, D), 4, device="cuda", requires_grad=False))
        leaves = [x, *params] + ([h0] if with_state else [])
        grads = torch.autograd.grad(outs, leaves, cots)
        key = f"{name} {B}x{L}x{D} {dtype} docs={docs} state={with_state}"
        results[key] = [t.detach().cpu() for t in (*outs, *grads)]
        print(key, "done", flush=True)
torch.save(results, out)
