#!/usr/bin/env bash
# One RG-LRU variant judged on one H200 beside a baseline, in one device call (~7.5 minutes at most):
#
#   bash scripts/gpu_rglru_variant.sh VARIANT [BASELINE]      (BASELINE: triton_chunked)
#
#   gates    VARIANT's gates at every gate shape in bf16, fp16 and fp32 (one process per dtype, side by side),
#            and packed (`--documents 16`, bf16 and fp32); beside them the baseline variants' fp32 packed
#            gate at (1, 32768, 1024)
#   bench    `samu bench --scopes fb,packed` of BASELINE and VARIANT side by side at the primary shapes and
#            (1, 32768, 2560) (the packed scope: the batch-1 ones, unpacked and packed into 16 and 256)
#   profile  scripts/gpu_profile.py for both: CUDA-graph and eager times, kernels, registers
#
# Writes $OUT/variant.log and, after every stage (a call cut short keeps what finished), $OUT/results.tar.gz.
# Set SAMU_GIT_COMMIT when .git does not travel.
set -u
cd "$(dirname "$0")/.."
VARIANT=${1:?usage: gpu_rglru_variant.sh VARIANT [BASELINE]}
BASELINE=${2:-triton_chunked}
. scripts/stage.sh
STAGES="${STAGES:-gates bench profile}"
workspace variant.log
GATE=($PY -m samu.cli gate --ops rglru --quiet --no-status)

# side by side; waited for by their process ids (a bare `wait` would also wait for the log's tee)
pids=()
for dtype in bf16 fp16 fp32; do
  stage gates 200 "${GATE[@]}" --shapes gate --dtypes $dtype --backends "$VARIANT" \
    --out "$W/gates-$VARIANT-$dtype.json" & pids+=($!)
done
stage gates 200 "${GATE[@]}" --shapes packed --dtypes bf16,fp32 --backends "$VARIANT" --documents 16 \
  --out "$W/gates-$VARIANT-packed.json" & pids+=($!)
stage gates 200 "${GATE[@]}" --shapes 1x32768x1024 --dtypes fp32 --backends triton_chunked,triton_chunked_precise \
  --documents 16 --out "$W/gates-baseline-packed-fp32.json" & pids+=($!)
wait "${pids[@]}"
save
stage bench 150 $PY -m samu.cli bench --scopes fb,packed --shapes primary,1x32768x2560 --impls "$BASELINE,$VARIANT" \
  --peers none --out "$W/bench-$VARIANT.json" --quiet
save
for backend in "$BASELINE" "$VARIANT"; do
  stage profile 40 $PY scripts/gpu_profile.py --op rglru --backend "$backend" --out "$W" \
    --shapes "1,8192,1024;1,32768,2048;1,32768,2560"
done
save
echo "=== digest"
$PY - "$W" <<'EOF'
import glob, json, sys
for path in sorted(glob.glob(sys.argv[1] + "/gates-*.json")):
    rows = json.load(open(path))["rows"]
    failed = [(r["backend"], r["dtype"], r["shape"]) for r in rows if not r["pass"]]
    print(path.rsplit("/", 1)[-1], f"{sum(r['pass'] for r in rows)}/{len(rows)} pass", failed[:6])
for path in glob.glob(sys.argv[1] + "/bench-*.json"):
    for r in json.load(open(path)).get("rows", []):
        print(r['scope'], r['candidate'], r['shape'], r.get('median_ms'), r.get('floor_ratio'))
EOF
