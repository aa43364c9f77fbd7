"""Whether a change moves a mixer's bits on the GPU: every Triton variant's outputs and gradients over a set of
cases, saved by each tree, then compared to the bit. Unchanged bits let the gate records of the code before speak
for the change (scripts/sass_same.py is the offline check of the machine code; this one runs it).

The cases: unpacked and packed (offsets from samu.gates.inputs.document_offsets: a one-token first sequence, the
others cut at random, so sequences open on every token of a chunk), with and without initial states, with and
without a final-state cotangent (each a form the kernels compile apart), bf16, fp16 and fp32, L up to 131,072.

Usage: python scripts/bitsame.py save --op samu|rglru ROOT OUT.pt   (imports samu and tests.helpers from ROOT;
                                                                       run two trees side by side, each its own)
       python scripts/bitsame.py compare A.pt B.pt                  (each case same or DIFF, then a count)
"""

from __future__ import annotations

import argparse
import sys

# (B, L, D, dtype, documents (0: unpacked), initial states, final state with its cotangent)
CASES = {
    "samu": [
        (1, 8192, 1024, "bfloat16", 0, False, False), (1, 8192, 1024, "bfloat16", 0, True, True),
        (4, 2048, 2048, "bfloat16", 0, False, False), (1, 32768, 2048, "bfloat16", 0, True, True),
        (1, 131072, 1024, "bfloat16", 0, True, True), (3, 1000, 96, "float32", 0, True, True),
        (2, 4099, 160, "float16", 0, True, True), (1, 8192, 1024, "bfloat16", 16, True, True),
        (1, 5000, 256, "float32", 7, False, False), (1, 32768, 2048, "bfloat16", 16, False, False),
        (1, 8192, 1024, "bfloat16", 256, False, False), (1, 5000, 256, "float32", 7, True, False),
        (1, 5000, 256, "bfloat16", 7, False, True),
    ],
    "rglru": [
        (1, 8192, 1024, "bfloat16", 0, False, False), (1, 8192, 1024, "bfloat16", 16, False, False),
        (1, 8192, 1024, "bfloat16", 16, True, True), (1, 32768, 2048, "bfloat16", 16, False, False),
        (1, 32768, 2048, "bfloat16", 256, False, False), (1, 5000, 256, "float32", 7, False, False),
        (1, 5000, 256, "float32", 7, True, True), (1, 4099, 1536, "float16", 9, False, False),
        (1, 2100, 2560, "bfloat16", 5, False, False), (1, 8192, 1024, "bfloat16", 16, False, True),
        (2, 4099, 2048, "bfloat16", 0, True, True), (1, 5000, 256, "float32", 7, True, False),
        (2, 4099, 2048, "float32", 0, True, True), (1, 4099, 1536, "float16", 0, False, False),
    ],
}
HEADS = 16


def save(op: str, root: str, out: str, device: str = "cuda"):
    sys.path.insert(0, root)
    import torch

    import samu
    from samu.gates.inputs import document_offsets
    from samu.ops import dispatch
    from tests.helpers import randn, rglru_params, samu_params

    assert samu.__file__.startswith(root), f"samu imported from {samu.__file__}, not from {root}"
    results = {}
    for B, L, D, dname, docs, with_state, final in CASES[op]:
        # one set of inputs per case, shared by the variants (leaves: torch.autograd.grad leaves no .grad behind)
        dtype = getattr(torch, dname)
        x = randn((B, L, D), 0, dtype=dtype, device=device)
        params = samu_params(D, 1, device=device) if op == "samu" else rglru_params(D, HEADS, 1, device=device)
        params = [p.requires_grad_(True) for p in params]
        cu = torch.tensor(document_offsets(L, docs, 1), dtype=torch.int32, device=device) if docs else None
        rows = docs or B
        h0 = randn((rows, D), 2, device=device) if with_state else None
        cots = [randn((B, L, D), 3, dtype=dtype, device=device, requires_grad=False)]
        cots += [randn((rows, D), 4, device=device, requires_grad=False)] if final else []
        leaves = [x, *params] + ([h0] if with_state else [])
        for name, variant in sorted(dispatch.variants(op).items()):
            y, h = variant.run(x, *params, h0, 2.0 if op == "samu" else 8.0, cu_seqlens=cu, final=final)
            outs = [y, h] if final else [y]
            grads = torch.autograd.grad(outs, leaves, cots)
            key = f"{name} {B}x{L}x{D} {dname} docs={docs} state={with_state} final={final}"
            results[key] = [t.detach().cpu() for t in (*outs, *grads)]
            print(key, "done", flush=True)
    torch.save(results, out)


def compare(a_path: str, b_path: str) -> int:
    import torch

    a, b = torch.load(a_path), torch.load(b_path)
    differ = 0
    for key in a:
        same = key in b and len(a[key]) == len(b[key]) and all(torch.equal(u, v) for u, v in zip(a[key], b[key]))
        differ += not same
        print(("same  " if same else "DIFF  ") + key)
    missing = [key for key in b if key not in a]
    print(f"{len(a) - differ} of {len(a)} cases equal to the bit" + (f"; {len(missing)} only in B" if missing else ""))
    return 1 if differ or missing else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("save")
    s.add_argument("--op", choices=sorted(CASES), required=True)
    s.add_argument("root")
    s.add_argument("out")
    s.add_argument("--device", default="cuda", help="cpu: the Triton interpreter (TRITON_INTERPRET=1), small cases only")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    args = ap.parse_args()
    if args.cmd == "save":
        save(args.op, args.root, args.out, args.device)
    else:
        sys.exit(compare(args.a, args.b))


if __name__ == "__main__":
    main()
