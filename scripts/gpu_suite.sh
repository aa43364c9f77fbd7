#!/usr/bin/env bash
# The measurement suite for H200 runs through the device tool (issue 5): about 16 minutes at most, so
# two calls under the 10-minute command limit: `gate` (a parallel compile warm-up, then the gates),
# then `tests primary sweeps modules gen`.
#
#   bash scripts/gpu_suite.sh [STAGE ...]     stages: tests gate primary sweeps modules gen (default: all)
#
# Writes under $OUT (default ./out): suite.log, gates.json, status.json, bench_primary.json,
# bench_sweeps.json, bench_modules.json, bench_gen.json, REPORT.md (8 files, one folder) and prints a
# digest last.
# Peers: wheels of fla-core, accelerated-scan and einops in .whl/ (carry it) are installed to
# /tmp/peers; without them the peers are skipped with a clear line. Set SAMU_GIT_COMMIT when .git
# does not travel. Every stage has its own time limit and rewrites its record after each unit, so a
# stage cut short still returns what it finished. Overrides (for a CPU smoke run, say): GATE_SHAPES
# GATE_DTYPES PRIMARY_SHAPES SWEEP_SHAPES MODULE_SHAPES GEN_SHAPES, EXTRA (added to every samu command) and
# BENCH_EXTRA (bench only), e.g. EXTRA="--device cpu" BENCH_EXTRA="--preset tiny".
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
STAGES="${*:-tests gate primary sweeps modules gen}"
PY="${PYTHON:-python3}"
SAMU="$PY -m samu.bench"
EXTRA="${EXTRA:-}"
BENCH_EXTRA="${BENCH_EXTRA:-}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# dispatch reads the status this run's gates write, starting from the committed one
export SAMU_GATE_STATUS="$OUT/status.json"
if [ -f samu/gates/status.json ] && [ ! -f "$OUT/status.json" ]; then cp samu/gates/status.json "$OUT/status.json"; fi

. scripts/stage.sh

main() {
  install_peers
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"

  # the gates-marked tests run the same gates as the gate stage below (through the CLI there)
  stage tests 240 $PY -m pytest -m "gpu and not gates" -q -p no:cacheprovider
  stage gate 480 $SAMU gate --quiet --jobs "${GATE_JOBS:-12}" --warm-budget 240 $EXTRA --shapes "${GATE_SHAPES:-gate}" --dtypes "${GATE_DTYPES:-bf16,fp16,fp32}" \
    --backends torch,variants --out "$OUT/gates.json" --results "$OUT"
  stage primary 130 $SAMU bench --quiet $EXTRA $BENCH_EXTRA --scopes fwd,fb --shapes "${PRIMARY_SHAPES:-primary}" \
    --out "$OUT/bench_primary.json"
  # sweep shapes already in primary come from that record (newest record wins per unit in the report);
  # the chunked torch backend is a peer at the primary shapes only: at 131K it costs seconds a call
  stage sweeps 110 $SAMU bench --quiet $EXTRA $BENCH_EXTRA --scopes fb --shapes "${SWEEP_SHAPES:-length,width,-primary}" \
    --peers fla-chunk_hgrn,ascan-scalar,ascan-complex --out "$OUT/bench_sweeps.json"
  stage modules 90 $SAMU bench --quiet $EXTRA $BENCH_EXTRA --scopes block,step,model \
    --shapes "${MODULE_SHAPES:-block,step}" --out "$OUT/bench_modules.json"
  # ~50 s expected (docs/measurement.md, "Sizing the gen stage"); the prefill scope is timed on its own
  # (`samu bench --scopes prefill --shapes prefill`, ~60 s): one more record would pass the 8 files
  stage gen 90 $SAMU bench --quiet $EXTRA $BENCH_EXTRA --scopes gen --shapes "${GEN_SHAPES:-gen}" \
    --out "$OUT/bench_gen.json"

  echo "=== digest"
  $PY -m samu.bench report --results "$OUT" --out "$OUT/REPORT.md" --no-figures --brief
}

# a pipeline, not exec > >(tee): the shell waits for tee, so the log is complete when this returns
main 2>&1 | tee -a "$OUT/suite.log"
