# Helpers shared by the end-to-end test scripts: MPI launch as root, a per-test temp dir, and
# assertions that print what they expected.
set -euo pipefail
MPTRAIN=${MPTRAIN:?path of the mptrain binary}
MPIEXEC=${MPIEXEC:-mpiexec}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
TMP=$(mktemp -d "${TMPDIR:-/tmp}/mpt-e2e.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
FAILURES=0
PASSES=0

mpirun_n() {  # mpirun_n NP args...
  local np=$1; shift
  "$MPIEXEC" -n "$np" --oversubscribe "$@"
}

fail() { echo "FAIL: $*" >&2; FAILURES=$((FAILURES + 1)); }
pass() { echo "ok: $*"; PASSES=$((PASSES + 1)); }

finish() {
  echo "$PASSES passed, $FAILURES failed"
  [ "$FAILURES" -eq 0 ]
}
