// The output-directory rule: a fresh run never writes silently over an earlier run's metrics,
// summary, timelines, TensorBoard events or checkpoints; a continued run appends to its own.
#include "train/output_files.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "ckpt/ckpt.hpp"
#include "core/error.hpp"

namespace mpt::train {
namespace {

namespace fs = std::filesystem;

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}
bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The run's own file names in a directory listing: metrics.jsonl, summary.json and
// timeline-rank<R>.json in output.dir; events.out.tfevents.* in output.dir/tensorboard.
bool is_run_file(const std::string& name, bool in_tensorboard) {
  if (in_tensorboard) return starts_with(name, "events.out.tfevents.");
  return name == "metrics.jsonl" || name == "summary.json" ||
         (starts_with(name, "timeline-rank") && ends_with(name, ".json"));
}

// Appends DIR's run files to FILES (nothing when DIR is missing or unreadable: nothing to lose).
void list_run_files(const fs::path& dir, bool in_tensorboard, bool with_empty,
                    std::vector<std::string>& files) {
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (!is_run_file(name, in_tensorboard)) continue;
    std::error_code ignored;
    const auto status = entry.symlink_status(ignored);
    const bool empty_file = fs::is_regular_file(status) && entry.file_size(ignored) == 0;
    if (with_empty || !empty_file) files.push_back(entry.path().string());
  }
}

}  // namespace

std::vector<std::string> run_files(const std::string& output_dir, bool with_empty) {
  std::vector<std::string> files;
  if (output_dir.empty()) return files;
  list_run_files(output_dir, /*in_tensorboard=*/false, with_empty, files);
  const fs::path tensorboard = fs::path(output_dir) / "tensorboard";
  std::error_code ignored;
  if (fs::is_directory(fs::symlink_status(tensorboard, ignored)))
    list_run_files(tensorboard, /*in_tensorboard=*/true, with_empty, files);
  std::sort(files.begin(), files.end());
  return files;
}

void require_not_symlink(const std::string& path, const std::string& option) {
  std::error_code ignored;
  MPT_REQUIRE(
      !fs::is_symlink(fs::symlink_status(path, ignored)),
      "'" + path + "' is a symbolic link; mptrain writes only regular files inside " + option,
      "remove the link, or choose another " + option);
}

void claim_run_directories(const RunConfig& config, bool continuing) {
  if (continuing) return;  // the checkpoint's run goes on: its files are appended to
  const std::string why =
      config.checkpoint.resume == "auto"
          ? " (--resume=auto found no checkpoint in '" + config.checkpoint.dir + "')"
          : " (--resume=" + config.checkpoint.resume + ")";
  const std::vector<std::string> outputs = run_files(config.output_dir, /*with_empty=*/false);
  const std::vector<std::string> checkpoints = config.checkpoint.dir.empty()
                                                   ? std::vector<std::string>()
                                                   : ckpt::checkpoint_files(config.checkpoint.dir);
  if (!config.overwrite) {
    MPT_REQUIRE(outputs.empty(),
                "--output.dir '" + config.output_dir + "' holds an earlier run's files ('" +
                    (outputs.empty() ? std::string() : outputs.front()) +
                    "') and this run starts fresh" + why,
                "continue it with --resume=auto (with its --checkpoint.dir), choose another "
                "--output.dir, or pass --output.overwrite to replace them");
    MPT_REQUIRE(checkpoints.empty(),
                "--checkpoint.dir '" + config.checkpoint.dir +
                    "' holds an earlier run's checkpoints ('" +
                    (checkpoints.empty() ? std::string() : checkpoints.front()) +
                    "') and this run starts fresh" + why +
                    ": its checkpoints would mix with them and pruning would delete them",
                "continue it with --resume=auto, choose another --checkpoint.dir, or pass "
                "--output.overwrite to delete them");
    return;
  }
  // --output.overwrite: the earlier run's files go now, so that none of them (a timeline of a
  // rank this run does not have, old TensorBoard events, a checkpoint --resume=auto would
  // prefer) outlives it mixed with this run's.
  for (const auto& file : run_files(config.output_dir, /*with_empty=*/true)) {
    std::error_code error;
    fs::remove(file, error);  // a link is removed, not followed
    MPT_REQUIRE(!error, "cannot remove '" + file + "' (--output.overwrite): " + error.message(),
                "check the permissions of --output.dir, or choose another --output.dir");
  }
  if (!config.checkpoint.dir.empty()) ckpt::remove_checkpoints(config.checkpoint.dir);
  if (!outputs.empty() || !checkpoints.empty()) {
    std::printf("output: --output.overwrite removed %zu file(s) of an earlier run from '%s'",
                outputs.size(), config.output_dir.c_str());
    if (!checkpoints.empty())
      std::printf(" and %zu checkpoint(s) from '%s'", checkpoints.size(),
                  config.checkpoint.dir.c_str());
    std::printf("\n");
    std::fflush(stdout);
  }
}

}  // namespace mpt::train
