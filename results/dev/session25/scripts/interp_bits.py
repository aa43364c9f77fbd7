"""SAMU Triton fwd+bwd outputs at 16 interpreter cases (both variants, bf16 and fp32, packed or not, with states or
without), saved (save FILE) or compared bit for bit with a saved file (check FILE). Session 25 saved them at 11e2b52 and
checked them with patches/mode_table.diff applied: no difference.
  TRITON_INTERPRET=1 PYTHONPATH=. python results/dev/session25/scripts/interp_bits.py save|check FILE"""
import sys, torch
from samu.ops import dispatch
from tests.helpers import randn, samu_params
from samu.gates.inputs import document_offsets
cases = []
for variant in ("triton_grouped", "triton_serial"):
    for (B, L, D), docs, state in (((2, 100, 64), 0, True), ((1, 130, 96), 3, True), ((1, 70, 256), 0, False),
                                   ((1, 90, 64), 4, False)):
        cases.append((variant, (B, L, D), docs, state))
out = {}
for variant, shape, docs, state in cases:
    B, L, D = shape
    for dtype in (torch.bfloat16, torch.float32):
        x = randn(shape, 0, dtype=dtype).requires_grad_(True)
        params = [p.requires_grad_(True) for p in samu_params(D, 1)]
        cu = torch.tensor(document_offsets(L, docs, 1), dtype=torch.int32) if docs else None
        h0 = randn((docs or B, D), 2).requires_grad_(True) if state else None
        y, h = dispatch.variants("samu")[variant].run(x, *params, h0, 2.0, cu_seqlens=cu, final=state)
        outs = [y] + ([h] if state else [])
        gs = [randn(o.shape, 5 + i, dtype=o.dtype) for i, o in enumerate(outs)]
        torch.autograd.backward(outs, gs)
        key = f"{variant}-{shape}-{docs}-{state}-{dtype}"
        grads = [p.grad for p in params] + [x.grad] + ([h0.grad] if state else [])
        out[key] = [t.detach().clone() for t in outs] + [g.clone() for g in grads]
if sys.argv[1] == "save":
    torch.save(out, sys.argv[2]); print("saved", len(out))
else:
    base = torch.load(sys.argv[2]); bad = 0
    for k, v in out.items():
        for i, (a, b) in enumerate(zip(v, base[k])):
            bits = lambda t: t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.uint8)  # noqa: E731
            if not torch.equal(bits(a), bits(b)):
                bad += 1; print("DIFF", k, i, (a.float() - b.float()).abs().max().item())
    print("cases", len(out), "differences", bad)
