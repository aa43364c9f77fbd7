#!/usr/bin/env bash
# One device call (session 9, call 4): the SAMU LM's eager training step at 4 x 2048 (400m preset) profiled at
# this commit (NEW) and at 5b55bc4 (OLD, ab/old: 46.87 ms in session 8's call2) in the order NEW OLD NEW, then
# NEW compiled: is call3's slower model bench (eager 60.0 ms) the code or the machine?
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
STAGES="prof"
. scripts/stage.sh
workspace call4.log
export W
prof() {  # prof TAG DIR COMMIT IMPL
  mkdir -p "$W/$1"; echo "=== $1"
  (cd "$2" && PYTHONPATH="$2" SAMU_GIT_COMMIT="$3" timeout --signal=INT --kill-after=10 110 $PY scripts/gpu_model_profile.py \
     --model samu --impl "$4" --shape 4x2048x1664 --out "$W/$1" 2>&1 | tail -4)
  save
}
NEWC=$(cat ab/NEWC)
prof e1-new "$ROOT" "$NEWC" auto
prof e2-old "$ROOT/ab/old" 5b55bc4 auto
prof e3-new "$ROOT" "$NEWC" auto
prof c4-new "$ROOT" "$NEWC" compiled
$PY - "$W" <<'PY'
import glob, json, sys
for p in sorted(glob.glob(sys.argv[1] + "/*/model_profile_*.json")):
    d = json.load(open(p))
    print(p.split("/")[-2], d["impl"], "step", round(d["step_ms"], 2), "ms, kernels", round(d["kernel_ms"], 2),
          "ms", {k: round(v, 2) for k, v in d["kinds_ms"].items()})
PY
