#!/usr/bin/env bash
# Session 20, call 7: compute-sanitizer memcheck on each LEANER entry call 6 tried and HEAD does not keep.
#   bash results/dev/session20/scripts/call7.sh      (writes $OUT/memcheck-*.log)
cd "$(dirname "$0")/../../../.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
S=results/dev/session20/scripts/leanercheck.py
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
run() {  # NAME ARGS...
  local name=$1; shift
  timeout 200 $CS --tool memcheck --print-limit 5 python3 $S "$@" > "$OUT/memcheck-$name.log" 2>&1
  echo "== $name (exit $?): $(grep -m1 -E '^ok|Invalid|ERROR SUMMARY' "$OUT/memcheck-$name.log")"
  grep -m3 -E "at .*\.py:[0-9]+|in _rglru" "$OUT/memcheck-$name.log" | head -3
}
run base160 bwd_summary 160 stage 1,2100,2560 &
run bwdsum160cap bwd_summary 160 cap 1,2100,2560 &
run dx160stage dx 160 stage 1,2100,2560 &
run sum96cap summary 96 cap 1,2100,1536 &
run sum64cap summary 64 cap 1,2100,1024 &
for p in $(jobs -p); do wait $p; done
echo "== done"
