#!/usr/bin/env bash
# Session 21, call 3 (never ran: no machine was lent; written for the next session): RG-LRU's GPU tests on HEAD in
# three processes beside both trees' compiles, then HEAD and tprev timed alternately (head, tprev, head2) in bf16 at
# L = 32,768 and head dims 96, 128, 160 and in fp16 at 128 and 160, and both trees' packed ratios.
#   HEAD: the shipped code with patches/leaner_fp16_dw.diff applied and committed; tprev: the shipped code
#   (`git archive PREV samu tests scripts | tar -x -C tprev`, untracked).
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
  (timeout -s INT -k 10 300 python3 -m pytest -q -p no:cacheprovider --tb=short $(cat $W/gpu_tests-$k.txt) \
    > $W/gpu_tests-$k.log 2>&1; echo "tests $k exit $?") &
  pids+=($!)
done
WARM="import sys, torch, samu
sys.path.insert(0, 'scripts')
from gpu_profile import make
samu.set_check_finite(False)
for dt, D, docs in [(torch.bfloat16, 1536, 0), (torch.bfloat16, 2048, 0), (torch.bfloat16, 2560, 0),
                    (torch.float16, 2048, 0), (torch.float16, 2560, 0), (torch.bfloat16, 2048, 16)]:
    make('rglru', (1, 4096, D), 'triton_chunked', dtype=dt, documents=docs)[1]()
torch.cuda.synchronize(); print('warm')"
for t in head tprev; do d=$t; [ $t = head ] && d=.; (cd $d && PYTHONPATH=$PWD timeout 200 python3 -c "$WARM" > $W/warm-$t.log 2>&1; echo "warm $t $?") & pids+=($!); done
for p in "${pids[@]}"; do wait $p; done
tail -qn 1 $W/gpu_tests-*.log
tar -czf $OUT/results.tar.gz -C $W .
SW="1,32768,1536;1,32768,2048;1,32768,2560"
prof() {  # TAG DIR COMMIT DTYPE SHAPES
  mkdir -p $W/prof-$1
  (cd "$2" && PYTHONPATH="$PWD" SAMU_GIT_COMMIT="$3" timeout 60 python3 scripts/gpu_profile.py --op rglru \
    --backend triton_chunked --dtype "$4" --out "$W/prof-$1" --shapes "$5" > "$W/prof-$1.log" 2>&1; echo "$1 exit $?")
}
prof head . $HEAD_COMMIT bfloat16 "$SW"; prof tprev tprev $PREV_COMMIT bfloat16 "$SW"; prof head2 . $HEAD_COMMIT bfloat16 "$SW"
F16="1,32768,2048;1,32768,2560"
prof head16 . $HEAD_COMMIT float16 "$F16"; prof tprev16 tprev $PREV_COMMIT float16 "$F16"; prof head16b . $HEAD_COMMIT float16 "$F16"
for t in head tprev; do
  d=$t; c=$HEAD_COMMIT; [ $t = head ] && d=.; [ $t = tprev ] && c=$PREV_COMMIT
  mkdir -p $W/packed-$t
  (cd $d && PYTHONPATH=$PWD SAMU_GIT_COMMIT=$c timeout 60 python3 scripts/gpu_packed_profile.py --ops rglru \
    --documents 16,256 --out $W/packed-$t > $W/packed-$t.log 2>&1; echo "packed-$t exit $?")
done
tar -czf $OUT/results.tar.gz -C $W .
python3 - $W <<'PY'
import glob, json, sys
for p in sorted(glob.glob(sys.argv[1] + "/prof-*/*.json")):
    r = json.load(open(p))
    print(p.split("/")[-2], " ".join(f"{tuple(s['shape'])}:{s['fb_graph_ms']:.3f}" for s in r["rows"]))
PY
for t in head tprev; do echo "$t"; grep -h "^== " $W/packed-$t.log; done
