#!/usr/bin/env bash
# Session 19, call 5 (issues 13 and 15): RG-LRU's kernels address a channel tile's tokens from one pointer a thread
# plus a constant a token (triton_fwd._tile_ptrs). Call 4's Nsight Compute profile found the weight-gradient kernel
# waiting most on 64-bit per-token addresses reloaded from spilled local memory; offline its spills drop 198 -> 162
# words (packed 218 -> 172) and the forward chunk kernels' registers 180 / 211 -> 147 / 153.
# tprev/ = the tree before (untracked: git archive <commit> samu tests scripts | tar -x -C tprev).
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session19/scripts/call5.sh
# 1. bits: scripts/bitsame.py --op rglru for tprev and HEAD side by side (addresses only: the bits must not move);
# 2. gpu_packed_profile.py --ops rglru (unpacked, 16 and 256 sequences): HEAD, then tprev. Saved after each.
set -u
cd "$(dirname "$0")/../../../.."
. scripts/stage.sh
STAGES="bits profile"
workspace call5.log
pids=()
for t in tprev head; do
  root=$PWD; [ $t != head ] && root=$PWD/tprev
  stage bits ${LIMIT:-250} env PYTHONPATH=$root $PY scripts/bitsame.py save --op rglru $root $W/rglru_$t.pt \
    > $W/bits_rglru_$t.log 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait $p; done
$PY scripts/bitsame.py compare $W/rglru_tprev.pt $W/rglru_head.pt > $W/same_rglru.txt 2>&1
rm -f $W/*.pt
save
echo "== rglru bits tprev vs head: $(tail -1 $W/same_rglru.txt)"
for t in head tprev; do
  root=$PWD; [ $t = tprev ] && root=$PWD/tprev
  mkdir -p $W/prof_$t
  stage profile ${PROF_LIMIT:-70} env PYTHONPATH=$root $PY $root/scripts/gpu_packed_profile.py --ops rglru \
    --documents 16,256 --out $W/prof_$t > $W/prof_$t.log 2>&1
  save
  $PY - "$W/prof_$t/packed_profile.json" $t <<'PY'
import json, sys
try:
    rows = {r["documents"]: r for r in json.load(open(sys.argv[1]))["rows"] if r["op"] == "rglru"}
except (OSError, KeyError, ValueError):
    sys.exit(print(f"== {sys.argv[2]}: no record"))
us = lambda r, part="": sum(u for name, _, u in r["kernels"] if part in name)
print(f"== {sys.argv[2]}: kernel sums " + " / ".join(f"{us(rows[n]):.0f}" for n in sorted(rows)) + " us; packed/unpacked "
      + " / ".join(f"{us(rows[n]) / us(rows[0]):.3f}" for n in sorted(rows) if n)
      + "".join(f"; {k} " + " / ".join(f"{us(rows[n], k):.0f}" for n in sorted(rows))
                for k in ("dw_kernel", "dx_kernel", "chunk_kernel", "summary_kernel")))
PY
done
