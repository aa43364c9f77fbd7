#!/usr/bin/env bash
# Session 20, call 5 (issue 13): the forward output pass of RG-LRU unpipelined at 128 registers (triton_fwd.output_pass:
# four programs a multiprocessor, so its 512 programs at (1, 32768, 2048) run in one wave, not 1.29; it ran three a
# multiprocessor at 153 registers and 74 KB). tprev/ = the tree before (HEAD~1, untracked).
#   HEAD_COMMIT=<full hex> PREV_COMMIT=<full hex> bash results/dev/session20/scripts/call5.sh
# 1. bits: scripts/gpu_bits.sh rglru tprev (stages move timing only: the bits must not move);
# 2. gpu_profile.py --op rglru --backend triton_chunked at three shapes: HEAD, tprev, HEAD;
# 3. gpu_packed_profile.py --ops rglru for HEAD (issue 15's ratio with the change).
set -u
cd "$(dirname "$0")/../../../.."
. scripts/stage.sh
STAGES="profile packed"
workspace call5.log
SAMU_GIT_COMMIT=$HEAD_COMMIT LIMIT=${LIMIT:-300} bash scripts/gpu_bits.sh rglru tprev
tar -xzf "$OUT/results.tar.gz" -C "$W" 2>/dev/null   # keep the bits' files in this call's archive
for t in head tprev head2; do
  root=$PWD; commit=$HEAD_COMMIT
  [ $t = tprev ] && root=$PWD/tprev && commit=$PREV_COMMIT
  mkdir -p $W/prof_$t
  stage profile 90 env PYTHONPATH=$root SAMU_GIT_COMMIT=$commit $PY $root/scripts/gpu_profile.py --op rglru \
    --backend triton_chunked --shapes "1,8192,1024;4,2048,2048;1,32768,2048" --out $W/prof_$t > $W/prof_$t.log 2>&1
  save
  $PY - "$W/prof_$t/profile_rglru_triton_chunked.json" $t <<'PY'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))["rows"]
except (OSError, KeyError, ValueError):
    sys.exit(print(f"== {sys.argv[2]}: no record"))
for r in rows:
    k = {name: us for name, _, us in r["kernels"]}
    print(f"== {sys.argv[2]} {r['shape']}: graph {r['fb_graph_ms']:.3f} ms; summary {k.get('_rglru_bwd_summary_kernel', 0):.0f} us;"
          f" sum {sum(k.values()):.0f} us")
PY
done
mkdir -p $W/packed_head
stage packed 80 env SAMU_GIT_COMMIT=$HEAD_COMMIT $PY scripts/gpu_packed_profile.py --ops rglru --documents 16,256 \
  --out $W/packed_head > $W/packed_head.log 2>&1
save
$PY - "$W/packed_head/packed_profile.json" <<'PY'
import json, sys
try:
    rows = {r["documents"]: r for r in json.load(open(sys.argv[1]))["rows"] if r["op"] == "rglru"}
except (OSError, KeyError, ValueError):
    sys.exit(print("== packed: no record"))
us = lambda r: sum(u for _, _, u in r["kernels"])
print("== packed: kernel sums " + " / ".join(f"{us(rows[n]):.0f}" for n in sorted(rows)) + " us; packed/unpacked "
      + " / ".join(f"{us(rows[n]) / us(rows[0]):.3f}" for n in sorted(rows) if n))
PY
echo "== done"
