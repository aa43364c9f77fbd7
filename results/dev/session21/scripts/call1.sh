#!/usr/bin/env bash
# Session 21, call 1: LEANER's head-dim-96 and fp16 entries (b8947da) and the weight-gradient pass unpipelined
# (5e5ceca) against 4b424ed (tprev, untracked) to the bit; memcheck on the new launches; RG-LRU's GPU tests.
#   HEAD_COMMIT=<hex> bash results/dev/session21/scripts/call1.sh
set -u
cd "$(dirname "$0")/../../../.."
: "${HEAD_COMMIT:?}"
OUT=${OUT:-$PWD/out}
SAMU_GIT_COMMIT=$HEAD_COMMIT PARTS=8 LIMIT=280 bash scripts/gpu_bits.sh rglru tprev > "$OUT/bits.txt" 2>&1
tail -2 "$OUT/bits.txt"
bash scripts/gpu_memcheck.sh rglru triton_chunked 1,32768,1536 1,32768,2048 1,32768,2048:16 1,8192,1024 1,8192,2560 \
  > "$OUT/memcheck-bf16.txt" 2>&1 &
p1=$!
DTYPE=float16 bash scripts/gpu_memcheck.sh rglru triton_chunked 1,8192,1024 1,8192,1536 1,8192,2048 1,8192,2560 \
  > "$OUT/memcheck-fp16.txt" 2>&1 &
p2=$!
wait $p1 $p2
cat "$OUT/memcheck-bf16.txt" "$OUT/memcheck-fp16.txt"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/test_rglru_triton.py --tb=short > "$OUT/gpu_tests.log" 2>&1
tail -5 "$OUT/gpu_tests.log"
tar -czf "$OUT/memcheck.tar.gz" -C "$OUT" memcheck && rm -rf "$OUT/memcheck"
