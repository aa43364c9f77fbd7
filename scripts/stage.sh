# Sourced by the GPU scripts: `stage NAME SECONDS COMMAND...` runs COMMAND under a time limit when NAME
# is among $STAGES, with a header and its exit status, and returns that status (124 past the limit). SIGINT
# first: Python stops between units, so a record keeps what finished.
stage() {
  local name=$1 limit=$2; shift 2
  case " $STAGES " in *" $name "*) ;; *) return 0 ;; esac
  echo "=== $name (limit ${limit}s): $*"
  local start=$SECONDS
  timeout --signal=INT --kill-after=15 "$limit" "$@"
  local rc=$?
  echo "=== $name: exit $rc after $((SECONDS - start))s"
  return $rc
}

# `workspace LOG`: the call's folders and log. OUT (absolute; default ./out) and W = $OUT/w for the records
# (exported: the Python scripts a call runs write there),
# PY, unbuffered Python with this checkout on PYTHONPATH, and everything printed from here on also
# appended to $OUT/LOG; `save` packs W into $OUT/results.tar.gz (what a call cut short still returns).
workspace() {
  OUT=$(mkdir -p "${OUT:-$PWD/out}" && cd "${OUT:-$PWD/out}" && pwd)
  export W="$OUT/w"
  mkdir -p "$W"
  PY="${PYTHON:-python3}"
  export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
  exec > >(tee -a "$OUT/$1") 2>&1
}

save() { tar -czf "$OUT/results.tar.gz" -C "$W" .; }

# `install_peers`: the peers' wheels carried in .whl/ (fla-core, accelerated-scan, einops) installed to /tmp/peers
# and put on PYTHONPATH; without them a line says the peer rows will be skipped.
install_peers() {
  local wheels
  wheels=$(ls .whl/fla_core-*.whl .whl/accelerated_scan-*.whl .whl/einops-*.whl 2>/dev/null)
  if [ -n "$wheels" ] && ${PY:-python3} -m pip install -q --no-index --no-deps --no-compile --upgrade \
      --target /tmp/peers $wheels; then
    export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}/tmp/peers"
    echo "peers installed:" $wheels
  else
    echo "peers: no fla-core / accelerated-scan wheels installed from .whl/; peer rows will be skipped"
  fi
}
