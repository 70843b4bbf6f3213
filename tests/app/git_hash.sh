#!/usr/bin/env bash
# cmake/git_hash.cmake, which every build runs to write the commit hash into one generated source
# (mpt::git_hash(): --version, checkpoints, exports, summary.json). In a scratch git repository:
# the short hash of HEAD; the file left untouched (its mtime kept, so nothing recompiles) when
# nothing changed; a new hash after a new commit; "-dirty" when a tracked file differs;
# "unknown" outside a checkout. The binary's --version carries what the build wrote.
source "$(dirname "$0")/common.sh"
SCRIPT=$(cd "$(dirname "$0")/../.." && pwd)/cmake/git_hash.cmake
repo="$TMP/repo" out="$TMP/git_hash.cpp"
mkdir -p "$repo"
git_() { git -C "$repo" -c user.name=t -c user.email=t@t -c commit.gpgsign=false "$@"; }
generate() { cmake -DSOURCE_DIR="$1" -DOUTPUT="$out" -P "$SCRIPT"; }
written() { sed -n 's/.*return "\(.*\)";.*/\1/p' "$out"; }

git_ init -q
echo one >"$repo/file"
git_ add file && git_ commit -qm one
generate "$repo"
first=$(git_ rev-parse --short HEAD)
[ "$(written)" = "$first" ] && pass "the short hash of HEAD: $first" ||
  fail "wrote '$(written)', HEAD is $first"

touch -d '2000-01-01' "$out"
generate "$repo"
[ "$(stat -c %Y "$out")" = "$(date -d '2000-01-01' +%s)" ] &&
  pass "unchanged state: the file is not rewritten (nothing recompiles)" ||
  fail "the file was rewritten although the hash is the same"

echo two >"$repo/file"
generate "$repo"
[ "$(written)" = "$first-dirty" ] && pass "a tracked file edited: $first-dirty" ||
  fail "edited tree: wrote '$(written)', want $first-dirty"

git_ commit -qam two
generate "$repo"
second=$(git_ rev-parse --short HEAD)
[ "$second" != "$first" ] && [ "$(written)" = "$second" ] &&
  pass "a new commit: $first -> $second" || fail "after a commit: wrote '$(written)', HEAD is $second"

echo untracked >"$repo/new"
generate "$repo"
[ "$(written)" = "$second" ] && pass "an untracked file leaves it clean" ||
  fail "untracked file: wrote '$(written)', want $second"

mkdir -p "$TMP/plain"
GIT_CEILING_DIRECTORIES="$TMP" generate "$TMP/plain"
[ "$(written)" = unknown ] && pass "outside a checkout: unknown" ||
  fail "outside a checkout: wrote '$(written)'"

# The binary under test says what its build wrote (build/generated/git_hash.cpp).
built=$(dirname "$MPTRAIN")/generated/git_hash.cpp
if [ -f "$built" ]; then
  want=$(sed -n 's/.*return "\(.*\)";.*/\1/p' "$built")
  "$MPTRAIN" --version | grep -qF "($want)" && pass "mptrain --version: ($want)" ||
    fail "mptrain --version: $("$MPTRAIN" --version | head -n 1), the build wrote $want"
else
  fail "no $built beside the binary"
fi
finish
