// The `roformer` executable end to end: exit codes (0 ok, 2 bad input),
// error prefix, --help/--version, `config`, and --print-config.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "train/config.h"

namespace roformer {
namespace {

namespace fs = std::filesystem;

const std::string kTiny = std::string(ROFORMER_SOURCE_DIR) + "/configs/tiny.yaml";

struct Result {
  int rc = -1;
  std::string out;
  std::string err;
};

std::string slurp(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("roformer_cli_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs `roformer <args>` through the shell; args are passed verbatim.
  Result run(const std::string& args) const {
    const std::string command = std::string("'") + ROFORMER_CLI + "' " + args + " >'" +
                                (dir_ / "out").string() + "' 2>'" + (dir_ / "err").string() + "'";
    const int status = std::system(command.c_str());
    Result r;
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(dir_ / "out");
    r.err = slurp(dir_ / "err");
    return r;
  }

  fs::path dir_;
};

TEST_F(Cli, ConfigPrintsTheResolvedConfig) {
  const Result r = run("config --config '" + kTiny + "'");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(parse_config_string(r.out, "stdout"), load_config(kTiny));
}

TEST_F(Cli, PrintConfigAppliesOverrides) {
  const Result r =
      run("config --config '" + kTiny + "' --print-config optim.lr=5e-4 stages.0.steps=3");
  ASSERT_EQ(r.rc, 0) << r.err;
  const Config c = parse_config_string(r.out, "stdout");
  EXPECT_DOUBLE_EQ(c.optim.lr, 5e-4);
  EXPECT_EQ(c.stages[0].steps, 3);
  EXPECT_EQ(c, load_config(kTiny, {"optim.lr=5e-4", "stages.0.steps=3"}));
}

TEST_F(Cli, ConfigWritesToAFile) {
  const fs::path out = dir_ / "resolved.yaml";
  const Result r = run("config --config '" + kTiny + "' -o '" + out.string() + "'");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(r.out.empty());
  EXPECT_EQ(load_config(out), load_config(kTiny));
}

TEST_F(Cli, BadOverrideIsAnInputError) {
  const Result r = run("config --config '" + kTiny + "' optim.lr=abc");
  EXPECT_EQ(r.rc, 2);
  EXPECT_EQ(r.err,
            "roformer: error: command-line override 'optim.lr=abc': optim.lr: expected a positive "
            "number, got \"abc\"\n");
  EXPECT_TRUE(r.out.empty());
}

TEST_F(Cli, BadConfigFileNamesFileLineAndKey) {
  std::ofstream(dir_ / "bad.yaml") << "optim:\n  warmup_steps: ten\n";
  const Result r = run("config --config '" + (dir_ / "bad.yaml").string() + "'");
  EXPECT_EQ(r.rc, 2);
  EXPECT_EQ(r.err, "roformer: error: " + (dir_ / "bad.yaml").string() +
                       ":2:17: optim.warmup_steps: expected a non-negative integer, got \"ten\"\n");
}

TEST_F(Cli, MissingConfigFile) {
  const Result r = run("config --config /nonexistent.yaml");
  EXPECT_EQ(r.rc, 2);
  EXPECT_EQ(r.err.rfind("roformer: error: cannot read config file '/nonexistent.yaml'", 0), 0u)
      << r.err;
}

TEST_F(Cli, RequireForCommand) {
  std::ofstream(dir_ / "novocab.yaml") << "stages: [{max_seq_len: 16, batch_size: 2, steps: 1}]\n";
  const Result r = run("config --for pretrain --config '" + (dir_ / "novocab.yaml").string() + "'");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("data.vocab: required by 'pretrain' but not set"), std::string::npos)
      << r.err;
  EXPECT_EQ(run("config --for pretrain --config '" + kTiny + "'").rc, 0);
}

TEST_F(Cli, CommandLineMistakesExitWithTwo) {
  Result r = run("");
  EXPECT_EQ(r.rc, 2);
  EXPECT_EQ(r.err.rfind("roformer: error: ", 0), 0u) << r.err;
  r = run("no-such-command");
  EXPECT_EQ(r.rc, 2);
  r = run("config");  // --config is required
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("--config"), std::string::npos) << r.err;
  r = run("config --config '" + kTiny + "' --no-such-option");
  EXPECT_EQ(r.rc, 2);
}

TEST_F(Cli, HelpAndVersion) {
  Result r = run("--help");
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("config"), std::string::npos) << r.out;
  r = run("config --help");
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("--print-config"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("KEY=VALUE"), std::string::npos) << r.out;
  r = run("--version");
  EXPECT_EQ(r.rc, 0);
  EXPECT_EQ(r.out.rfind("roformer ", 0), 0u) << r.out;
}

TEST_F(Cli, LogLevelIsAGlobalOption) {
  const Result r = run("config --config '" + kTiny + "' --log-level warn");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(r.err.empty()) << r.err;  // the info summary is silenced
}

}  // namespace
}  // namespace roformer
