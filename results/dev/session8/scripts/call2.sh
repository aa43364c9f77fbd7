#!/usr/bin/env bash
# One device call: GPU tests of the fp32-gradient linears and the compile tests; graph breaks of the SAMU LM
# under autocast (OLD = c64c582, MID = OLD with product_dtype traceable, NEW = this checkout); the compiled
# and eager SAMU LM step (400m, 4 x 2048) in the order NEW OLD MID NEW (compiled), OLD NEW (eager).
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
STAGES="tests"
. scripts/stage.sh
workspace call2.log
NEWC=$(cat ab/NEWC)
stage tests 100 $PY -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/ops/test_linear.py tests/modules/test_compile.py
for v in "old:$ROOT/ab/old" "mid:$ROOT/ab/mid" "new:$ROOT"; do
  (cd "${v#*:}" && PYTHONPATH="${v#*:}" timeout 40 $PY "$ROOT/ab/breaks.py" "${v%%:*}" 2>&1 | tail -4)
done
prof() {  # prof TAG DIR COMMIT IMPL LIMIT
  mkdir -p "$W/$1"
  echo "=== $1"
  (cd "$2" && SAMU_GIT_COMMIT=$3 PYTHONPATH="$2" timeout --signal=INT --kill-after=10 $5 \
    $PY scripts/gpu_model_profile.py --model samu --impl $4 --shape 4x2048x1664 --out "$W/$1" 2>&1 | tail -4)
  save
}
prof c1-new "$ROOT" "$NEWC" compiled 100
prof c2-old "$ROOT/ab/old" c64c582 compiled 100
prof c3-mid "$ROOT/ab/mid" c64c582 compiled 100
prof c4-new "$ROOT" "$NEWC" compiled 80
prof e1-old "$ROOT/ab/old" c64c582 auto 50
prof e2-new "$ROOT" "$NEWC" auto 50
W="$W" $PY - <<'PY'
import glob, json, os
W = os.environ["W"]
for f in sorted(glob.glob(os.path.join(W, "*", "*.json"))):
    d = json.load(open(f))
    cast = sum(k["ms_per_step"] for k in d["kernels"] if "_to_copy" in k["name"] and "add" not in k["name"])
    print(f"{f.split('/')[-2]:8s} {d['impl']:9s} step {d['step_ms']:7.2f} ms  {d['tokens_per_s']/1e3:6.1f}K tok/s  "
          f"MFU {d['mfu']:.3f}  gemm {d['kinds_ms'].get('gemm', 0):6.2f}  inductor {d['kinds_ms'].get('inductor', 0):5.2f}  "
          f"casts {cast:5.2f}  kernels {d['kernel_ms']:6.2f}")
PY
