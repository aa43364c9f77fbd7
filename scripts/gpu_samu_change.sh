#!/usr/bin/env bash
# A change to the SAMU kernels judged on one H200 in one device call (~7 minutes at most):
#
#   bash scripts/gpu_samu_change.sh [OLD]      OLD: a copy of an earlier checkout to time beside this one
#                                              (e.g. `git worktree add /tmp/old <commit>`, copied into the
#                                              tree as an untracked folder so that it travels); optional
#
#   tests    the SAMU GPU tests (`pytest -m gpu tests/ops/test_samu_triton.py`)
#   gates    both SAMU variants' gates at every gate shape in bf16, fp16 and fp32 (one process per dtype,
#            side by side) and packed (`--documents 16`, bf16 and fp32), beside the tests
#   profile  scripts/gpu_profile.py of triton_grouped and triton_serial, this checkout and OLD alternating
#            (this, OLD, this), so the drift between runs shows next to the difference
#
# Writes $OUT/change.log and, after every stage (a call cut short keeps what finished), $OUT/results.tar.gz.
# Set SAMU_GIT_COMMIT when .git does not travel.
set -u
cd "$(dirname "$0")/.."
OLD=${1:-}
OUT="${OUT:-$PWD/out}"
W="$OUT/w"
mkdir -p "$W"
STAGES="${STAGES:-tests gates profile}"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
exec > >(tee -a "$OUT/change.log") 2>&1

. scripts/stage.sh
save() { tar -czf "$OUT/results.tar.gz" -C "$W" .; }
GATE=($PY -m samu.cli gate --ops samu --quiet --no-status --backends triton_serial,triton_grouped)

# side by side; waited for by their process ids (a bare `wait` would also wait for the log's tee)
pids=()
stage tests 240 $PY -m pytest -m gpu -q -p no:cacheprovider tests/ops/test_samu_triton.py > "$W/tests.log" 2>&1 &
pids+=($!)
for dtype in bf16 fp16 fp32; do
  stage gates 240 "${GATE[@]}" --shapes gate --dtypes $dtype --out "$W/gates-samu-$dtype.json" & pids+=($!)
done
stage gates 240 "${GATE[@]}" --shapes packed --dtypes bf16,fp32 --documents 16 --out "$W/gates-samu-packed.json" &
pids+=($!)
wait "${pids[@]}"
tail -3 "$W/tests.log"
save
SHAPES="1,8192,1024;4,2048,2048;1,32768,2048"
profile() {  # profile TAG DIR
  mkdir -p "$W/profile-$1"
  for backend in triton_grouped triton_serial; do
    (cd "$2" && PYTHONPATH="$PWD" stage profile 60 $PY scripts/gpu_profile.py --op samu --backend $backend \
      --out "$W/profile-$1" --shapes "$SHAPES")
  done
}
profile new-1 .
if [ -n "$OLD" ]; then profile old "$OLD"; profile new-2 .; fi
save
echo "=== digest"
$PY - "$W" <<'EOF'
import glob, json, sys
for path in sorted(glob.glob(sys.argv[1] + "/gates-*.json")):
    rows = json.load(open(path))["rows"]
    failed = [(r["backend"], r["dtype"], r["shape"]) for r in rows if not r["pass"]]
    print(path.rsplit("/", 1)[-1], f"{sum(r['pass'] for r in rows)}/{len(rows)} pass", failed[:6])
for path in sorted(glob.glob(sys.argv[1] + "/profile-*/*.json")):
    rec = json.load(open(path))
    for s in rec["rows"]:
        print(f"{path.split('/')[-2]:12s} {rec['backend']:15s} {str(s['shape']):18s} fb graph {s['fb_graph_ms']:.3f} ms,"
              f" do_bench {s['fb_bench_ms']:.3f} ms, host {s['fb_host_ms']:.3f} ms")
EOF
