# Session 29, for the next device session (issue 11, batch 64): can a split-K tensor-core product in Triton beat
# cuBLAS on decoding's four product shapes at 8 and 64 rows? At batch 64 on an H100 cuBLAS's products took 487 of the
# 650 us of a step's kernels (results/dev/session28/decode/rows-off-1.log): gate_up 16.1 us a call (2.06 TB/s), down
# 9.0 + 2.4 us of split-K reduction (1.46), the in-projection 7.4 (1.50), the out-projection 5.7 (0.97). Session 28's
# tensor-core rows (BN = 16, whole K a program) lost 4x: x re-read from L2 by every program. Here a program owns BN =
# 64-256 outputs of every row and one of S slices of K, so x is read N / BN times (not N / 16), the grid fills the
# machine through S, and a second launch sums the S fp32 partials in a fixed order (deterministic; S = 1 writes y).
# Timing: a CUDA graph of 12 products on 12 distinct weights (a decode's layers; 12 x 33 MB defeats the L2) replayed
# 20 times, medians of 5, the first 2 dropped; torch.mm (F.linear's product) with PyTorch's default BLAS library
# (its name is printed and recorded) and with cuBLASLt named (preferred_blas_library "cublaslt"), same operands.
# Correctness: each candidate against F.linear in fp32 accumulation, relative error recorded (and TRITON_INTERPRET=1
# on CPU runs the kernels on small shapes: `python skinny.py --check`).
#   OUT=$OUT python results/dev/session29/scripts/skinny.py          (~3 minutes on an H100: 88 compiles)
import itertools, json, os, statistics, sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _splitk_kernel(x, w, part, y, M, N, K, KS, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                   DIRECT: tl.constexpr, UPCAST: tl.constexpr):
    """part[s, :M, cols] = x[:M, slice s of K] @ W[cols, slice s]^T in fp32; DIRECT (one slice): y = that, rounded."""
    i_n, i_s = tl.program_id(0), tl.program_id(1)
    rm = tl.arange(0, BM)
    rn = i_n * BN + tl.arange(0, BN)
    k_lo = i_s * KS
    k_hi = tl.minimum(k_lo + KS, K)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k in tl.range(k_lo, k_hi, BK):
        rk = k + tl.arange(0, BK)
        mk = rk < k_hi
        a = tl.load(x + rm[:, None] * K + rk[None, :], mask=(rm < M)[:, None] & mk[None, :], other=0.0)
        b = tl.load(w + rn[None, :].to(tl.int64) * K + rk[:, None], mask=(rn < N)[None, :] & mk[:, None], other=0.0)
        if UPCAST:   # Triton's interpreter multiplies bf16 matrices as raw integers
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc = tl.dot(a, b, acc)
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    if DIRECT:
        tl.store(y + rm[:, None] * N + rn[None, :], acc.to(y.dtype.element_ty), mask=mask)
    else:
        tl.store(part + (i_s * M + rm[:, None]) * N + rn[None, :], acc, mask=mask)


@triton.jit
def _sum_kernel(part, y, M, N, S, BLOCK: tl.constexpr):
    """y = sum over s of part[s] in order s = 0, 1, ..., rounded once."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < M * N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(S):
        acc += tl.load(part + s * M * N + i, mask=mask, other=0.0)
    tl.store(y + i, acc.to(y.dtype.element_ty), mask=mask)


def splitk(x, w, y, part, BN, BK, S, warps, stages):
    M, K = x.shape
    N = w.shape[0]
    BM = max(16, triton.next_power_of_2(M))
    KS = triton.cdiv(triton.cdiv(K, S), BK) * BK
    S = triton.cdiv(K, KS)
    _splitk_kernel[(triton.cdiv(N, BN), S)](x, w, part, y, M, N, K, KS, BM=BM, BN=BN, BK=BK, DIRECT=S == 1,
                                              UPCAST=INTERPRET, num_warps=warps, num_stages=stages)
    if S > 1:
        BLOCK = 1024
        _sum_kernel[(triton.cdiv(M * N, BLOCK),)](part, y, M, N, S, BLOCK=BLOCK, num_warps=4)


# the 400m preset's decoding products (N outputs, K inputs): in-projection, out-projection, gate_up, down
SHAPES = {"in": (3328, 1664), "out": (1664, 1664), "gate_up": (9984, 1664), "down": (1664, 4992)}
CONFIGS = [dict(BN=BN, BK=BK, S=S, warps=8 if BN == 256 else 4, stages=st)
           for BN, BK, S, st in itertools.product((64, 128, 256), (64, 128), (1, 2, 4, 8), (3, 4))]


def check():
    """Interpreter (or GPU) check of the kernels against F.linear on small odd shapes."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    for M, N, K, cfg in [(5, 70, 100, dict(BN=64, BK=64, S=1, warps=4, stages=3)),
                         (5, 70, 300, dict(BN=64, BK=64, S=3, warps=4, stages=3)),
                         (64, 130, 200, dict(BN=128, BK=64, S=2, warps=4, stages=3))]:
        x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        w = torch.randn(N, K, device=dev, dtype=torch.bfloat16)
        y = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
        part = torch.empty(cfg["S"], M, N, device=dev, dtype=torch.float32)
        splitk(x, w, y, part, **cfg)
        ref = x.double() @ w.double().t()
        err = ((y.double() - ref).abs().max() / ref.abs().max()).item()
        print(f"check M={M} N={N} K={K} {cfg}: max rel err {err:.2e}", flush=True)
        assert err < 1e-2, err


def bench():
    dev = torch.device("cuda")
    out_dir = os.environ.get("OUT", ".")
    records = []
    for M in (64, 8):
        for name, (N, K) in SHAPES.items():
            ws = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(12)]
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            ys = [torch.empty(M, N, device=dev, dtype=torch.bfloat16) for _ in range(12)]
            part = torch.empty(8, M, N, device=dev, dtype=torch.float32)
            ref = F.linear(x.float(), ws[0].float())

            def timed(label, run):
                try:
                    run(0)
                    err = ((ys[0].float() - ref).abs().max() / ref.abs().max()).item()
                    torch.cuda.synchronize()
                    stream = torch.cuda.Stream()
                    stream.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(stream):
                        for i in range(12):
                            run(i)
                    torch.cuda.current_stream().wait_stream(stream)
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g):
                        for i in range(12):
                            run(i)
                    times = []
                    for _ in range(7):
                        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        s.record()
                        for _ in range(20):
                            g.replay()
                        e.record()
                        e.synchronize()
                        times.append(s.elapsed_time(e) / (20 * 12) * 1e3)
                    us = statistics.median(times[2:])
                except Exception as exc:   # a config that does not compile or fit: recorded, not fatal
                    records.append(dict(M=M, product=name, N=N, K=K, candidate=label, error=str(exc)[:200]))
                    return None
                tbs = N * K * 2 / (us * 1e-6) / 1e12
                records.append(dict(M=M, product=name, N=N, K=K, candidate=label, us=us, tb_s=tbs, rel_err=err))
                return us, tbs, err

            default = str(torch.backends.cuda.preferred_blas_library())
            base = timed(f"torch.mm, {default} (default)", lambda i: torch.mm(x, ws[i].t(), out=ys[i]))
            torch.backends.cuda.preferred_blas_library("cublaslt")
            lt = timed("torch.mm, cublaslt", lambda i: torch.mm(x, ws[i].t(), out=ys[i]))
            torch.backends.cuda.preferred_blas_library(default.split(".")[-1].lower())
            best = None
            for cfg in CONFIGS:
                r = timed(f"splitk {cfg}", lambda i, cfg=cfg: splitk(x, ws[i], ys[i], part, **cfg))
                if r and (best is None or r[0] < best[0][0]):
                    best = (r, cfg)
            json.dump(records, open(os.path.join(out_dir, "skinny.json"), "w"), indent=1)
            show = lambda r: f"{r[0]:6.2f} us {r[1]:5.2f} TB/s" if r else "failed"  # noqa: E731
            print(f"M={M:3d} {name:8s} {default}: {show(base)} | cublaslt: {show(lt)} | best splitk: "
                  f"{show(best[0] if best else None)} {best[1] if best else ''}", flush=True)


if __name__ == "__main__":
    check()
    if torch.cuda.is_available() and "--check" not in sys.argv:
        bench()
