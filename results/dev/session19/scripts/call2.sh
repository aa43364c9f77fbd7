#!/usr/bin/env bash
# Session 19, call 2: the rest of plan item 0b (docs/performance.md): SAMU's unpacked gate classes with the
# |no_state call, each dtype in two processes (the primary and length shapes; the rest of the gate set), and what
# call 1 left of RG-LRU's: fp32 at 1x65536x2048 (cut at the limit), and the model shapes outside the gate set
# (prefill: 64x512x1664 and 1x32768x1664 in every dtype; the small preset's 16x2048x512 and 4x8192x512 in bf16).
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session19/scripts/call2.sh
set -u
cd "$(dirname "$0")/../../../.."
. scripts/stage.sh
STAGES="gates"
workspace call2.log
pids=()
GATE=($PY -m samu.cli gate --quiet --no-status --backends variants)
for dtype in bfloat16 float16 float32; do
  stage gates ${LIMIT:-500} "${GATE[@]}" --ops samu --dtypes $dtype --shapes primary,length \
    --out $W/gates-p-samu-$dtype-a.json > $W/gates-samu-$dtype-a.log 2>&1 &
  pids+=($!)
  stage gates ${LIMIT:-500} "${GATE[@]}" --ops samu --dtypes $dtype --shapes gate,-primary,-length \
    --out $W/gates-p-samu-$dtype-b.json > $W/gates-samu-$dtype-b.log 2>&1 &
  pids+=($!)
done
stage gates ${LIMIT:-500} "${GATE[@]}" --ops rglru --dtypes float32 --shapes 1x65536x2048 \
  --out $W/gates-p-rglru-float32-c.json > $W/gates-rglru-float32-c.log 2>&1 &
pids+=($!)
stage gates ${LIMIT:-500} "${GATE[@]}" --ops rglru --shapes 64x512x1664,1x32768x1664 \
  --out $W/gates-p-rglru-prefill.json > $W/gates-rglru-prefill.log 2>&1 &
pids+=($!)
stage gates ${LIMIT:-500} "${GATE[@]}" --ops rglru --dtypes bfloat16 --shapes 16x2048x512,4x8192x512 \
  --out $W/gates-p-rglru-small.json > $W/gates-rglru-small.log 2>&1 &
pids+=($!)
for p in "${pids[@]}"; do wait $p; done
save
for f in $W/gates-*.log; do
  echo "== $(basename $f): $(grep -c '^PASS' $f) PASS, $(grep -c '^FAIL' $f) FAIL; $(grep '=== gates: exit' $f | tail -1)"
done
