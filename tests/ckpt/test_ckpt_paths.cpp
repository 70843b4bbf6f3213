// Checkpoint directories act only inside themselves (issue #11, docs/reliability.md "Safe file
// handling"): 'latest' cannot name a path that leaves the directory, pruning and
// --output.overwrite delete only regular ckpt files directly inside it (links are never
// followed), and every file and directory is created with the process's umask.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "ckpt/ckpt.hpp"
#include "core/error.hpp"
#include "tests/test_util.hpp"

namespace mpt::ckpt {
namespace {

namespace fs = std::filesystem;
using test::TempDir;
using test::user_error_text;

CheckpointMeta meta_at(std::int64_t step) {
  CheckpointMeta meta;
  meta.model_spec = "dense:2";
  meta.sample_shape = {3};
  meta.num_classes = 2;
  meta.step = step;
  return meta;
}

std::vector<NamedTensor> small_weights() {
  Tensor weight({2, 3}, DType::f32);
  for (std::int64_t i = 0; i < weight.numel(); ++i)
    weight.data<float>()[i] = 0.5f * static_cast<float>(i);
  return {{"dense0/weight", weight}};
}

std::string save_at(const std::string& dir, std::int64_t step, int keep = 1) {
  SaveOptions options;
  options.keep = keep;
  TrainingState state;
  state.optimizer = "sgd";
  return save_checkpoint(dir, meta_at(step), small_weights(), {}, state, options);
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

unsigned mode_of(const std::string& path) {
  struct stat info {};
  EXPECT_EQ(::stat(path.c_str(), &info), 0) << path;
  return info.st_mode & 0777u;
}

TEST(CheckpointPaths, LatestMustNameAFileInsideTheDirectory) {
  TempDir root("ckpt-latest-escape");
  const std::string dir = root.file("run"), other = root.file("other");
  save_at(dir, 5);
  save_at(other, 7);
  EXPECT_EQ(load_weights(dir).meta.step, 5);  // as written: 'latest' names ckpt-5.h5
  for (const std::string& name : {std::string("../other/ckpt-7.h5"), std::string(".."),
                                  std::string("."), other + "/ckpt-7.h5"}) {
    write_text(dir + "/latest", name + "\n");
    const std::string text = user_error_text([&] { load_weights(dir); });
    EXPECT_NE(text.find("'" + dir + "/latest' does not name a checkpoint file in '" + dir + "'"),
              std::string::npos)
        << name << ": " << text;
    EXPECT_NE(text.find("hint: "), std::string::npos) << text;
  }
}

TEST(CheckpointPaths, LatestThroughALinkThatLeavesTheDirectoryIsRefused) {
  TempDir root("ckpt-latest-link");
  const std::string dir = root.file("run"), other = root.file("other");
  save_at(dir, 5);
  const std::string outside = save_at(other, 7);
  fs::create_symlink(outside, dir + "/ckpt-9.h5");
  write_text(dir + "/latest", "ckpt-9.h5\n");
  const std::string text = user_error_text([&] { load_weights(dir); });
  EXPECT_NE(text.find("'" + dir + "/ckpt-9.h5' is a link to '" + outside +
                      "', outside the checkpoint directory"),
            std::string::npos)
      << text;
  // A link that stays inside the directory is fine (a site's own "best" link, say).
  fs::create_symlink("ckpt-5.h5", dir + "/best.h5");
  write_text(dir + "/latest", "best.h5\n");
  EXPECT_EQ(load_weights(dir).meta.step, 5);
}

TEST(CheckpointPaths, PruningDeletesOnlyRegularCheckpointFilesInside) {
  TempDir root("ckpt-prune-links");
  const std::string dir = root.file("run");
  fs::create_directories(dir);
  // Files outside, reachable through links named like a checkpoint and like a write's debris.
  write_text(root.file("precious.h5"), "keep me");
  write_text(root.file("precious.tmp"), "keep me too");
  fs::create_symlink(root.file("precious.h5"), dir + "/ckpt-1.h5");
  fs::create_symlink(root.file("precious.tmp"), dir + "/ckpt-2.h5.tmp");
  fs::create_directories(dir + "/ckpt-3.h5");  // a directory by a checkpoint's name
  write_text(dir + "/notes.txt", "mine");
  for (std::int64_t step = 10; step <= 14; ++step) save_at(dir, step, /*keep=*/1);
  EXPECT_EQ(read_text(root.file("precious.h5")), "keep me");
  EXPECT_EQ(read_text(root.file("precious.tmp")), "keep me too");
  EXPECT_TRUE(fs::is_symlink(dir + "/ckpt-1.h5"));
  EXPECT_TRUE(fs::is_directory(dir + "/ckpt-3.h5"));
  EXPECT_TRUE(fs::exists(dir + "/notes.txt"));
  EXPECT_FALSE(fs::exists(dir + "/ckpt-13.h5"));  // pruning still works on the real ones
  EXPECT_EQ(checkpoint_files(dir), std::vector<std::string>{dir + "/ckpt-14.h5"});
}

TEST(CheckpointPaths, RemoveCheckpointsLeavesLinkTargetsAndOtherFiles) {
  TempDir root("ckpt-remove");
  const std::string dir = root.file("run");
  save_at(dir, 3, /*keep=*/5);
  save_at(dir, 4, /*keep=*/5);
  write_text(root.file("precious.h5"), "keep me");
  fs::create_symlink(root.file("precious.h5"), dir + "/ckpt-9.h5");
  write_text(dir + "/notes.txt", "mine");
  EXPECT_EQ(checkpoint_files(dir),
            (std::vector<std::string>{dir + "/ckpt-4.h5", dir + "/ckpt-3.h5"}));
  remove_checkpoints(dir);
  EXPECT_TRUE(checkpoint_files(dir).empty());
  EXPECT_FALSE(fs::exists(dir + "/latest"));
  EXPECT_FALSE(fs::exists(dir + "/ckpt-3.h5"));
  EXPECT_FALSE(fs::exists(fs::symlink_status(dir + "/ckpt-9.h5")));  // the link, not its target
  EXPECT_EQ(read_text(root.file("precious.h5")), "keep me");
  EXPECT_TRUE(fs::exists(dir + "/notes.txt"));
  remove_checkpoints(root.file("missing"));  // nothing to do
  EXPECT_TRUE(checkpoint_files(root.file("missing")).empty());
}

TEST(CheckpointPaths, FilesAndDirectoriesFollowTheUmask) {
  for (const mode_t mask : {mode_t{027}, mode_t{002}}) {
    TempDir root("ckpt-umask");
    const mode_t saved = ::umask(mask);
    const std::string dir = root.file("a/b");
    const std::string path = save_at(dir, 1);
    const std::string exported = root.file("weights.h5");
    write_hdf5_atomically(exported, "test file", [](hid_t) {});
    ::umask(saved);
    SCOPED_TRACE("umask " + std::to_string(mask));
    EXPECT_EQ(mode_of(root.file("a")), 0777u & ~mask);
    EXPECT_EQ(mode_of(dir), 0777u & ~mask);
    EXPECT_EQ(mode_of(path), 0666u & ~mask);
    EXPECT_EQ(mode_of(dir + "/latest"), 0666u & ~mask);
    EXPECT_EQ(mode_of(exported), 0666u & ~mask);
  }
}

}  // namespace
}  // namespace mpt::ckpt
