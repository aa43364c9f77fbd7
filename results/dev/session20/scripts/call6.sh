#!/usr/bin/env bash
# Session 20, call 6 (issue 13): triton_fwd.LEANER, launch options lifting programs a multiprocessor at head dims 64,
# 96 and 160 (summary pass 3 -> 4 at 64 and 96, output pass 3 -> 4 at 64 and 96, backward summary 2 -> 4 and dx 1 -> 2
# at 160), timed over the width sweep. tprev/ = the tree before (HEAD~1, untracked).
#   HEAD_COMMIT=<full hex> PREV_COMMIT=<full hex> bash results/dev/session20/scripts/call6.sh
# 1. bits: scripts/gpu_bits.sh rglru tprev (stages move timing only: the bits must not move);
# 2. gpu_profile.py --op rglru --backend triton_chunked over the width sweep (1, 32768, 1024-2560): HEAD, tprev, HEAD;
set -u
cd "$(dirname "$0")/../../../.."
. scripts/stage.sh
STAGES="profile"
workspace call6.log
SAMU_GIT_COMMIT=$HEAD_COMMIT LIMIT=${LIMIT:-300} bash scripts/gpu_bits.sh rglru tprev
tar -xzf "$OUT/results.tar.gz" -C "$W" 2>/dev/null   # keep the bits' files in this call's archive
for t in head tprev head2; do
  root=$PWD; commit=$HEAD_COMMIT
  [ $t = tprev ] && root=$PWD/tprev && commit=$PREV_COMMIT
  mkdir -p $W/prof_$t
  stage profile 110 env PYTHONPATH=$root SAMU_GIT_COMMIT=$commit $PY $root/scripts/gpu_profile.py --op rglru \
    --backend triton_chunked --shapes "1,32768,1024;1,32768,1536;1,32768,2048;1,32768,2560" --out $W/prof_$t > $W/prof_$t.log 2>&1
  save
  $PY - "$W/prof_$t/profile_rglru_triton_chunked.json" $t <<'PY'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))["rows"]
except (OSError, KeyError, ValueError):
    sys.exit(print(f"== {sys.argv[2]}: no record"))
for r in rows:
    k = {name: us for name, _, us in r["kernels"]}
    print(f"== {sys.argv[2]} {r['shape']}: graph {r['fb_graph_ms']:.3f} ms; sum {sum(k.values()):.0f} us; "
          + ", ".join(f"{name[7:-7]} {us:.0f}" for name, us in k.items() if us > 20))
PY
done
echo "== done"
