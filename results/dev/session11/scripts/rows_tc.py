"""Exploratory (session 11, issue 11, prepared for the next device call): can a Triton tensor-core product of
M <= 64 rows stream the decode's weights faster than cuBLAS? At batch 64 cuBLAS's products take 412 us of a
0.614 ms step of the 400m preset (1.9 TB/s on 800 MB; results/dev/session11/call2/w/g5-new).

For each of the preset's four product shapes (N outputs, K inputs): 12 distinct bf16 weight matrices in a chain
(each product's input is the previous one's output, cut or padded to K), replayed in a CUDA graph with L2
flushed before each replay, so the weights come from memory as in a decode. cuBLAS (torch.mm) against a Triton
kernel: a program owns BN output columns and the M rows, walks K in BK steps with a pipelined loop (num_stages),
acc += x_tile @ W_tile^T on tensor cores; SPLIT > 1 splits K over programs with fp32 partials summed in a fixed
order by a second kernel. Launched with PDL (sm_90). Plain products only: the prologues (norm, GeGLU) come
after the question is answered.

Writes $W/rows_tc.json (or ./rows_tc.json) and prints a table. Usage: python rows_tc.py [M]
In the interpreter (TRITON_INTERPRET=1, CPU) it only checks the kernels at small shapes."""
import itertools
import json
import os
import sys
import time

import torch
import triton
import triton.language as tl
from triton.language.extra import cuda as tlc

INTERP = os.environ.get("TRITON_INTERPRET", "0") == "1"
DEV = "cpu" if INTERP else "cuda"
OUT = os.path.join(os.environ.get("W", "."), "rows_tc.json")


@triton.jit
def _rows_tc(w, x, y, part, M, N, K, KS, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
             SPLIT: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr):
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    cols_n = pid_n * BN + tl.arange(0, BN)
    rm = tl.arange(0, BM)
    m_n = cols_n < N
    m_m = rm < M
    if PDL:
        tlc.gdc_wait()
        tlc.gdc_launch_dependents()
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    k_lo = pid_k * KS
    for k0 in tl.range(k_lo, k_lo + KS, BK, num_stages=STAGES):
        ck = k0 + tl.arange(0, BK)
        m_k = ck < K
        xt = tl.load(x + rm[:, None] * K + ck[None, :], mask=m_m[:, None] & m_k[None, :], other=0.0)
        # W^T's tile [BK, BN] addressed directly (a tl.trans between the load and the dot kept the loads out
        # of Triton's software pipeline, offline)
        wt = tl.load(w + cols_n[None, :].to(tl.int64) * K + ck[:, None], mask=m_k[:, None] & m_n[None, :],
                     other=0.0)
        acc = tl.dot(xt, wt, acc)
    off = rm[:, None] * N + cols_n[None, :]
    mo = m_m[:, None] & m_n[None, :]
    if SPLIT == 1:
        tl.store(y + off, acc.to(y.dtype.element_ty), mask=mo)
    else:
        tl.store(part + pid_k * M * N + off, acc, mask=mo)


@triton.jit
def _reduce(part, y, MN, SPLIT: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < MN
    if PDL:
        tlc.gdc_wait()
        tlc.gdc_launch_dependents()
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in tl.static_range(SPLIT):
        acc += tl.load(part + s * MN + o, mask=m, other=0.0)
    tl.store(y + o, acc.to(y.dtype.element_ty), mask=m)


def product(x, w, y, part, cfg, pdl):
    """y [M, N] = x [M, K] @ w [N, K]^T with cfg = (BN, BK, STAGES, SPLIT)."""
    M, K = x.shape
    N = w.shape[0]
    BN, BK, STAGES, SPLIT = cfg
    BM = max(16, triton.next_power_of_2(M))
    KS = triton.cdiv(triton.cdiv(K, SPLIT), BK) * BK
    opts = {"launch_pdl": True} if pdl else {}
    _rows_tc[(triton.cdiv(N, BN), SPLIT)](w, x, y, part, M, N, K, KS, BM=BM, BN=BN, BK=BK, SPLIT=SPLIT,
                                          STAGES=STAGES, PDL=pdl, num_warps=4, **opts)
    if SPLIT > 1:
        _reduce[(triton.cdiv(M * N, 1024),)](part, y, M * N, SPLIT=SPLIT, BLOCK=1024, PDL=pdl, num_warps=4, **opts)


def check_small():
    torch.manual_seed(0)
    for (M, N, K), cfg in itertools.product([(5, 40, 70), (16, 33, 130)], [(16, 32, 2, 1), (32, 32, 2, 3)]):
        x = torch.randn(M, K).to(torch.bfloat16)
        w = torch.randn(N, K).to(torch.bfloat16)
        y = torch.empty(M, N, dtype=torch.bfloat16)
        part = torch.empty(cfg[3], M, N)
        product(x.float(), w.float(), y, part, cfg, False)   # the interpreter's bf16 dot multiplies raw bits
        ref = x.double() @ w.double().T
        err = ((y.double() - ref).norm() / ref.norm()).item()
        assert err < 1e-2, (M, N, K, cfg, err)
        print("ok", (M, N, K), cfg, f"{err:.2e}")


def main():
    M = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    shapes = [(3328, 1664), (1664, 1664), (9984, 1664), (1664, 4992)]   # in, out, gate_up, down (400m preset)
    g = torch.Generator(device=DEV).manual_seed(0)
    flush = torch.empty(256 * 2 ** 20, dtype=torch.uint8, device=DEV)
    record = {"M": M, "torch": torch.__version__, "triton": triton.__version__,
              "gpu": torch.cuda.get_device_name(), "rows": []}
    configs = list(itertools.product((32, 64), (64, 128), (3, 5), (1, 2, 4)))
    t0 = time.time()
    for N, K in shapes:
        mats = [(torch.randn(N, K, device=DEV, generator=g) / K ** 0.5).to(torch.bfloat16) for _ in range(12)]
        x0 = torch.randn(M, K, device=DEV, generator=g).to(torch.bfloat16)
        y = torch.empty(M, N, device=DEV, dtype=torch.bfloat16)
        part = torch.empty(4, M, N, device=DEV)
        ref = (x0.float() @ mats[-1].float().T)

        def chain(step):
            x = x0
            for wm in mats:
                step(x, wm)
                x = y[:, :K] if N >= K else torch.nn.functional.pad(y, (0, K - N))
            return y

        def timed(step):
            chain(step)   # compile, warm
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                chain(step)
            times = []
            for _ in range(15):
                flush.zero_()
                a, b = torch.cuda.Event(True), torch.cuda.Event(True)
                a.record()
                graph.replay()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) * 1e3 / len(mats))
            times.sort()
            return times[len(times) // 2]

        def check(step):
            # the last product of a chain started from x0's own input: one product against fp32
            step(x0, mats[-1])
            return ((y.float() - ref).norm() / ref.norm()).item()

        base = timed(lambda x, wm: torch.mm(x, wm.T, out=y))
        row = {"N": N, "K": K, "mb": N * K * 2 / 1e6, "cublas_us": base, "triton": []}
        print(f"N={N} K={K} cublas {base:.2f} us ({N * K * 2 / base / 1e6:.2f} TB/s)", flush=True)
        for cfg in configs:
            if time.time() - t0 > 300:
                break
            try:
                us = timed(lambda x, wm: product(x, wm, y, part, cfg, True))
                err = check(lambda x, wm: product(x, wm, y, part, cfg, True))
            except Exception as e:   # out of shared memory and such: recorded, not fatal
                row["triton"].append({"cfg": cfg, "error": str(e)[:200]})
                continue
            row["triton"].append({"cfg": cfg, "us": us, "rel_err": err})
            print(f"  BN={cfg[0]:3} BK={cfg[1]:3} stages={cfg[2]} split={cfg[3]}  {us:7.2f} us "
                  f"({N * K * 2 / us / 1e6:.2f} TB/s)  err {err:.1e}", flush=True)
        record["rows"].append(row)
        with open(OUT, "w") as f:
            json.dump(record, f, indent=1)
    for row in record["rows"]:
        ok = [t for t in row["triton"] if "us" in t and t["rel_err"] < 1e-2]
        best = min(ok, key=lambda t: t["us"]) if ok else None
        print(f"N={row['N']:5} K={row['K']:5} cublas {row['cublas_us']:7.2f} us  best triton "
              + (f"{best['us']:7.2f} us {best['cfg']}" if best else "none"))


if __name__ == "__main__":
    check_small() if INTERP else main()
