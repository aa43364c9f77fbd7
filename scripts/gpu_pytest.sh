#!/usr/bin/env bash
# `pytest -m gpu`, whole, in one device call under its 10-minute limit: the GPU tests in 10 shards run
# side by side on one GPU (they are launch- and compile-bound, not bandwidth-bound), each shard its own
# process, so a fault in one cannot poison another.
#
#   OUT=DIR [LIMIT=seconds] [SHARDS=regex] bash scripts/gpu_pytest.sh
#
# SHARDS (a grep -E pattern over the shard names: gates_samu_0..2, gates_rglru_0..2, rglru_bf16, rglru_rest, train,
# rest)
# runs only the shards it matches, e.g. SHARDS="rest|rglru" when the gates ran in a call of their own.
# Writes DIR/pytest.tar.gz (one file: the device tool returns at most 8) holding pytest/pytest_<shard>.log
# and, through SAMU_GPU_GATE_OUT, the gates-marked tests' records pytest/gates/gates_<op>_<dtype>.json;
# prints each shard's summary line last. Exit 1 when any shard failed.
set -u
cd "$(dirname "$0")/.."
DEST="${OUT:-$PWD/out}"
OUT="$(mktemp -d)/pytest"
LIMIT="${LIMIT:-540}"
mkdir -p "$OUT/gates"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" SAMU_GPU_GATE_OUT="$OUT/gates"
G=tests/gates/test_gates_gpu.py::test_every_variant_passes_its_gates_at_the_gate_shapes
shard() {  # shard NAME PYTEST-ARGS...
  local name=$1; shift
  [ -n "${SHARDS:-}" ] && ! grep -qE "^(${SHARDS})$" <<< "$name" && return 0
  timeout --signal=INT --kill-after=15 "$LIMIT" python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs "$@" \
    > "$OUT/pytest_$name.log" 2>&1
  local rc=$?
  echo $rc > "$OUT/rc_$name"
  return $rc
}
pids=()
for op in samu rglru; do
  for d in 0 1 2; do shard "gates_${op}_$d" "$G[$op-dtype$d]" & pids+=($!); done
done
shard rglru_bf16 tests/ops/test_rglru_triton.py -k dtype0 & pids+=($!)
shard rglru_rest tests/ops/test_rglru_triton.py -k "not dtype0" & pids+=($!)
shard train tests/test_train.py & pids+=($!)
shard rest tests --deselect tests/ops/test_rglru_triton.py --ignore tests/gates/test_gates_gpu.py \
  --ignore tests/test_train.py & pids+=($!)
rc=0
# a shard passes only when pytest exited 0: a cut-short run (timeout's SIGINT) still prints a summary
for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
ls "$OUT"/pytest_*.log > /dev/null 2>&1 || { echo "no shard matches SHARDS=${SHARDS:-}"; exit 1; }
for log in "$OUT"/pytest_*.log; do
  line=$(grep -E "^(=+ )?[0-9]+ (passed|failed|error|skipped)|no tests ran" "$log" | tail -1)
  # timeout's exit status 124: cut at LIMIT (a test that catches the SIGINT itself prints no KeyboardInterrupt)
  name=$(basename "$log" .log)
  [ "$(cat "$OUT/rc_${name#pytest_}" 2>/dev/null)" = 124 ] && line="cut short: ${line:-no summary}"
  echo "$name: ${line:-no summary}"
done
mkdir -p "$DEST" && tar czf "$DEST/pytest.tar.gz" -C "$(dirname "$OUT")" pytest
exit $rc
