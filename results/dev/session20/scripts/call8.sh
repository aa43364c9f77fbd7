#!/usr/bin/env bash
# Session 20, call 8: the width sweep on HEAD's LEANER, then with the entries memcheck passed in call 7 added (the
# summary pass capped at head dims 64 and 96, the backward summary capped at 160), one process each: does call 6's
# fault at (1, 32768, 2048) come back without the faulting dx entry, and what do the entries gain?
#   HEAD_COMMIT=<full hex> bash results/dev/session20/scripts/call8.sh
cd "$(dirname "$0")/../../../.."
. scripts/stage.sh
STAGES="profile"
workspace call8.log
SH="1,32768,1024;1,32768,1536;1,32768,2048;1,32768,2560"
for t in head extra; do
  mkdir -p $W/prof_$t
  set_extra=""
  [ $t = extra ] && set_extra="L['summary'].update({64: 'cap', 96: 'cap'}); L['bwd_summary'][160] = 'cap'"
  stage profile 120 env SAMU_GIT_COMMIT=$HEAD_COMMIT $PY -c "
import runpy, sys
from samu.ops.rglru.triton_fwd import LEANER as L
$set_extra
print('LEANER', L)
sys.argv = ['gpu_profile.py', '--op', 'rglru', '--backend', 'triton_chunked', '--shapes', '$SH', '--out', '$W/prof_$t']
runpy.run_path('scripts/gpu_profile.py', run_name='__main__')" > $W/prof_$t.log 2>&1
  grep -E "^LEANER|fb graph|Error" $W/prof_$t.log | sed "s/^/== $t /"
  save
done
echo "== done"
