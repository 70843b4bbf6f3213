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
expect_refused "--deadline takes whole seconds, not '0'" --deadline 0
expect_refused "--deadline takes whole seconds, not '8m'" --deadline 8m
expect_refused "unknown option --step" --step 10
expect_refused "--summary-only: no build folder '.*/build-[0-9]+'; hint: name the folder" --summary-only
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

# --- 3. the summary table from the logs (gpu_check.sh --summary-only) -----------------------------
# One line of each kind that gpu_bench, perf/pytorch_gpu.py and the GEMM peer print; the rows
# must pick the right line (the cnn's conv path, the graphs tag, the cast-first spec with its
# commas) and divide the right pair.
logs="$TMP/summary-logs"
mkdir -p "$logs"
cat >"$logs/gpu_bench.log" <<'LOG'
mptrain-model model=mlp precision=fp16 batch=256 steps=200 samples_per_s=1097868.0
mptrain-kernels model=mlp precision=fp16 batch=256 steps=200 samples_per_s=1326610.0
mptrain-model model=cnn precision=fp16 batch=256 steps=200 conv=cudnn samples_per_s=90000.0
mptrain-model model=cnn precision=fp16 batch=256 steps=200 conv=im2col samples_per_s=50000.0
mptrain-model model=mlp precision=fp32 batch=256 steps=200 samples_per_s=1000000.0
mptrain-model model=cnn precision=fp32 batch=256 steps=200 conv=cudnn samples_per_s=40000.0
mptrain-model model=cnn precision=fp32 batch=256 steps=200 conv=im2col samples_per_s=20000.0
gemm precision=fp16 m=n=k=4096 tflops=785.0
LOG
# The trainer's lines: the data-wait runs (prefetch 8 and 0) and a failed run.
cat >"$logs/trainer.log" <<'LOG'
trainer model=mlp device=cuda prefetch=0 io_threads=1 normalize=auto samples_per_s=100000.0 data_wait_fraction=0.9000
trainer model=mlp device=cuda prefetch=8 io_threads=4 normalize=auto samples_per_s=800000.0 data_wait_fraction=0.0100
trainer model=mlp device=cuda prefetch=8 io_threads=4 normalize=reader samples_per_s=700000.0 data_wait_fraction=0.0200
trainer model=cnn device=cuda prefetch=8 io_threads=4 normalize=auto failed (exit 1): mptrain: error: x
LOG
cat >"$logs/gpu_bench_graphs.log" <<'LOG'
mptrain-model model=cnn precision=fp16 batch=256 steps=200 conv=cudnn graphs=on samples_per_s=120000.0
LOG
cat >"$logs/pytorch.log" <<'LOG'
pytorch model=mlp precision=fp16 batch=256 steps=200 samples_per_s=148571.0
pytorch model=cnn precision=fp16 batch=256 steps=200 samples_per_s=60000.0
torch-gemm precision=fp16 m=n=k=4096 tflops=823.0
LOG
cat >"$logs/gpu_bench_big.log" <<'LOG'
mptrain-model model=mlp precision=fp16 batch=8192 steps=50 samples_per_s=1930705.0
mptrain-model model=flatten,dense:1024,relu,dense:1024,relu,dense:10 precision=fp16 batch=8192 steps=50 samples_per_s=2500000.0
mptrain-kernels model=mlp precision=fp16 batch=8192 steps=50 samples_per_s=5000000.0
LOG
echo "pytorch model=mlp precision=fp16 batch=8192 steps=50 samples_per_s=4696919.0" >"$logs/pytorch_big.log"
# ctest -V's lines of gpu_kernels: a passing check, a failing one and a crashed case.
cat >"$logs/ctest.log" <<'LOG'
1: case relu (relu.hpp)
1:   ok    relu f32
1:   FAIL  softmax_xent_forward loss [256x10]: got 1, want 2
1:   FAIL  case conv2d crashed: signal 11 (Segmentation fault); the cases after it run in a new process
1: 40 passed, 2 failed
LOG
# compute-sanitizer over gpu_kernels: memcheck finished (two processes followed, one report seen
# twice, an API error without a location), racecheck cut short (no exit line yet).
cat >"$logs/sanitizer-memcheck.log" <<'LOG'
========= COMPUTE-SANITIZER
gpu_kernels on NVIDIA H200 (sm_90)
case relu (relu.hpp)
========= Invalid __global__ read of size 4 bytes
=========     at mpt::kernels::cuda::relu_kernel(const float *, float *, long)+0x70 in relu.cu:21
=========     by thread (255,0,0) in block (3,0,0)
=========     Address 0x7f0000001000 is out of bounds
=========
========= Invalid __global__ read of size 4 bytes
=========     at mpt::kernels::cuda::relu_kernel(const float *, float *, long)+0x70 in relu.cu:21
=========     by thread (254,0,0) in block (3,0,0)
========= Program hit cudaErrorInvalidValue (error 1) due to "invalid argument" on CUDA API call to cudaMemcpyAsync.
=========     Saved host backtrace up to driver entry point at error
50 passed, 1 failed
========= ERROR SUMMARY: 3 errors
========= ERROR SUMMARY: 0 errors
gpu_check: exit 0
LOG
cat >"$logs/sanitizer-racecheck.log" <<'LOG'
========= COMPUTE-SANITIZER
case softmax_xent (softmax_xent.hpp)
LOG
rc=0
(cd "$TMP" && timeout 20 bash "$REPO/perf/gpu_check.sh" --summary-only --build-dir "$logs") \
  >"$TMP/summary.txt" 2>"$TMP/summary.err" || rc=$?
[[ $rc -eq 0 ]] && pass "gpu_check.sh --summary-only: exit 0" ||
  { fail "gpu_check.sh --summary-only: exit $rc"; cat "$TMP/summary.err" >&2; }
# summary_has WHAT LINE...: each LINE is a whole line of the summary.
summary_has() {
  local what=$1 line
  shift
  for line in "$@"; do
    grep -qxF -- "$line" "$TMP/summary.txt" && pass "summary $what: $line" ||
      { fail "summary lacks the line $line"; cat "$TMP/summary.txt" >&2; }
  done
}
summary_has row "| mlp | fp16 | 256 | 1097868.0 | 1326610.0 | 148571.0 | 7.39 | 8.93 |" \
  "| cnn (conv im2col) | fp16 | 256 | 50000.0 | n/a | 60000.0 | 0.83 | n/a |" \
  "| cnn (graphs) (conv cudnn) | fp16 | 256 | 120000.0 | 90000.0 | 1.33 | 60000.0 | 2.00 |" \
  "| mlp | fp16 | 1930705.0 | 2500000.0 | 5000000.0 | 4696919.0 | 0.41 | 0.53 | 1.06 |" \
  "| 4096 | fp16 | 785.0 | 823.0 | 0.95 |"
summary_has "compares the trainer with gpu_bench" \
  "trainer model=mlp (prefetch 8, 120 steps) / gpu_bench nn::Model fp32: 0.80" \
  "trainer model=cnn (prefetch 8, 120 steps) / gpu_bench nn::Model fp32: n/a"
summary_has "names the failure" "tests/gpu failures (2; the first 12, all in ctest.log):" \
  "  - softmax_xent_forward loss [256x10]: got 1, want 2" \
  "  - case conv2d crashed: signal 11 (Segmentation fault); the cases after it run in a new process"
summary_has "has the sanitizer's line" \
  "compute-sanitizer memcheck over gpu_kernels: 3 errors in 2 processes; 50 passed, 1 failed; exit 0" \
  "  - Invalid __global__ read of size 4 bytes (at mpt::kernels::cuda::relu_kernel(const float *, float *, long)+0x70 in relu.cu:21)" \
  "  - Program hit cudaErrorInvalidValue (error 1) due to \"invalid argument\" on CUDA API call to cudaMemcpyAsync." \
  "compute-sanitizer racecheck over gpu_kernels: no ERROR SUMMARY; no test counts; no exit status (running, or cut short)"
[[ $(grep -c "Invalid __global__ read" "$TMP/summary.txt") -eq 1 ]] &&
  pass "summary lists a repeated sanitizer report once" ||
  fail "summary lists the repeated sanitizer report $(grep -c "Invalid __global__ read" "$TMP/summary.txt") times"
grep -q "relu f32" "$TMP/summary.txt" && fail "summary lists a passing check" ||
  pass "summary leaves the passing checks out"
[[ ! -e $logs/gpu_check.txt && ! -e $logs/build.log ]] && pass "--summary-only writes nothing" ||
  fail "--summary-only wrote into the logs' folder"

# --- 4. a gpu_check.sh run cut short still returns its summary ---------------------------------
# The device tool kills a command at its limit, with no trap run, and returns only $OUT. Here (no
# GPU) the check configures the full build, which takes longer than the few seconds these runs
# allow it: a tight --deadline must stop the configure and skip every later command, and a kill
# -9 must leave the summary of the stage that was running in $OUT.
# summary_says CASE PATTERN: $OUT of CASE holds gpu_check.txt matching PATTERN and the logs.
summary_says() {
  local out="$TMP/$1-out"
  if grep -Eq -- "$2" "$out/gpu_check.txt" 2>/dev/null && tar -tzf "$out/gpu_check_logs.tar.gz" >/dev/null 2>&1; then
    pass "gpu_check.sh $1: \$OUT/gpu_check.txt: $(grep -Em1 -- "$2" "$out/gpu_check.txt")"
  else
    fail "gpu_check.sh $1: \$OUT lacks a summary matching '$2' or the logs' archive"
    ls -la "$out" >&2 || true
    cat "$out/gpu_check.txt" >&2 || true
  fi
}
mkdir -p "$TMP/deadline-out" "$TMP/killed-out"
# --deadline 19: below the 15 s kept for the summary plus the 5 s a command needs to start, so
# the configure never starts, however quick the first stage (with 20 it started, with a 5 s
# timeout, whenever that stage took under a second: 2 runs in 4 failed on 2026-12-07).
rc=0
begin=$SECONDS
(cd "$TMP" && OUT="$TMP/deadline-out" timeout 60 bash "$REPO/perf/gpu_check.sh" --deadline 19 \
  --build-dir "$TMP/deadline-build") >"$TMP/deadline.log" 2>&1 || rc=$?
took=$((SECONDS - begin))
if [[ $rc -eq 1 && $took -le 25 ]] && grep -q "configure failed (exit 125" "$TMP/deadline.log"; then
  pass "gpu_check.sh --deadline 19: exit 1 after $took s, the configure not started"
else
  fail "gpu_check.sh --deadline 19: exit $rc after $took s (want 1 within 25 s, the configure not started)"
  tail -20 "$TMP/deadline.log" >&2
fi
summary_says deadline "^check: ended, but [0-9]+ commands were not started before the --deadline of 19 s"
# Listed to a file: under pipefail, grep -q's early exit would fail tar with SIGPIPE now and then.
tar -tzf "$TMP/deadline-out/gpu_check_logs.tar.gz" >"$TMP/deadline-archive.txt" 2>/dev/null || true
grep -q "deadline.log" "$TMP/deadline-archive.txt" &&
  pass "gpu_check.sh --deadline 19: deadline.log in the logs' archive" ||
  fail "gpu_check.sh --deadline 19: no deadline.log in the logs' archive"

# Killed (SIGKILL to every process of its session, as the device tool kills a command with all it
# started) while a stage runs: a stand-in nvidia-smi that hangs holds the first stage, so that no
# configure is under way (CMake's children outlive a kill and keep writing to the build folder).
# The new session's leader writes its pid, the session's id, whether or not setsid had to fork.
mkdir -p "$TMP/hung-bin"
printf '#!/bin/sh\nexec sleep 60\n' >"$TMP/hung-bin/nvidia-smi"
chmod +x "$TMP/hung-bin/nvidia-smi"
(cd "$TMP" && PATH="$TMP/hung-bin:$PATH" OUT="$TMP/killed-out" \
  setsid bash -c 'echo $$ > killed.pid; exec bash "$0" --build-dir "$1"' \
  "$REPO/perf/gpu_check.sh" "$TMP/killed-build") >"$TMP/killed.log" 2>&1 &
for _ in $(seq 100); do
  grep -q "^== .*GPU" "$TMP/killed.log" 2>/dev/null && break
  sleep 0.1
done
sleep 1
session=$(cat "$TMP/killed.pid")
pkill -KILL -s "$session" || fail "gpu_check.sh: no session $session to kill (setsid)"
for _ in $(seq 100); do
  pgrep -s "$session" >/dev/null || break
  sleep 0.1
done
wait 2>/dev/null || true
summary_says killed "^check: PARTIAL, written as the stage 'GPU' began"

finish
