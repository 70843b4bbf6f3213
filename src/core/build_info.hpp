// What the running binary was built from, for logs, summary.json, checkpoints and exports.
#pragma once

namespace mpt {

// The source's short commit hash at build time ("-dirty" with uncommitted changes to tracked
// files; "unknown" outside a git checkout). Written by cmake/git_hash.cmake at every build, so
// it names the commit built, not the one configured.
const char* git_hash();

}  // namespace mpt
