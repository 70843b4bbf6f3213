// Configuration parsing: INI and command line share names, the command line wins, and every
// mistake is a UserError that names the option or file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "app/cli.hpp"
#include "core/error.hpp"

namespace mpt::app {
namespace {

// This process's directory of INI files, removed when the tests end.
const std::filesystem::path& ini_dir() {
  static const struct Dir {
    std::filesystem::path path =
        std::filesystem::temp_directory_path() / ("mpt-cli-" + std::to_string(getpid()));
    ~Dir() {
      std::error_code error;
      std::filesystem::remove_all(path, error);
    }
  } dir;
  return dir.path;
}

std::string write_ini(const std::string& name, const std::string& text) {
  const auto& dir = ini_dir();
  std::filesystem::create_directories(dir);
  const auto path = (dir / name).string();
  std::ofstream(path) << text;
  return path;
}

// Runs F and returns the UserError's one-line text; fails the test if none is thrown.
template <class F>
std::string user_error_of(F&& f) {
  try {
    f();
  } catch (const UserError& error) {
    return format_user_error(error);
  }
  ADD_FAILURE() << "expected a UserError";
  return "";
}

TEST(Cli, DefaultsAreSensible) {
  const auto parsed = parse_train_command("train", {"--data.train=x.h5"});
  EXPECT_FALSE(parsed.help);
  EXPECT_EQ(parsed.run.data.train_path, "x.h5");
  EXPECT_EQ(parsed.run.model.name, "mlp");
  EXPECT_EQ(parsed.run.loop.batch_size, 64);
  EXPECT_DOUBLE_EQ(parsed.run.optimizer.lr, 0.05);
  EXPECT_EQ(parsed.runtime.device, "auto");
}

TEST(Cli, IniSectionsMapToDottedNamesAndCommandLineWins) {
  const auto ini = write_ini("a.ini",
                             "[data]\ntrain = t.h5\ntest = v.h5\n"
                             "[model]\nlayers = dense:32,relu,dense:10\n"
                             "[train]\nepochs = 3\nbatch-size = 16\nseed = 7\n"
                             "[optimizer]\nlr = 0.2\nmomentum = 0.5\nweight-decay = 0.001\n"
                             "[output]\ndir = out\n[checkpoint]\ndir = ck\n");
  const auto parsed = parse_train_command("train", {"--config", ini, "--optimizer.lr=0.01", "--train.epochs=5"});
  EXPECT_EQ(parsed.run.data.train_path, "t.h5");
  EXPECT_EQ(parsed.run.data.test_path, "v.h5");
  EXPECT_EQ(parsed.run.model.layers, "dense:32,relu,dense:10");
  EXPECT_EQ(parsed.run.loop.epochs, 5);  // command line wins
  EXPECT_EQ(parsed.run.loop.batch_size, 16);
  EXPECT_EQ(parsed.run.loop.seed, 7u);
  EXPECT_DOUBLE_EQ(parsed.run.optimizer.lr, 0.01);  // command line wins
  EXPECT_DOUBLE_EQ(parsed.run.optimizer.momentum, 0.5);
  EXPECT_DOUBLE_EQ(parsed.run.optimizer.weight_decay, 0.001);
  EXPECT_EQ(parsed.run.output_dir, "out");
  EXPECT_EQ(parsed.run.checkpoint.dir, "ck");
}

TEST(Cli, UnknownCommandLineOptionIsNamed) {
  const auto line = user_error_of([] { parse_train_command("train", {"--optimizer.lrr=0.1"}); });
  EXPECT_NE(line.find("unknown option '--optimizer.lrr'"), std::string::npos) << line;
  EXPECT_NE(line.find("hint:"), std::string::npos) << line;
  EXPECT_NE(line.find("rank 0 on "), std::string::npos) << line;
}

TEST(Cli, SectionGivenAsAnOptionPointsAtItsName) {
  // `--model=cnn` matches every --model.* option; the hint names the one meant.
  auto line = user_error_of([] { parse_train_command("train", {"--model=cnn"}); });
  EXPECT_NE(line.find("'--model=cnn' is ambiguous"), std::string::npos) << line;
  EXPECT_NE(line.find("hint: did you mean --model.name=cnn?"), std::string::npos) << line;
  // A section without a name key gets the plain hint.
  line = user_error_of([] { parse_train_command("train", {"--data=x"}); });
  EXPECT_NE(line.find("'--data=x' is ambiguous"), std::string::npos) << line;
  EXPECT_EQ(line.find("did you mean"), std::string::npos) << line;
  EXPECT_NE(line.find("--help` lists every option"), std::string::npos) << line;
}

TEST(Cli, UnknownIniOptionNamesKeyAndFile) {
  const auto ini = write_ini("b.ini", "[train]\nepocs = 3\n");
  const auto line = user_error_of([&] { parse_train_command("train", {"--config=" + ini}); });
  EXPECT_NE(line.find("train.epocs"), std::string::npos) << line;
  EXPECT_NE(line.find(ini), std::string::npos) << line;
}

TEST(Cli, MissingConfigFileIsNamed) {
  const auto line = user_error_of([] { parse_train_command("train", {"--config=/nonexistent/x.ini"}); });
  EXPECT_NE(line.find("config file '/nonexistent/x.ini' not found"), std::string::npos) << line;
}

TEST(Cli, BadValueNamesOption) {
  const auto line = user_error_of([] { parse_train_command("train", {"--train.epochs=two"}); });
  EXPECT_NE(line.find("train.epochs"), std::string::npos) << line;
}

TEST(Cli, PositionalArgumentIsRejected) {
  const auto line = user_error_of([] { parse_train_command("train", {"config.ini"}); });
  EXPECT_NE(line.find("unexpected argument"), std::string::npos) << line;
}

TEST(Cli, DeviceAndMatmulAreValidated) {
  EXPECT_NE(user_error_of([] { parse_train_command("train", {"--device=tpu"}); }).find("--device"),
            std::string::npos);
  // train resolves cuda in its agreed setup (every rank alike, tests/app/device.sh); eval stays
  // on the host.
  EXPECT_EQ(parse_train_command("train", {"--device=cuda"}).run.device, "cuda");
  EXPECT_EQ(parse_train_command("train", {}).run.device, "auto");
  EXPECT_NE(user_error_of([] { parse_train_command("eval", {"--device=cuda"}); }).find("--device"),
            std::string::npos);
  EXPECT_NE(user_error_of([] { parse_train_command("train", {"--kernels.matmul=mkl"}); })
                .find("--kernels.matmul"),
            std::string::npos);
}

TEST(Cli, HelpListsEveryOptionWithDefaults) {
  const auto parsed = parse_train_command("train", {"--help"});
  ASSERT_TRUE(parsed.help);
  for (const char* name : {"--data.train", "--model.layers", "--train.batch-size", "--optimizer.lr",
                           "--output.dir", "--checkpoint.dir", "--device", "--config",
                           "--optimizer.beta1", "--optimizer.clip-norm", "--optimizer.lr-scaling",
                           "--optimizer.decay-biases", "--schedule.name", "--schedule.warmup-steps",
                           "--schedule.min-lr", "--schedule.pct-start"})
    EXPECT_NE(parsed.help_text.find(name), std::string::npos) << name;
  EXPECT_NE(parsed.help_text.find("(=0.05)"), std::string::npos);
}

TEST(Cli, OptimizerAndScheduleSectionsInTheConfigFile) {
  const auto ini = write_ini("o.ini",
                             "[optimizer]\nname = adamw\nbeta2 = 0.95\nclip-norm = 1\n"
                             "lr-scaling = linear\n[schedule]\nname = cosine\nwarmup-steps = 100\n");
  const auto parsed = parse_train_command("train", {"--config", ini, "--schedule.min-lr=1e-5"});
  EXPECT_EQ(parsed.run.optimizer.name, "adamw");
  EXPECT_DOUBLE_EQ(parsed.run.optimizer.beta2, 0.95);
  EXPECT_DOUBLE_EQ(parsed.run.optimizer.clip_norm, 1.0);
  EXPECT_EQ(parsed.run.optimizer.lr_scaling, "linear");
  EXPECT_EQ(parsed.run.optimizer.reference_batch, 256);
  EXPECT_FALSE(parsed.run.optimizer.decay_biases);
  EXPECT_EQ(parsed.run.schedule.name, "cosine");
  EXPECT_EQ(parsed.run.schedule.warmup_steps, 100);
  EXPECT_DOUBLE_EQ(parsed.run.schedule.min_lr, 1e-5);
}

TEST(Cli, EvalTakesCheckpointDirFromConfig) {
  const auto ini = write_ini("c.ini", "[data]\ntest = v.h5\n[checkpoint]\ndir = ck\n");
  const auto parsed = parse_train_command("eval", {"--config", ini});
  EXPECT_EQ(parsed.checkpoint, "ck");
  EXPECT_EQ(parse_train_command("eval", {"--config", ini, "--checkpoint=x.h5"}).checkpoint, "x.h5");
}

TEST(Cli, PrepareParsesKindAndShape) {
  const auto parsed = parse_prepare_command({"synthetic", "--out", "d", "--shape", "3,32,32", "--classes", "4"});
  EXPECT_EQ(parsed.kind, "synthetic");
  EXPECT_EQ(parsed.shape, (std::vector<std::int64_t>{3, 32, 32}));
  EXPECT_EQ(parsed.classes, 4);
  const auto line = user_error_of([] { parse_prepare_command({"cifar", "--out", "d"}); });
  EXPECT_NE(line.find("unknown dataset 'cifar'"), std::string::npos) << line;
  EXPECT_NE(user_error_of([] { parse_prepare_command({"synthetic", "--out", "d", "--shape", "1,x"}); })
                .find("--shape"),
            std::string::npos);
  EXPECT_NE(user_error_of([] { parse_prepare_command({"fashion-mnist"}); }).find("--out"), std::string::npos);
}

}  // namespace
}  // namespace mpt::app
