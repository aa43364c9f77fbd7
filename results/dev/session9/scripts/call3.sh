#!/usr/bin/env bash
# One device call (session 9, call 3): PDL on a chain of one-row products shaped like the 400m preset's decode
# (ab/pdl.py, exploratory), then the model bench at 4 x 2048 (samu's LMs and the SDPA transformer, eager and
# compiled) at this commit.
set -u
cd "$(dirname "$0")/.."
STAGES="pdl model2k compile"
. scripts/stage.sh
workspace call3.log
export W SAMU_GIT_COMMIT=$(cat ab/NEWC)
stage pdl 180 $PY ab/pdl.py
save
stage compile 100 $PY -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/models/test_compile_gpu.py
save
stage model2k 300 $PY -m samu.cli bench --scopes model --impls auto,compiled --shapes 4x2048x1664 \
  --out "$W/bench-model-2k.json" --quiet
save
$PY - "$W/bench-model-2k.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    print(r["candidate"], r["impl"], round(r["median_ms"], 2), "ms",
          round(r["tokens_per_call"] / r["median_ms"] * 1e3), "tok/s")
PY
