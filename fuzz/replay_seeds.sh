#!/usr/bin/env bash
# CTest fuzz_replay_seeds: makes the seed corpora with the real binary (make_seeds.sh) and runs
# every replay_<target> over its seeds, so that each target accepts the valid inputs of its kind
# without a finding, in the ordinary build (no clang needed).
# Usage: fuzz/replay_seeds.sh MPTRAIN REPLAY_DIR
set -euo pipefail
mptrain=$1
replay_dir=$2
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
seeds=$(mktemp -d "${TMPDIR:-/tmp}/mptrain-replay-seeds.XXXXXX")
trap 'rm -rf "$seeds"' EXIT
"$here/make_seeds.sh" "$mptrain" "$seeds"
for dir in "$seeds"/*/; do
  target=$(basename "$dir")
  count=$(find "$dir" -type f | wc -l)
  ((count > 0)) || { echo "replay_seeds: no seeds for $target" >&2; exit 1; }
  "$replay_dir/replay_$target" "$dir" | tail -n 1
done
