#!/usr/bin/env bash
# The newcomer's one command: install dependencies, build Release, prepare Fashion-MNIST and train
# a small MLP on 2 MPI ranks, then print the test accuracy. Re-running skips the work already done.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: launch/quickstart.sh [--np N] [--config FILE] [--skip-install] [--help]

  1. launch/install-deps.sh --no-torch   (skipped with --skip-install or MPTRAIN_SKIP_INSTALL=1)
  2. cmake --preset release (only if build/release/CMakeCache.txt is missing), then
     cmake --build --preset release (incremental)
  3. mptrain prepare fashion-mnist, only if data/fashion-mnist/{train,test}.h5 are missing
  4. launch/mpirun.sh N train --config FILE --output.overwrite, with OMP_NUM_THREADS=1 (a rerun
     trains afresh, replacing the earlier run's outputs and checkpoints)
  5. prints the test accuracy from the run's summary.json

  --np N          MPI ranks (default 2)
  --config FILE   training config (default inputs/fashion-mnist-mlp.ini)
  --skip-install  do not check or install Debian packages
EOF
}

np=2
config=inputs/fashion-mnist-mlp.ini
skip_install=${MPTRAIN_SKIP_INSTALL:-0}
while (($#)); do
  case "$1" in
    --np) [[ $# -ge 2 ]] || { echo "quickstart: --np needs a value" >&2; exit 2; }; np=$2; shift ;;
    --np=*) np=${1#--np=} ;;
    --config) [[ $# -ge 2 ]] || { echo "quickstart: --config needs a file" >&2; exit 2; }; config=$2; shift ;;
    --config=*) config=${1#--config=} ;;
    --skip-install) skip_install=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "quickstart: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
[[ -f "$config" ]] || { echo "quickstart: config file '$config' not found" >&2; exit 2; }

# ini_get SECTION KEY FILE: the value of KEY in [SECTION] of an INI file. Like
# Boost.Program_options, '#' starts a comment anywhere on a line.
ini_get() {
  awk -v section="$1" -v key="$2" '
    { sub(/#.*/, "") }
    /^[[:space:]]*\[/ { gsub(/[][[:space:]]/, ""); current = $0; next }
    current == section {
      eq = index($0, "=")
      if (eq == 0) next
      k = substr($0, 1, eq - 1); v = substr($0, eq + 1)
      gsub(/^[[:space:]]+|[[:space:]]+$/, "", k); gsub(/^[[:space:]]+|[[:space:]]+$/, "", v)
      if (k == key) { print v; exit }
    }' "$3"
}

step() { echo; echo "== quickstart: $* =="; }

if [[ "$skip_install" != 1 ]]; then
  step "dependencies"
  launch/install-deps.sh --no-torch
fi

step "build (Release)"
if [[ ! -f build/release/CMakeCache.txt ]]; then
  cmake --preset release
fi
# (GNU nproc would report OMP_NUM_THREADS if it were set, hence env -u.)
cmake --build --preset release -j"$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)"

mptrain=build/release/mptrain
[[ -x "$mptrain" || ! -x build/release/src/app/mptrain ]] || mptrain=build/release/src/app/mptrain
[[ -x "$mptrain" ]] || { echo "quickstart: the build did not produce $mptrain" >&2; exit 1; }

data_dir=data/fashion-mnist
if [[ -f "$data_dir/train.h5" && -f "$data_dir/test.h5" ]]; then
  step "data: $data_dir already prepared"
else
  step "data: preparing Fashion-MNIST in $data_dir"
  "$mptrain" prepare fashion-mnist --source /usr/share/datasets/fashion-mnist --out "$data_dir"
fi

output_dir=$(ini_get output dir "$config")
output_dir=${output_dir:-runs/fashion-mnist-mlp}
epochs=$(ini_get train epochs "$config")
summary=$output_dir/summary.json
rm -f "$summary"  # so that a stale summary from an earlier run is never reported

step "train: $np ranks, $config"
train_start=$SECONDS
# --output.overwrite: a rerun trains afresh; without it mptrain refuses to replace the earlier
# run's files in the config's output and checkpoint directories.
OMP_NUM_THREADS=1 MPTRAIN_BIN="$repo_root/$mptrain" launch/mpirun.sh "$np" train --config "$config" \
  --output.overwrite
train_seconds=$((SECONDS - train_start))

[[ -f "$summary" ]] || { echo "quickstart: training finished but $summary is missing" >&2; exit 1; }
accuracy=$(/usr/bin/python3 -c 'import json, sys; print("%.4f" % json.load(open(sys.argv[1]))["test_accuracy"])' "$summary") || {
  echo "quickstart: could not read test_accuracy from $summary" >&2
  exit 1
}
echo
echo "quickstart: test accuracy $accuracy ($np ranks, ${epochs:-?} epochs, ${train_seconds} s)"
