# Sourced by the GPU scripts: `stage NAME SECONDS COMMAND...` runs COMMAND under a time limit when NAME
# is among $STAGES, with a header and its exit status. SIGINT first: Python stops between units, so a
# record keeps what finished.
stage() {
  local name=$1 limit=$2; shift 2
  case " $STAGES " in *" $name "*) ;; *) return 0 ;; esac
  echo "=== $name (limit ${limit}s): $*"
  local start=$SECONDS
  timeout --signal=INT --kill-after=15 "$limit" "$@"
  echo "=== $name: exit $? after $((SECONDS - start))s"
}
