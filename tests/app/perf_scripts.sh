#!/usr/bin/env bash
# The scripts in perf/ (issues #5 and #8): every one parses, and passes shellcheck where it is
# installed. perf/gpu_check.sh, which runs once on a lent GPU machine and nowhere else, refuses
# bad options with one line naming the option and exit 2, within seconds and before it builds
# or writes anything (a bad --budget there would cost the whole device session).
source "$(dirname "$0")/common.sh"
REPO=$(cd "$(dirname "$0")/../.." && pwd)

# --- 1. every perf script parses ------------------------------------------------------------------
lint_scripts "$REPO" "perf/*.sh" "$REPO"/perf/*.sh

# --- 2. gpu_check.sh's user errors ----------------------------------------------------------------
# expect_refused PATTERN ARGS...: exit 2 within 10 s, one line on stderr matching PATTERN, no
# build folder made (each case points --build-dir at a fresh path, after the bad option where
# the bad option is not itself --build-dir's value).
case_no=0
expect_refused() {
  local pattern=$1; shift
  case_no=$((case_no + 1))
  local build="$TMP/build-$case_no" what="gpu_check.sh $*"
  local rc=0
  (cd "$TMP" && OUT="$TMP/out-$case_no" timeout 10 bash "$REPO/perf/gpu_check.sh" "$@" \
    --build-dir "$build") >"$TMP/stdout" 2>"$TMP/stderr" || rc=$?
  local lines
  lines=$(wc -l <"$TMP/stderr")
  if [[ $rc -eq 2 && $lines -eq 1 ]] && grep -Eq -- "$pattern" "$TMP/stderr" && [[ ! -e $build ]]; then
    pass "$what: $(cat "$TMP/stderr")"
  else
    fail "$what: rc=$rc (want 2), $lines stderr lines (want 1 matching '$pattern'), build folder $([[ -e $build ]] && echo made || echo absent)"
    cat "$TMP/stdout" "$TMP/stderr" >&2
  fi
}
expect_refused "--budget takes whole seconds, not 'x'" --budget x
expect_refused "--budget takes whole seconds, not '-5'" --budget -5
expect_refused "--steps takes a positive whole number, not '0'" --steps 0
expect_refused "--batch takes a positive whole number, not '2k'" --batch 2k
expect_refused "--jobs takes a positive whole number, not 'all'" --jobs all
expect_refused "unknown option --step" --step 10
expect_refused "--bundle .*/missing.tar.xz: no such file; hint: make it with perf/gpu_bundle.sh" \
  --bundle missing.tar.xz
# A value-taking option last, with no value.
rc=0
(cd "$TMP" && timeout 10 bash "$REPO/perf/gpu_check.sh" --budget) >"$TMP/stdout" 2>"$TMP/stderr" || rc=$?
[[ $rc -eq 2 ]] && grep -q -- "--budget needs a value" "$TMP/stderr" &&
  pass "gpu_check.sh --budget (no value): $(cat "$TMP/stderr")" ||
  { fail "gpu_check.sh --budget (no value): rc=$rc"; cat "$TMP/stderr" >&2; }
# --help is not an error: the usage, exit 0.
rc=0
(cd "$TMP" && timeout 10 bash "$REPO/perf/gpu_check.sh" --help) >"$TMP/stdout" 2>&1 || rc=$?
[[ $rc -eq 0 ]] && grep -q -- "--budget S" "$TMP/stdout" && pass "gpu_check.sh --help" ||
  { fail "gpu_check.sh --help: rc=$rc"; cat "$TMP/stdout" >&2; }

finish
