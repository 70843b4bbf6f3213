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

# lint_scripts ROOT LABEL FILE...: every FILE passes bash -n, and shellcheck where installed
# (skipped, and said so, where it is not). Names are shown relative to ROOT.
lint_scripts() {
  local root=$1 label=$2; shift 2
  local s
  for s in "$@"; do
    bash -n "$s" && pass "bash -n ${s#"$root"/}" || fail "bash -n ${s#"$root"/}"
  done
  if command -v shellcheck >/dev/null; then
    shellcheck "$@" >"$TMP/shellcheck.log" 2>&1 && pass "shellcheck $label" ||
      { fail "shellcheck $label"; cat "$TMP/shellcheck.log" >&2; }
  else
    echo "skip: shellcheck not installed"
  fi
}

finish() {
  echo "$PASSES passed, $FAILURES failed"
  [ "$FAILURES" -eq 0 ]
}
