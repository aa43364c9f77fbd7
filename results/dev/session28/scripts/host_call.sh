#!/usr/bin/env bash
# Session 28's last call: host time of an eager fwd + bwd, committed tree (tclean) against this one, ABBA.
set -u
export SAMU_GATE_STATUS=$PWD/samu/gates/status.json SAMU_AUTO_GATE=0 PYTHONUNBUFFERED=1
run() {  # tree name
  (cd $1 && PYTHONPATH=$PWD timeout 75 python scripts/gpu_host.py --out $OUT/$2 2>&1 | grep "fwd+bwd host" | sed "s/^/$2 /")
}
run tclean old1; run . new1; run . new2; run tclean old2
