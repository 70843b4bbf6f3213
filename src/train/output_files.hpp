// What a training run leaves in --output.dir and --checkpoint.dir, and the rule that protects an
// earlier run's files (docs/reliability.md, "Safe file handling"): a run that does not continue
// from a checkpoint may not write over them unless --output.overwrite says so.
#pragma once

#include <string>
#include <vector>

#include "train/train.hpp"

namespace mpt::train {

// The files a run writes in OUTPUT_DIR that exist there now: metrics.jsonl, summary.json,
// timeline-rank<R>.json and tensorboard/events.out.tfevents.* (a symbolic link by such a name
// counts). WITH_EMPTY false: only those that hold something (an empty file has nothing to lose).
std::vector<std::string> run_files(const std::string& output_dir, bool with_empty);

// Rank 0, after the resume decision and before any output file is opened. CONTINUING: this run
// loaded a checkpoint, and appends to its run's files. Otherwise an earlier run's files in
// config.output_dir, or checkpoints in config.checkpoint.dir, are a UserError naming the first
// one, unless config.overwrite: then they are deleted (links removed, never followed).
void claim_run_directories(const RunConfig& config, bool continuing);

// UserError when PATH is a symbolic link: a run writes regular files inside OPTION's directory
// only, and a link could send a write outside it.
void require_not_symlink(const std::string& path, const std::string& option);

}  // namespace mpt::train
