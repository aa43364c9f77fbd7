#!/usr/bin/env bash
# For the next session (written in session 21, never run): RG-LRU's packed steps without an opening on the
# unpacked code (patches/packed_skip.diff), judged in one call. HEAD: the patch applied and committed; tprev: the
# commit before, unpacked untracked (`git archive PREV samu tests scripts | tar -x -C tprev`).
#   HEAD_COMMIT=<hex> PREV_COMMIT=<hex> bash results/dev/session21/scripts/packed_call.sh
# 1. the bits against tprev (scripts/gpu_bits.sh): the unpacked cases should be the same (their SASS differs only in
#    register and spill-slot assignment, offline/packed_skip_sass.txt); the packed ones may differ where the compiler
#    contracts the two forms' products unlike (each form alone is exact);
# 2. RG-LRU's packed gates in bf16 and fp32 (16 sequences, both variants, as session 18's call 5) beside the packed
#    tests on the GPU: the gate records the packed classes need if the bits moved;
# 3. packed / unpacked kernel sums at (1, 32768, 2048), 16 and 256 sequences: HEAD, then tprev.
# The limits (200 + 280 + 2 x 60 s) keep it inside a call's 600 s.
set -u
cd "$(dirname "$0")/../../../.."
: "${HEAD_COMMIT:?}" "${PREV_COMMIT:?}"
OUT=${OUT:-$PWD/out}
W=$OUT/w; mkdir -p $W
SAMU_GIT_COMMIT=$HEAD_COMMIT PARTS=8 LIMIT=200 bash scripts/gpu_bits.sh rglru tprev > $OUT/bits.txt 2>&1
tail -1 $OUT/bits.txt
export PYTHONPATH=$PWD
pids=()
for d in bfloat16 float32; do
  (SAMU_GIT_COMMIT=$HEAD_COMMIT timeout 280 python3 -m samu.cli gate --quiet --no-status --backends variants \
    --shapes packed --documents 16 --ops rglru --dtypes $d --out $W/gates-rglru-$d-packed.json > $W/gates-$d.log 2>&1
   echo "gates $d exit $?") &
  pids+=($!)
done
(timeout 270 python3 -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/ops/test_rglru_triton.py \
  -k "packed or drops" > $W/tests.log 2>&1; echo "tests exit $?") &
pids+=($!)
(timeout 270 python3 -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/ops/test_packing.py \
  -k "rglru or step_opens or boundaries" > $W/tests-packing.log 2>&1; echo "tests-packing exit $?") &
pids+=($!)
for p in "${pids[@]}"; do wait $p; done
tail -qn 1 $W/tests.log $W/tests-packing.log
tar -czf $OUT/results.tar.gz -C $W .
for t in head tprev; do
  d=.; c=$HEAD_COMMIT; [ $t = tprev ] && { d=tprev; c=$PREV_COMMIT; }
  mkdir -p $W/packed-$t
  (cd $d && PYTHONPATH=$PWD SAMU_GIT_COMMIT=$c timeout 60 python3 scripts/gpu_packed_profile.py --ops rglru \
    --documents 16,256 --out $W/packed-$t > $W/packed-$t.log 2>&1; echo "packed-$t exit $?")
done
tar -czf $OUT/results.tar.gz -C $W .
python3 - $W <<'PY'
import glob, json, sys
for p in sorted(glob.glob(sys.argv[1] + "/gates-rglru-*.json")):
    r = json.load(open(p))
    print(p.split("/")[-1], sum(x["pass"] for x in r["rows"]), "of", len(r["rows"]), "pass",
          "" if r.get("complete") else "INCOMPLETE")
for t in ("head", "tprev"):
    try:
        rows = json.load(open(f"{sys.argv[1]}/packed-{t}/packed_profile.json"))["rows"]
    except (OSError, ValueError) as e:
        print(t, "no record:", e)
        continue
    sums = {r["documents"]: sum(us for _, _, us in r["kernels"]) for r in rows}
    print(t, " ".join(f"{n}: {v:.0f} us ({v / sums[0]:.3f})" for n, v in sums.items()))
PY
