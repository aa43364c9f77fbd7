#!/usr/bin/env bash
# Session 21, call 3 (never ran: no machine was lent; written for the next session): RG-LRU's GPU tests on HEAD in
# three processes beside the trees' compiles, then HEAD and tprev timed alternately (head, tprev, head2) in bf16 at
# L = 32,768 and head dims 96, 128, 160, in fp16 at 64, 96, 128 and 160 (head, tprev), and t96 (4b424ed: no LEANER
# entry at head dim 96) in bf16 at (1, 32768, 1536), the time the shipped entries there were never set against.
#   HEAD: the shipped code with patches/leaner_fp16_dw.diff applied and committed; tprev: the shipped code, t96:
#   4b424ed (`git archive C samu tests scripts | tar -x -C tprev`, untracked; t96's gpu_profile.py has no --dtype).
#   HEAD_COMMIT=<hex> PREV_COMMIT=<hex> bash results/dev/session21/scripts/call3.sh
set -u
cd "$(dirname "$0")/../../../.."
: "${HEAD_COMMIT:?}" "${PREV_COMMIT:?}"
OUT=${OUT:-$PWD/out}
W=$OUT/w; mkdir -p $W
python3 -m pytest -q --collect-only -m gpu tests/ops/test_rglru_triton.py 2>/dev/null | grep "::" > $W/gpu_tests.txt
pids=()
for k in 0 1 2; do
  awk -v k=$k 'NR % 3 == k' $W/gpu_tests.txt > $W/gpu_tests-$k.txt
  (timeout -s INT -k 10 270 python3 -m pytest -q -p no:cacheprovider -m gpu --tb=short $(cat $W/gpu_tests-$k.txt) \
    > $W/gpu_tests-$k.log 2>&1; echo "tests $k exit $?") &
  pids+=($!)
done
WARM="import sys, torch, samu
sys.path.insert(0, 'scripts')
from gpu_profile import make
samu.set_check_finite(False)
for dt, D in [(torch.bfloat16, 1536), (torch.bfloat16, 2048), (torch.bfloat16, 2560), (torch.float16, 1024),
              (torch.float16, 1536), (torch.float16, 2048), (torch.float16, 2560)]:
    make('rglru', (1, 4096, D), 'triton_chunked', dtype=dt)[1]()
torch.cuda.synchronize(); print('warm')"
for t in head tprev t96; do d=$t; [ $t = head ] && d=.; (cd $d && PYTHONPATH=$PWD timeout 200 python3 -c "$WARM" > $W/warm-$t.log 2>&1; echo "warm $t $?") & pids+=($!); done
for p in "${pids[@]}"; do wait $p; done
tail -qn 1 $W/gpu_tests-*.log
tar -czf $OUT/results.tar.gz -C $W .
SW="1,32768,1536;1,32768,2048;1,32768,2560"
prof() {  # TAG DIR COMMIT SHAPES [--dtype NAME]
  mkdir -p $W/prof-$1
  (cd "$2" && PYTHONPATH="$PWD" SAMU_GIT_COMMIT="$3" timeout 60 python3 scripts/gpu_profile.py --op rglru \
    --backend triton_chunked --out "$W/prof-$1" --shapes "$4" ${5:-} ${6:-} > "$W/prof-$1.log" 2>&1; echo "$1 exit $?")
}
prof head . $HEAD_COMMIT "$SW"; prof tprev tprev $PREV_COMMIT "$SW"; prof head2 . $HEAD_COMMIT "$SW"
prof t96 t96 4b424edd78782ccdbabdc4fa8388404123046a35 "1,32768,1536"
F16="1,32768,1024;1,32768,1536;1,32768,2048;1,32768,2560"
prof head16 . $HEAD_COMMIT "$F16" --dtype float16; prof tprev16 tprev $PREV_COMMIT "$F16" --dtype float16
tar -czf $OUT/results.tar.gz -C $W .
python3 - $W <<'PY'
import glob, json, sys
for p in sorted(glob.glob(sys.argv[1] + "/prof-*/*.json")):
    r = json.load(open(p))
    print(p.split("/")[-2], " ".join(f"{tuple(s['shape'])}:{s['fb_graph_ms']:.3f}" for s in r["rows"]))
PY
