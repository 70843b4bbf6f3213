#!/usr/bin/env bash
# Runs mptrain (or any command) under Open MPI's mpirun on one machine with sensible defaults:
# root permission, oversubscription or core binding, and the OpenMP thread count.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: launch/mpirun.sh NP [mptrain args...]
       launch/mpirun.sh NP -- COMMAND [args...]

Starts NP ranks of build/release/mptrain (first form) or of COMMAND (second form) with mpirun:
  - OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM)=1 when running as root;
  - when NP x OMP_NUM_THREADS <= cores: --bind-to core (each rank gets OMP_NUM_THREADS cores);
  - otherwise --oversubscribe --bind-to none;
  - -x OMP_NUM_THREADS (default 1) so that every rank sees it.

Example: launch/mpirun.sh 2 train --config inputs/fashion-mnist-mlp.ini

Environment:
  OMP_NUM_THREADS      threads per rank (default 1)
  MPTRAIN_BIN          the binary (default build/release/mptrain, relative to the repository)
  MPIRUN               the launcher (default mpirun)
  MPTRAIN_MPIRUN_ARGS  extra mpirun arguments, split on spaces (e.g. "--report-bindings")
  MPTRAIN_ECHO         1: print the mpirun command line to stderr before running it

To stop a training run cleanly (checkpoint, exit 0), send SIGUSR1 to mpirun, which forwards it
to every rank; mpirun answers SIGTERM and SIGINT by killing the ranks. launch/mpirun-train.sh
does this for you. launch/mptrain-run starts ranks the same way, and also under Slurm's srun,
with a GPU per rank, a layout line per rank and that signal forwarding built in.
EOF
}

if (($# < 1)) || [[ "$1" == -h || "$1" == --help ]]; then
  usage
  (($# >= 1)) && exit 0
  exit 2
fi
np=$1
shift
if ! [[ "$np" =~ ^[1-9][0-9]*$ ]]; then
  echo "launch/mpirun.sh: NP must be a positive integer, got '$np'" >&2
  exit 2
fi

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=launch/lib/common.sh disable=SC1091
source "$repo_root/launch/lib/common.sh"
if [[ "${1:-}" == -- ]]; then
  shift
  (($# >= 1)) || { echo "launch/mpirun.sh: nothing to run after --" >&2; exit 2; }
  command=("$@")
else
  bin=$(mpt_default_bin "$repo_root")
  if [[ ! -x "$bin" ]]; then
    echo "launch/mpirun.sh: $bin not found or not executable." >&2
    echo "hint: build it with 'cmake --preset release && cmake --build --preset release'" \
      "or run launch/quickstart.sh" >&2
    exit 1
  fi
  command=("$bin" "$@")
fi

mpt_root_env
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
threads=$OMP_NUM_THREADS
[[ "$threads" =~ ^[1-9][0-9]*$ ]] || threads=1
mpt_mpirun_binding "$np" "$threads" "$(mpt_usable_cores)"
mpirun_args=(-np "$np" -x OMP_NUM_THREADS "${MPT_BINDING[@]}")
if [[ -n "${MPTRAIN_MPIRUN_ARGS:-}" ]]; then
  read -r -a extra <<<"$MPTRAIN_MPIRUN_ARGS"
  mpirun_args+=("${extra[@]}")
fi

if [[ "${MPTRAIN_ECHO:-0}" == 1 ]]; then
  { printf '+'; printf ' %q' "${MPIRUN:-mpirun}" "${mpirun_args[@]}" "${command[@]}"; echo; } >&2
fi
exec "${MPIRUN:-mpirun}" "${mpirun_args[@]}" "${command[@]}"
