#!/usr/bin/env bash
# Issue 14's study on one H200 through the device tool, in calls of under 10 minutes each:
#
#   bash scripts/gpu_compare.sh SECONDS
#
# Within SECONDS: gates RG-LRU's Triton kernels at the small preset's training shapes (no committed record
# covers width 512 with 16 heads; without one, dispatch would gate them on first use or run the torch
# path), then runs or resumes the default study (`samu compare` with no options but its folders), then,
# once it is done, one arm again in a folder of its own (SAMU at L = 2048, both seeds: the rerun). Each part
# stops by SIGINT when the time is up (the run in progress saves a checkpoint after its step), and a later
# call on the same warm machine resumes it.
#
# Returns $OUT/compare.log, gates-small.json, and study.tar.gz / rerun.tar.gz: every finished run's log.json
# and positions.json (such a run is kept from those two alone), so that on a fresh machine a call resumes
# from them when they travel as compare-carry/{study,rerun}.tar.gz (carry compare-carry): an unfinished
# run starts again there. A finished study's record and figures come back in record.tar.gz, the
# rerun's in rerun-record.tar.gz. Set SAMU_GIT_COMMIT when .git does not travel.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/out}"
BUDGET=${1:?seconds}
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
W=/tmp/compare-records
mkdir -p "$W"
exec > >(tee -a "$OUT/compare.log") 2>&1

left() { echo $((BUDGET - SECONDS)); }

# part NAME FOLDER ARGS...: run or resume `samu compare ARGS` in /tmp/NAME for the time left (minus a
# minute for the SIGINT's checkpoint and the archives), then archive its small files
part() {
  local name=$1 folder=/tmp/$1 limit=$(( $(left) - 60 )); shift
  if [ ! -d "$folder" ] && [ -f "compare-carry/$name.tar.gz" ]; then
    mkdir -p "$folder" && tar -xzf "compare-carry/$name.tar.gz" -C "$folder" && echo "=== $name: from compare-carry"
  fi
  if [ "$limit" -lt 60 ]; then echo "=== $name: no time left"; return 1; fi
  local start=$SECONDS
  timeout --signal=INT --kill-after=40 "$limit" $PY -m samu.cli compare --no-progress --out "$folder" \
    --results "$W/$name-record" ${COMPARE_ARGS:-} "$@"
  local rc=$?
  echo "=== $name: exit $rc after $((SECONDS - start))s"
  # finished runs only: an unfinished run's log without its checkpoint would not resume
  (cd "$folder" && tar -czf "$OUT/$name.tar.gz" study.json \
    $(for d in */; do [ -f "${d%/}/positions.json" ] && echo "${d%/}/log.json ${d%/}/positions.json"; done))
  [ -d "$W/$name-record" ] && tar -czf "$OUT/$name-record.tar.gz" -C "$W/$name-record" .
  return $rc
}

# once a machine: the gates' verdicts go to samu's cache folder there, which dispatch reads
if [ "${GATE:-1}" = 1 ] && [ ! -f /tmp/gated-small ]; then
  start=$SECONDS
  timeout 150 $PY -m samu.cli gate --quiet --ops rglru --shapes 16x2048x512,4x8192x512 --dtypes bf16 \
    --backends variants --out "$OUT/gates-small.json" && touch /tmp/gated-small
  echo "=== gate: exit $? after $((SECONDS - start))s"
fi
part study && part rerun --arms samu --long-seq-len 0
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
