#!/usr/bin/env bash
# compute-sanitizer's memcheck on one forward + backward of a mixer at each shape, one process a shape, side by side
# (one H200 call; a shape at L = 2,100 took under 30 s in session 20, five at once):
#
#   bash scripts/gpu_memcheck.sh OP BACKEND SHAPE[:DOCS]...     e.g. rglru triton_chunked 1,8192,1024 1,32768,2048:16
#
# bf16 inputs (DTYPE=float16 or float32 for others), no initial state, the final state dropped: the call training
# makes; DOCS > 0 packs the row into that many sequences (samu.gates.inputs.document_offsets). Writes
# $OUT/memcheck/OP-DTYPE-SHAPE-DOCS.log a shape, prints each one's verdict (the first error and the source line memcheck
# names), and exits 1 when any shape has an error or did not finish within LIMIT seconds (default 300).
set -u
cd "$(dirname "$0")/.."
OP=${1:?usage: gpu_memcheck.sh OP BACKEND SHAPE[:DOCS]...}
BACKEND=${2:?usage: gpu_memcheck.sh OP BACKEND SHAPE[:DOCS]...}
shift 2
[ $# -gt 0 ] || { echo "usage: gpu_memcheck.sh OP BACKEND SHAPE[:DOCS]..."; exit 2; }
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT/memcheck"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
[ -n "$CS" ] || { echo "gpu_memcheck.sh: no compute-sanitizer on this machine"; exit 1; }
DRIVER="import sys, torch, samu
sys.path.insert(0, 'scripts')
from gpu_profile import make
samu.set_check_finite(False)
shape, docs = tuple(int(v) for v in sys.argv[1].split(',')), int(sys.argv[2])
_, fb, _ = make('$OP', shape, '$BACKEND', dtype=getattr(torch, '${DTYPE:-bfloat16}'), documents=docs)
fb()
torch.cuda.synchronize()
print('finished', shape, docs)"
pids=()
names=()
for arg in "$@"; do
  shape=${arg%%:*}; docs=0
  [ "$arg" != "$shape" ] && docs=${arg#*:}
  name="$OP-${DTYPE:-bfloat16}-${shape//,/x}-$docs"
  timeout "${LIMIT:-300}" "$CS" --tool memcheck --print-limit 10 python3 -c "$DRIVER" "$shape" "$docs" \
    > "$OUT/memcheck/$name.log" 2>&1 &
  pids+=($!)
  names+=("$name")
done
failed=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"; rc=$?
  log="$OUT/memcheck/${names[$i]}.log"
  if [ $rc -eq 0 ] && grep -q "^finished" "$log" && grep -q "ERROR SUMMARY: 0 errors" "$log"; then
    echo "== ${names[$i]}: no error"
  else
    failed=$((failed + 1))
    echo "== ${names[$i]}: exit $rc; $(grep -m1 -E 'ERROR SUMMARY|Invalid|Error' "$log")"
    grep -m2 -E "at .*\.py:[0-9]+" "$log"
  fi
done
[ "$failed" -eq 0 ] || { echo "$failed of ${#pids[@]} shapes with errors or unfinished"; exit 1; }
