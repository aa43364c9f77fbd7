#!/usr/bin/env bash
# A change to one mixer's kernels judged on one H200 in one device call (SAMU with OLD on 2026-12-02: tests 187 s
# beside gates 104 s, then six profiles of 12-25 s; limits: tests and gates 240 s side by side (RG-LRU 300), each
# profile 50 s, so 540 s for SAMU with OLD and 450 for RG-LRU, plus up to 15 s a stage to stop). Exits 1 when a
# test or a gate failed or a gate run was cut short:
#
#   OLD_COMMIT=<hex> bash scripts/gpu_change.sh OP [OLD]        OP: samu or rglru
#       OLD: a copy of an earlier checkout to time beside this one (e.g. `git archive <commit> samu scripts
#       tests | tar -x -C ab/old`, an untracked folder inside the tree so that it travels); OLD_COMMIT: that
#       commit, which OLD's records then name (they would name this checkout's otherwise)
#
#   tests    every kernel test of OP on the GPU (tests/ops/test_samu_triton.py and test_triton_utils.py, or
#            test_rglru_triton.py: the gpu-marked ones and the small odd shapes the CPU suite runs through the
#            interpreter, here compiled)
#   gates    OP's Triton variants' gates at every gate shape in bf16, fp16 and fp32 (one process per dtype,
#            side by side) and packed (`--documents 16`, bf16 and fp32), beside the tests; RG-LRU, whose gate
#            classes name the head dim, also at the model shapes outside the gate set (prefill: 64x512x1664 and
#            1x32768x1664 in every dtype; the small preset's 16x2048x512 and 4x8192x512 in bf16)
#   profile  scripts/gpu_profile.py of OP's variants (RG-LRU: the default one), this checkout and OLD alternating
#            (this, OLD, this), so the drift between runs shows next to the difference
#
# EXTRA_TESTS="FILE..." runs more test files beside the tests (their own process and log, tests-extra.log).
# SHAPES="B,L,D;..." replaces the profiled shapes (the width sweep: "1,32768,1024;1,32768,1536;1,32768,2048;
# 1,32768,2560"), PROFILE_LIMIT=SECONDS each profile's 50 s, PROFILE_ARGS more options of gpu_profile.py (e.g.
# "--dtype float16"; OLD's gpu_profile.py must take them too). With STAGES=profile and scripts/gpu_bits.sh before
# it in the same command, a kernel change's bits and its timing beside OLD take one call.
# LIMIT=SECONDS replaces the tests' and gates' limit. The gates judge three calls of a mixer now (session 19), and
# RG-LRU's fp32 gate set no longer fits one device call in one process: even split in two processes by shapes
# (`--shapes primary,length` and `gate,-primary,-length`), its second was cut at 540 s one shape short
# (results/dev/session19/call1/gates-float32-b.log). Gate RG-LRU's classes over two calls as session 19's
# scripts/call1.sh and call2.sh (results/dev/session19/) did; SAMU's fit in one (124 s a dtype).
#
# Writes $OUT/change.log and $OUT/results.tar.gz (after the gates and again after the profiles: a call cut
# short keeps what finished). Set SAMU_GIT_COMMIT when .git does not travel.
set -u
cd "$(dirname "$0")/.."
OP=${1:?usage: gpu_change.sh samu|rglru [OLD]}
OLD=${2:-}
case $OP in
  samu) TESTS=(tests/ops/test_samu_triton.py tests/ops/test_triton_utils.py); VARIANTS=(triton_grouped triton_serial)
        PROFILED=("${VARIANTS[@]}"); LIMIT=${LIMIT:-240} ;;
  rglru) TESTS=(tests/ops/test_rglru_triton.py); VARIANTS=(triton_chunked triton_chunked_precise)
         PROFILED=(triton_chunked); LIMIT=${LIMIT:-300} ;;
  *) echo "OP: samu or rglru, not $OP"; exit 2 ;;
esac
if [ -n "$OLD" ]; then
  OLD=$(cd "$OLD" && pwd) || exit 1
  : "${OLD_COMMIT:?set OLD_COMMIT to the commit OLD was taken from}"
fi
. scripts/stage.sh
STAGES="${STAGES:-tests gates profile}"
workspace change.log
BACKENDS=$(IFS=,; echo "${VARIANTS[*]}")
GATE=($PY -m samu.cli gate --ops "$OP" --quiet --no-status --backends "$BACKENDS")

pids=()
stage tests $LIMIT $PY -m pytest -q -p no:cacheprovider -m "gpu or not gpu" "${TESTS[@]}" > "$W/tests.log" 2>&1 &
pids+=($!)
if [ -n "${EXTRA_TESTS:-}" ]; then  # more test files, in a process of their own beside these
  stage tests $LIMIT $PY -m pytest -q -p no:cacheprovider -m "gpu or not gpu" $EXTRA_TESTS > "$W/tests-extra.log" 2>&1 &
  pids+=($!)
fi
for dtype in bf16 fp16 fp32; do
  stage gates $LIMIT "${GATE[@]}" --shapes gate --dtypes $dtype --out "$W/gates-$OP-$dtype.json" & pids+=($!)
done
stage gates $LIMIT "${GATE[@]}" --shapes packed --dtypes bf16,fp32 --documents 16 --out "$W/gates-$OP-packed.json" &
pids+=($!)
if [ "$OP" = rglru ]; then
  stage gates $LIMIT "${GATE[@]}" --shapes 64x512x1664,1x32768x1664 --out "$W/gates-$OP-prefill.json" & pids+=($!)
  stage gates $LIMIT "${GATE[@]}" --shapes 16x2048x512,4x8192x512 --dtypes bf16 --out "$W/gates-$OP-small.json" &
  pids+=($!)
fi
wait "${pids[@]}"
tail -3 "$W/tests.log"
save
SHAPES=${SHAPES:-"1,8192,1024;4,2048,2048;1,32768,2048"}
profile() {  # profile TAG DIR COMMIT
  mkdir -p "$W/profile-$1"
  for backend in "${PROFILED[@]}"; do
    (cd "$2" && PYTHONPATH="$PWD" SAMU_GIT_COMMIT="$3" stage profile "${PROFILE_LIMIT:-50}" $PY scripts/gpu_profile.py \
      --op "$OP" --backend $backend --out "$W/profile-$1" --shapes "$SHAPES" ${PROFILE_ARGS:-})
  done
}
NEW_COMMIT=${SAMU_GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null)}
profile new-1 . "$NEW_COMMIT"
if [ -n "$OLD" ]; then profile old "$OLD" "$OLD_COMMIT"; profile new-2 . "$NEW_COMMIT"; fi
save
echo "=== digest"
$PY - "$W" <<'EOF'
import glob, json, re, sys
bad = 0
tests = open(sys.argv[1] + "/tests.log").read() if glob.glob(sys.argv[1] + "/tests.log") else ""
if not re.search(r"=== tests: exit 0 ", tests):
    print("tests: failed or not run (tests.log)")
    bad += 1
for path in glob.glob(sys.argv[1] + "/tests-extra.log"):
    extra = open(path).read()
    ok = re.search(r"=== tests: exit 0 ", extra)
    lines = extra.strip().splitlines() or [""]
    print("extra tests:", "pass" if ok else "failed or cut short", lines[-2 if len(lines) > 1 else -1][:200])
    bad += not ok
for path in sorted(glob.glob(sys.argv[1] + "/gates-*.json")):
    try:
        record = json.load(open(path))
    except (OSError, ValueError) as e:
        print(path.rsplit("/", 1)[-1], "unreadable:", e)
        bad += 1
        continue
    rows = record["rows"]
    failed = [(r["backend"], r["dtype"], r["shape"]) for r in rows if not r["pass"]]
    bad += bool(failed) + (not record.get("complete"))
    print(path.rsplit("/", 1)[-1], f"{sum(r['pass'] for r in rows)}/{len(rows)} pass",
          "" if record.get("complete") else "INCOMPLETE (cut short)", failed[:6])
for path in sorted(glob.glob(sys.argv[1] + "/profile-*/*.json")):
    rec = json.load(open(path))
    for s in rec["rows"]:
        print(f"{path.split('/')[-2]:12s} {rec['backend']:15s} {str(s['shape']):18s} fb graph {s['fb_graph_ms']:.3f} ms,"
              f" do_bench {s['fb_bench_ms']:.3f} ms, host {s['fb_host_ms']:.3f} ms")
sys.exit(1 if bad else 0)
EOF
