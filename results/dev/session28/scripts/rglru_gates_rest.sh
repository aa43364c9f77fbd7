#!/usr/bin/env bash
# For the next device session (written in session 28, not yet run): RG-LRU's fp16 and fp32 gates on the H100 at the
# gate shapes that sessions 27 and 28 did not reach (their shards were cut at ~500 s, each run starting from the
# first shape: results/gates/2026-12-05-h100-gates-b-rglru-*.json hold 12 of 24 fp16 and 8 of 24 fp32 shapes, all
# passing). Three `samu gate` processes side by side on the one GPU, each under 540 s (fp16's 12 shapes took 442 s of
# gating, fp32's 8 took 396 s), each writing its own record under $OUT/gates (copy them to results/gates/ as
# 2026-12-0X-h100-gates-c-rglru-*.json, then `samu gate --status-only --status samu/gates/status.json` and
# `samu report`). Run from the repository root: bash results/dev/session28/scripts/rglru_gates_rest.sh
set -u
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT/gates"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" SAMU_AUTO_GATE=0
F16=1x16x1664,8x16x1664,64x16x1664,1x512x1664,8x512x1664,64x512x1664,1x32768x1664,16x256x128,16x256x512,16x256x1664
F16=$F16,1x8192x2048,1x65536x2048
F32A=1x32768x1536,1x32768x2560,4x2048x1664,1x8192x1664,1x16x1664,8x16x1664,64x16x1664,1x512x1664
F32B=8x512x1664,64x512x1664,1x32768x1664,16x256x128,16x256x512,16x256x1664,1x8192x2048,1x65536x2048
gate() {  # name dtype shapes
  timeout --signal=INT --kill-after=15 540 python3 -m samu.bench gate --ops rglru --dtypes "$2" --shapes "$3" \
    --backends variants --quiet --no-status --out "$OUT/gates/$1.json" > "$OUT/gates/$1.log" 2>&1
  echo "$1 exit $?"
}
gate rglru-float16 float16 "$F16" &
p1=$!
gate rglru-float32-a float32 "$F32A" &
p2=$!
gate rglru-float32-b float32 "$F32B" &
p3=$!
wait $p1 $p2 $p3
tail -n 2 "$OUT"/gates/*.log
