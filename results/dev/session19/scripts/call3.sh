#!/usr/bin/env bash
# Session 19, call 3 (issue 15; plan items 0c and 5 of docs/performance.md). Two RG-LRU changes:
#  - the backward runs its adjoint scan before the forward one (offline, the packed dx kernel spilled 60 words, now 16;
#    unpacked 12);
#  - RG-LRU's packed kernels find where sequences open from one 64-bit word a chunk (packing_triton.chunk_word, as
#    SAMU's do), and the two-word helpers are gone (which moved the lines of SAMU's packed helpers).
# tprev/ = the tree before both (untracked: git archive <commit> samu tests scripts | tar -x -C tprev).
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session19/scripts/call3.sh check
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session19/scripts/call3.sh profile
# (two device calls back to back: one call may run 600 s)
# check, side by side: scripts/bitsame.py --op rglru for tprev and HEAD (then compared); the packed gates of both
#    mixers, bf16 and fp32 (they judge this code whether or not its bits moved); the packed tests on the GPU;
# profile: gpu_packed_profile.py, both mixers (unpacked, 16 and 256 sequences): HEAD, tprev, HEAD.
set -u
cd "$(dirname "$0")/../../../.."
. scripts/stage.sh
PART=${1:?check or profile}
workspace call3-$PART.log
if [ "$PART" = check ]; then
STAGES="bits gates tests"
pids=()
for t in tprev head; do
  root=$PWD; [ $t != head ] && root=$PWD/tprev
  stage bits ${LIMIT:-540} env PYTHONPATH=$root $PY scripts/bitsame.py save --op rglru $root $W/rglru_$t.pt \
    > $W/bits_rglru_$t.log 2>&1 &
  pids+=($!)
done
GATE=($PY -m samu.cli gate --quiet --no-status --backends variants --shapes packed --documents 16)
for op in rglru samu; do
  for dtype in bfloat16 float32; do
    stage gates ${LIMIT:-540} "${GATE[@]}" --ops $op --dtypes $dtype --out $W/gates-q-$op-$dtype-packed.json \
      > $W/gates-$op-$dtype.log 2>&1 &
    pids+=($!)
  done
done
stage tests ${LIMIT:-540} $PY -m pytest -q -p no:cacheprovider --tb=short -m "gpu or not gpu" tests/ops/test_packing.py \
  tests/ops/test_rglru_triton.py tests/ops/test_samu_triton.py -k "packed or pack" > $W/tests.log 2>&1 &
pids+=($!)
for p in "${pids[@]}"; do wait $p; done
$PY scripts/bitsame.py compare $W/rglru_tprev.pt $W/rglru_head.pt > $W/same_rglru.txt 2>&1
rm -f $W/*.pt
save
echo "== rglru bits tprev vs head: $(tail -1 $W/same_rglru.txt)"
echo "== tests: $(tail -1 $W/tests.log)"
for f in $W/gates-*.log; do
  echo "== $(basename $f): $(grep -c '^PASS' $f) PASS, $(grep -c '^FAIL' $f) FAIL; $(grep '=== gates: exit' $f | tail -1)"
done
exit 0
fi
STAGES=profile
for t in head tprev head2; do
  root=$PWD; [ $t = tprev ] && root=$PWD/tprev
  mkdir -p $W/prof_$t
  stage profile ${PROF_LIMIT:-80} env PYTHONPATH=$root $PY $root/scripts/gpu_packed_profile.py --documents 16,256 \
    --out $W/prof_$t > $W/prof_$t.log 2>&1
  save
done
$PY - <<'PY'
import json, os
w = os.environ["W"]
for t in ("head", "tprev", "head2"):
    try:
        rows = json.load(open(f"{w}/prof_{t}/packed_profile.json"))["rows"]
    except (OSError, KeyError, ValueError):
        print(f"== {t}: no record")
        continue
    for op in ("rglru", "samu"):
        mine = {r["documents"]: r for r in rows if r["op"] == op}
        if 0 not in mine:
            continue
        us = lambda r, part="": sum(u for name, _, u in r["kernels"] if part in name)
        print(f"== {t} {op}: kernel sums " + " / ".join(f"{us(mine[n]):.0f}" for n in sorted(mine))
              + " us; packed/unpacked " + " / ".join(f"{us(mine[n]) / us(mine[0]):.3f}" for n in sorted(mine) if n)
              + "".join(f"; {k} " + " / ".join(f"{us(mine[n], k):.0f}" for n in sorted(mine))
                        for k in (("dw_kernel", "dx_kernel", "chunk_kernel") if op == "rglru" else ("dx",))))
PY
