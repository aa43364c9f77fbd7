"""Whether a change moves a mixer's bits on the GPU: every Triton variant's outputs and gradients over a set of
cases, saved by each tree, then compared to the bit. Unchanged bits let the gate records of the code before speak
for the change (scripts/sass_same.py is the offline check of the machine code; this one runs it).

The cases: unpacked and packed (offsets from samu.gates.inputs.document_offsets: a one-token first sequence, the
others cut at random, so sequences open on every token of a chunk), with and without initial states, with and
without a final-state cotangent (each a form the kernels compile apart), bf16, fp16 and fp32, L up to 131,072.

Usage: python scripts/bitsame.py save --op samu|rglru ROOT DIR [--part K/N]   (imports samu and tests.helpers from
           ROOT; one file a case in DIR, written as it finishes, so a run cut short keeps what finished; --part runs
           the cases i with i % N == K, so N processes a tree share the compiling; run the trees side by side)
       python scripts/bitsame.py compare --op OP A B   (each variant run same or DIFF, each case missing from a
           side; exit 1 unless every case of OP is in both folders and equal to the bit)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# (B, L, D, dtype, documents (0: unpacked), initial states, final state with its cotangent)
CASES = {
    "samu": [
        (1, 8192, 1024, "bfloat16", 0, False, False), (1, 8192, 1024, "bfloat16", 0, True, True),
        (4, 2048, 2048, "bfloat16", 0, False, False), (1, 32768, 2048, "bfloat16", 0, True, True),
        (1, 131072, 1024, "bfloat16", 0, True, True), (3, 1000, 96, "float32", 0, True, True),
        (2, 4099, 160, "float16", 0, True, True), (1, 8192, 1024, "bfloat16", 16, True, True),
        (1, 5000, 256, "float32", 7, False, False), (1, 32768, 2048, "bfloat16", 16, False, False),
        (1, 8192, 1024, "bfloat16", 256, False, False), (1, 5000, 256, "float32", 7, True, False),
        (1, 5000, 256, "bfloat16", 7, False, True), (2, 40, 2048, "bfloat16", 0, True, True),
    ],
    "rglru": [
        (1, 8192, 1024, "bfloat16", 0, False, False), (1, 8192, 1024, "bfloat16", 16, False, False),
        (1, 8192, 1024, "bfloat16", 16, True, True), (1, 32768, 2048, "bfloat16", 16, False, False),
        (1, 32768, 2048, "bfloat16", 256, False, False), (1, 5000, 256, "float32", 7, False, False),
        (1, 5000, 256, "float32", 7, True, True), (1, 4099, 1536, "float16", 9, False, False),
        (1, 2100, 2560, "bfloat16", 5, False, False), (1, 8192, 1024, "bfloat16", 16, False, True),
        (2, 4099, 2048, "bfloat16", 0, True, True), (1, 5000, 256, "float32", 7, True, False),
        (2, 4099, 2048, "float32", 0, True, True), (1, 4099, 1536, "float16", 0, False, False),
        (1, 2100, 2560, "bfloat16", 0, True, True), (1, 4099, 1536, "bfloat16", 0, False, False),
        (1, 4099, 1024, "float16", 0, False, False), (2, 4099, 2048, "float16", 0, True, True),
        (1, 2100, 2560, "float16", 0, False, False),
    ],
}
HEADS = 16


def save(op: str, root: str, out: str, device: str = "cuda", part: str = "0/1"):
    sys.path.insert(0, root)
    import torch

    import samu
    from samu.gates.inputs import document_offsets
    from samu.ops import dispatch
    from tests.helpers import randn, rglru_params, samu_params

    assert Path(samu.__file__).resolve().parents[1] == Path(root).resolve(), f"samu imported from {samu.__file__}"
    k, n = _part(part)
    os.makedirs(out, exist_ok=True)
    for i, (B, L, D, dname, docs, with_state, final) in enumerate(CASES[op]):
        if i % n != k:
            continue
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
        results = {}
        for name, variant in sorted(dispatch.variants(op).items()):
            y, h = variant.run(x, *params, h0, 2.0 if op == "samu" else 8.0, cu_seqlens=cu, final=final)
            outs = [y, h] if final else [y]
            grads = torch.autograd.grad(outs, leaves, cots)
            key = f"{name} {B}x{L}x{D} {dname} docs={docs} state={with_state} final={final}"
            results[key] = [t.detach().cpu() for t in (*outs, *grads)]
            print(key, "done", flush=True)
        # written beside and renamed: a file in DIR is a whole case
        path = os.path.join(out, f"case{i:03d}.pt")
        torch.save(results, path + ".tmp")
        os.replace(path + ".tmp", path)


def _part(text: str) -> tuple[int, int]:
    k, _, n = text.partition("/")
    if not (k.isdigit() and n.isdigit() and int(k) < int(n)):
        raise SystemExit(f"bitsame.py: --part must be K/N with 0 <= K < N, got {text!r}")
    return int(k), int(n)


def _case_files(folder: str) -> dict:
    """case index -> path of its file in ``folder`` (none if the folder does not exist)."""
    if not os.path.isdir(folder):
        return {}
    return {int(name[4:7]): os.path.join(folder, name) for name in os.listdir(folder)
            if name.startswith("case") and name.endswith(".pt")}


def compare(op: str, a_path: str, b_path: str) -> int:
    """Every case of ``op`` in both folders, to the bit; a case missing from either side fails, as does a differing
    one (so a run in which nothing finished never reads as the same bits)."""
    import torch

    files_a, files_b = _case_files(a_path), _case_files(b_path)
    same = runs = missing = 0
    for i, case in enumerate(CASES[op]):
        if i not in files_a or i not in files_b:
            print(f"missing from {' and '.join(s for s, got in (('A', files_a), ('B', files_b)) if i not in got)}  "
                  f"case {i} {case}")
            missing += 1
            continue
        # one case of each side in memory at a time (a long case's outputs and gradients take gigabytes)
        a, b = torch.load(files_a[i]), torch.load(files_b[i])
        for key in sorted(set(a) | set(b)):
            equal = key in a and key in b and len(a[key]) == len(b[key]) and all(
                torch.equal(u, v) for u, v in zip(a[key], b[key]))
            print(("same  " if equal else "DIFF  ") + key)
            same += equal
            runs += 1
    print(f"{same} of {runs} variant runs equal to the bit; {missing} of {len(CASES[op])} cases missing")
    return 0 if runs and same == runs and not missing else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("save")
    s.add_argument("--op", choices=sorted(CASES), required=True)
    s.add_argument("root")
    s.add_argument("out", help="folder: one file a case")
    s.add_argument("--part", default="0/1", help="K/N: the cases i with i %% N == K")
    s.add_argument("--device", default="cuda", help="cpu: the Triton interpreter (TRITON_INTERPRET=1), small cases only")
    c = sub.add_parser("compare")
    c.add_argument("--op", choices=sorted(CASES), required=True)
    c.add_argument("a")
    c.add_argument("b")
    args = ap.parse_args()
    if args.cmd == "save":
        save(args.op, args.root, args.out, args.device, args.part)
    else:
        sys.exit(compare(args.op, args.a, args.b))


if __name__ == "__main__":
    main()
