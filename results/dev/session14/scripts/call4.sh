#!/usr/bin/env bash
# Session 14, call 4 (issue 13's gates): RG-LRU's two Triton variants gated in both calls (the call that returns
# the final state and takes its cotangent, and the training call without it: `samu gate` judges both since
# 2c89326) at every gate shape in bf16, fp16 and fp32, packed (16 documents, bf16 and fp32), the model's prefill
# shapes and the small preset's; beside them the RG-LRU kernel tests on the GPU. scripts/gpu_change.sh's tests and
# gates stages with a longer limit (470 s: the first-call-only gates of 2026-12-02 took up to ~300 s). From the
# repository root (since then `STAGES="tests gates" LIMIT=470 bash scripts/gpu_change.sh rglru` runs the same):
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session14/scripts/call4.sh
set -u
cd "$(dirname "$0")/../../../.."
STAGES="tests gates"
. scripts/stage.sh
workspace call4.log
LIMIT=470
GATE=($PY -m samu.cli gate --ops rglru --quiet --no-status --backends triton_chunked,triton_chunked_precise)
pids=()
stage tests $LIMIT $PY -m pytest -q -p no:cacheprovider --tb=short -m "gpu or not gpu" tests/ops/test_rglru_triton.py \
  > "$W/tests.log" 2>&1 & pids+=($!)
for dtype in bf16 fp16 fp32; do
  stage gates $LIMIT "${GATE[@]}" --shapes gate --dtypes $dtype --out "$W/gates-rglru-$dtype.json" & pids+=($!)
done
stage gates $LIMIT "${GATE[@]}" --shapes packed --dtypes bf16,fp32 --documents 16 --out "$W/gates-rglru-packed.json" &
pids+=($!)
stage gates $LIMIT "${GATE[@]}" --shapes 64x512x1664,1x32768x1664 --out "$W/gates-rglru-prefill.json" & pids+=($!)
stage gates $LIMIT "${GATE[@]}" --shapes 16x2048x512,4x8192x512 --dtypes bf16 --out "$W/gates-rglru-small.json" &
pids+=($!)
wait "${pids[@]}"
tail -25 "$W/tests.log"
save
$PY - "$W" <<'PYEOF'
import glob, json, sys
for path in sorted(glob.glob(sys.argv[1] + "/gates-*.json")):
    try:
        record = json.load(open(path))
    except (OSError, ValueError) as e:
        print(path.rsplit("/", 1)[-1], "unreadable:", e)
        continue
    rows = record["rows"]
    failed = [(r["backend"], r["dtype"], r["shape"], [k for k, v in r["passed"].items() if not v]) for r in rows
              if not r["pass"]]
    print(path.rsplit("/", 1)[-1], f"{sum(r['pass'] for r in rows)}/{len(rows)} pass",
          "complete" if record.get("complete") else "INCOMPLETE (cut short)", failed[:6])
PYEOF
