#!/usr/bin/env bash
# Session 26: the harness's records refreshed on the current code in one call (plan items 0, its packed bench, and 7): the packed scope
# (the report's packed table), then the primary shapes beside the third-party peers (the README's ratios). Each
# bench writes its JSON as it goes; the call packs them into results.tar.gz after each stage.
# The peers travel as wheels in .whl/ (here: `pip download --no-deps -d .whl accelerated-scan einops fla-core`,
# then the device call carries ".whl"), installed by scripts/stage.sh's install_peers; without them the peer rows
# are skipped.
#   COMMIT=<hex> bash results/dev/session26/scripts/bench_call.sh
set -u
cd "$(dirname "$0")/../../../.."
: "${COMMIT:?}"
OUT=${OUT:-$PWD/out}
W=$OUT/w; mkdir -p $W
export PYTHONPATH=$PWD SAMU_GIT_COMMIT=$COMMIT PYTHONUNBUFFERED=1
pack() { tar -czf $OUT/results.tar.gz -C $W .; }
. scripts/stage.sh
install_peers
timeout 170 python3 -m samu.cli bench --quiet --scopes packed --shapes packed --impls auto --peers none \
  --out $W/bench-packed.json > $W/packed.log 2>&1; echo "packed exit $?"
pack
timeout ${PRIMARY_LIMIT:-380} python3 -m samu.cli bench --quiet --scopes fwd,fb --shapes primary \
  --out $W/bench-primary.json > $W/primary.log 2>&1; echo "primary exit $?"
pack
tail -n 5 $W/packed.log $W/primary.log
