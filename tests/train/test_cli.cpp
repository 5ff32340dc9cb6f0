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

// roformer tokenize with RoFormer's Chinese tokenizer: one line of ids per
// line (empty for an empty line), the whole jieba word when the vocab has it,
// and invalid UTF-8 on stdin named by its line.
TEST_F(Cli, TokenizeWithJieba) {
  const std::string fixtures = ROFORMER_FIXTURES_DIR;
  {
    std::ofstream v(dir_ / "vocab.txt");
    v << "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n床\n前\n明月\n光\n，\n疑\n是\n地\n上\n霜\n。\nab\n";
    std::ofstream in(dir_ / "in.txt");
    in << "床前明月光，疑是地上霜。\n\n床前[MASK]AB\n";
    std::ofstream bad(dir_ / "bad.txt");
    bad << "明月\n\xe6\x98\n";
  }
  const std::string common = "tokenize --vocab '" + (dir_ / "vocab.txt").string() +
                             "' --jieba-dict '" + fixtures + "/zh/jieba_dict.txt' ";
  Result r = run(common + "--pre-tokenizer jieba < '" + (dir_ / "in.txt").string() + "'");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "5 6 7 8 9 10 11 12 13 14 15\n\n5 6 4 16\n");
  r = run(common + "--pre-tokenizer jieba --no-lowercase < '" + (dir_ / "in.txt").string() + "'");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out.substr(r.out.rfind("5 6 4")), "5 6 4 1\n");  // AB is not ab
  r = run(common + "< '" + (dir_ / "in.txt").string() + "'");  // BERT's: characters
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out.substr(0, r.out.find('\n')), "5 6 1 1 8 9 10 11 12 13 14 15");
  r = run(common + "--pre-tokenizer jieba < '" + (dir_ / "bad.txt").string() + "'");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("line 2"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace roformer
