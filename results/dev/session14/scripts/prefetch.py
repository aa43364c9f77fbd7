"""Session 14 (issue 11, exploratory, no library change): does prefetching the next product's weights into L2,
from a parallel branch of the decode's CUDA graph, shorten a token's chain of products?

The 400m preset's four products a layer (in 3328x1664, out 1664x1664, gate_up 9984x1664, down 1664x4992; bf16),
12 layers of distinct weights (0.8 GB), chained at M rows (each product's input cut from the previous output),
torch.mm (cuBLAS) in one CUDA graph, L2 flushed before each replay. Modes:
  base   the chain alone
  pfA    before product k, a side stream (waiting on the event before product k) prefetches product k+A's weights
         into L2 (cp.async.bulk.prefetch.L2, 4 KB a thread), so it overlaps product k
Writes $W/prefetch.json and prints microseconds a token (48 products) per M and mode.
Usage: python prefetch.py [M,M,...]"""
import json
import os
import sys

import torch
import triton
import triton.language as tl

W = os.environ.get("W", ".")
SHAPES = [(3328, 1664), (1664, 1664), (9984, 1664), (1664, 4992)]
LINE = 4096


@triton.jit
def _prefetch_bulk(base, sink, lines, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    i = tl.minimum(i, lines - 1)                   # the tail repeats the last line: harmless
    ptr = base + i.to(tl.int64) * 4096
    r = tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], 4096;\n\tmov.u32 $0, 0;", "=r,l", [ptr],
                                  dtype=tl.int32, is_pure=False, pack=1)
    tl.store(sink + tl.arange(0, BLOCK), r, mask=r != 0)   # never stores; keeps the asm


def prefetch(w, sink):
    lines = w.numel() * w.element_size() // LINE
    BLOCK = 128
    _prefetch_bulk[(triton.cdiv(lines, BLOCK),)](w.view(torch.uint8), sink, lines, BLOCK=BLOCK, num_warps=4)


def main():
    Ms = [int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "1,8,64").split(",")]
    g = torch.Generator(device="cuda").manual_seed(0)
    mats = [(torch.randn(N, K, device="cuda", generator=g) / K ** 0.5).to(torch.bfloat16)
            for _ in range(12) for N, K in SHAPES]
    sink = torch.zeros(128, dtype=torch.int32, device="cuda")
    flush = torch.empty(256 * 2 ** 20, dtype=torch.uint8, device="cuda")
    side = torch.cuda.Stream()
    rec = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    for M in Ms:
        x0 = torch.randn(M, 1664, device="cuda", generator=g).to(torch.bfloat16)
        outs = [torch.empty(M, w.shape[0], device="cuda", dtype=torch.bfloat16) for w in mats]

        def chain(ahead):
            x = x0
            main_stream = torch.cuda.current_stream()
            for k, w in enumerate(mats):
                if ahead and k + ahead < len(mats):
                    ev = torch.cuda.Event()
                    ev.record(main_stream)
                    side.wait_event(ev)
                    with torch.cuda.stream(side):
                        prefetch(mats[k + ahead], sink)
                torch.mm(x, w.T, out=outs[k])
                x = outs[k][:, :w.shape[0] if k + 1 == len(mats) else mats[k + 1].shape[1]]
            if ahead:
                done = torch.cuda.Event()
                done.record(side)
                main_stream.wait_event(done)
            return outs[-1]

        def timed(ahead):
            chain(ahead)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                chain(ahead)
            ts = []
            for _ in range(25):
                flush.zero_()
                a, b = torch.cuda.Event(True), torch.cuda.Event(True)
                a.record()
                graph.replay()
                b.record()
                b.synchronize()
                ts.append(a.elapsed_time(b) * 1e3)
            ts.sort()
            return ts[len(ts) // 2], outs[-1].float().clone()

        row = {"M": M}
        base, ref = timed(0)
        row["base_us"] = base
        for ahead in (1, 2):
            try:
                us, out = timed(ahead)
                row[f"pf{ahead}_us"] = us
                row[f"pf{ahead}_same"] = bool(torch.equal(out, ref))
            except Exception as e:  # recorded, not fatal
                row[f"pf{ahead}_error"] = str(e)[:300]
        rec["rows"].append(row)
        with open(os.path.join(W, "prefetch.json"), "w") as f:
            json.dump(rec, f, indent=1)
        print(row, flush=True)
    for row in rec["rows"]:
        print(f"M={row['M']:3} base {row['base_us']:7.1f} us/token  pf1 {row.get('pf1_us', float('nan')):7.1f}  "
              f"pf2 {row.get('pf2_us', float('nan')):7.1f}  (floor {800e6 / 4.2e12 * 1e6:.0f} us)")


if __name__ == "__main__":
    main()
