#!/usr/bin/env bash
# Whether a change moves a mixer's bits on one H200 (scripts/bitsame.py): OLD, an untracked copy of an earlier tree
# inside this checkout (`git archive C samu tests scripts | tar -x -C OLD`: untracked folders travel to the device),
# and this checkout each run the cases in PARTS processes, all side by side (the compiling, not the GPU, is what
# takes the time: one process a tree ran past 240 s on a fresh machine in session 19), then compare to the bit.
#
#   bash scripts/gpu_bits.sh OP OLD        OP: samu or rglru; LIMIT (default 450 s) bounds each process, PARTS
#                                          (default 4) the processes a tree
#
# Each process writes one file a case as it finishes, so a run cut short still compares what finished; a case
# missing from either side, or a process that failed or ran past the limit, fails the comparison. Writes $OUT/bits-OP.log, $OUT/w/same-OP.txt and
# $OUT/results.tar.gz; exits 1 when a case differs or is missing.
set -u
cd "$(dirname "$0")/.."
OP=${1:?usage: gpu_bits.sh samu|rglru OLD}
OLD=$(cd "${2:?usage: gpu_bits.sh samu|rglru OLD}" && pwd) || exit 1
. scripts/stage.sh
STAGES=bits
workspace "bits-$OP.log"
PARTS=${PARTS:-4}
rm -rf "$W/bits-old" "$W/bits-new"   # no case file of an earlier run is compared as this one's
pids=()
for tree in old new; do
  root=$PWD
  [ "$tree" = old ] && root=$OLD
  for ((k = 0; k < PARTS; k++)); do
    stage bits "${LIMIT:-450}" env PYTHONPATH="$root" $PY scripts/bitsame.py save --op "$OP" --part "$k/$PARTS" \
      "$root" "$W/bits-$tree" > "$W/bits-$tree-$k.log" 2>&1 &
    pids+=($!)
  done
done
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=$((failed + 1)); done
$PY scripts/bitsame.py compare --op "$OP" "$W/bits-old" "$W/bits-new" > "$W/same-$OP.txt" 2>&1
rc=$?
[ "$failed" -eq 0 ] || { echo "$failed of $((2 * PARTS)) bitsame processes failed or ran past the limit"; rc=1; }
rm -rf "$W/bits-old" "$W/bits-new"
save
echo "== $OP bits, old against new: $(tail -1 "$W/same-$OP.txt")"
exit $rc
