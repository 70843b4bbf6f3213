# shellcheck shell=bash disable=SC2034  # MPT_BINDING is read by the scripts that source this
# Sourced by launch/mpirun.sh and launch/mptrain-run: what both need to start ranks on one
# machine with Open MPI's mpirun the same way (the binary, root permission, core binding).

# mpt_default_bin REPO_ROOT: the mptrain binary, $MPTRAIN_BIN or the release build's.
mpt_default_bin() {
  local bin=${MPTRAIN_BIN:-$1/build/release/mptrain}
  # A build without the preset's symlink has the binary in src/app/.
  if [[ ! -x "$bin" && -z "${MPTRAIN_BIN:-}" && -x "$1/build/release/src/app/mptrain" ]]; then
    bin=$1/build/release/src/app/mptrain
  fi
  printf '%s\n' "$bin"
}

# mpt_root_env: Open MPI refuses to run as root unless told that it is meant.
mpt_root_env() {
  if [[ "$(id -u)" -eq 0 ]]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  fi
}

# mpt_usable_cores: the cores this process may run on. GNU nproc reports OMP_NUM_THREADS when
# it is set, which is not what we ask.
mpt_usable_cores() {
  env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc
}

# mpt_mpirun_binding NP THREADS CORES: sets the array MPT_BINDING to mpirun's placement options.
# Ranks that fit the cores get THREADS cores each (--map-by slot:PE=THREADS --bind-to core), so
# their threads never share a core; ranks that do not fit would be refused by --bind-to core, so
# they oversubscribe unbound and the kernel spreads them.
mpt_mpirun_binding() {
  local np=$1 threads=$2 cores=$3
  if ((np * threads <= cores)); then
    if ((threads > 1)); then
      MPT_BINDING=(--map-by "slot:PE=$threads" --bind-to core)
    else
      MPT_BINDING=(--bind-to core)
    fi
  else
    MPT_BINDING=(--oversubscribe --bind-to none)
  fi
}
