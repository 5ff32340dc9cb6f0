// roformer plot: curves read from metrics.jsonl (tokens from the stage
// records, repeated steps of a resumed run, a torn last line), the SVG gnuplot
// draws, and an earlier plot left intact when drawing fails.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "tests/test_support.h"
#include "train/plot.h"

namespace roformer {
namespace {

namespace fs = std::filesystem;
using testing::error_of;

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

class Plot : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("roformer_plot_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A run of two stages: 10 steps of 32 x 128 tokens, then 64 x 64 (also 4096).
  fs::path make_run(const std::string& name, double loss0, const std::string& tail = "") {
    const fs::path run = dir_ / name;
    fs::create_directories(run);
    std::ofstream m(run / "metrics.jsonl");
    m << R"({"type":"stage","stage":1,"global_step":0,"max_seq_len":128,"batch_size":32,"steps":10})"
      << "\n";
    for (int step = 5; step <= 20; step += 5) {
      if (step == 15)
        m << R"({"type":"stage","stage":2,"global_step":10,"max_seq_len":64,"batch_size":64,"steps":10})"
          << "\n";
      m << R"({"type":"train","global_step":)" << step << R"(,"loss":)" << loss0 - step * 0.1
        << R"(,"mlm_accuracy":)" << step * 0.01 << R"(,"lr":)" << step * 1e-4 << "}\n";
    }
    // A resumed run logs step 20 again: the last record wins.
    m << R"({"type":"train","global_step":20,"loss":1.5,"mlm_accuracy":0.3,"lr":0.002})"
      << "\n";
    m << R"({"type":"validation","global_step":20,"max_seq_len":64,"loss":2.5,"mlm_accuracy":0.25})"
      << "\n"
      << tail;
    return run;
  }

  fs::path dir_;
};

TEST_F(Plot, ReadsTokensStagesAndTheLastRecordOfAStep) {
  const RunCurves c = read_run_curves(make_run("a", 10.0, R"({"type":"train","glob)"));
  EXPECT_EQ(c.name, "a");
  ASSERT_TRUE(c.x_is_tokens);
  ASSERT_EQ(c.train_loss.size(), 4u);
  EXPECT_DOUBLE_EQ(c.train_loss[0].x, 5 * 4096.0);
  EXPECT_DOUBLE_EQ(c.train_loss[2].x, 10 * 4096.0 + 5 * 4096.0);
  EXPECT_DOUBLE_EQ(c.train_loss[3].y, 1.5);  // the resumed run's record
  EXPECT_DOUBLE_EQ(c.train_accuracy[3].y, 0.3);
  ASSERT_EQ(c.stage_starts.size(), 1u);
  EXPECT_DOUBLE_EQ(c.stage_starts[0], 10 * 4096.0);
  ASSERT_EQ(c.validation_loss.size(), 1u);
  EXPECT_DOUBLE_EQ(c.validation_accuracy[0].y, 0.25);
}

TEST_F(Plot, CountsTokensThroughABatchWarmup) {
  // Batch 2 for 3 steps, 4 for 2, then 8 (length 32): step 4 has seen
  // 3 x 64 + 1 x 128 tokens, step 7 3 x 64 + 2 x 128 + 2 x 256.
  const fs::path run = dir_ / "warm";
  fs::create_directories(run);
  std::ofstream m(run / "metrics.jsonl");
  m << R"({"type":"stage","stage":1,"global_step":0,"max_seq_len":32,"batch_size":8,"steps":9,)"
    << R"("batch_warmup":[[3,2],[5,4]]})"
    << "\n";
  m << R"({"type":"train","global_step":4,"loss":3.0,"lr":0.001})"
    << "\n";
  m << R"({"type":"train","global_step":7,"loss":2.0,"lr":0.001})"
    << "\n";
  m.close();
  const RunCurves c = read_run_curves(run);
  ASSERT_EQ(c.train_loss.size(), 2u);
  EXPECT_DOUBLE_EQ(c.train_loss[0].x, 3 * 64.0 + 128.0);
  EXPECT_DOUBLE_EQ(c.train_loss[1].x, 3 * 64.0 + 2 * 128.0 + 2 * 256.0);
}

TEST_F(Plot, DamageIsNamedWithFileAndLine) {
  const fs::path run = make_run("b", 9.0);
  {
    std::ofstream m(run / "metrics.jsonl", std::ios::app);
    m << "not json\n"
      << R"({"type":"train","global_step":30,"loss":1})"
      << "\n";
  }
  const std::string msg = error_of<InputError>([&] { read_run_curves(run); });
  EXPECT_NE(msg.find((run / "metrics.jsonl").string() + ":9"), std::string::npos) << msg;
  EXPECT_NE(error_of<InputError>([&] { read_run_curves(dir_ / "missing"); }).find("not a run"),
            std::string::npos);
}

TEST_F(Plot, TwoRunsMakeAReadableSvg) {
  const fs::path out = dir_ / "curves.svg";
  plot_runs({make_run("first", 10.0), make_run("second", 11.0)}, out);
  const std::string svg = slurp(out);
  ASSERT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  for (const char* text : {"first train", "second validation", "tokens seen (millions)",
                           "MLM loss (nats)", "MLM accuracy (%)", "learning rate"})
    EXPECT_NE(svg.find(text), std::string::npos) << text;
  // No temporary file is left beside the plot.
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
}

TEST_F(Plot, AFailedPlotLeavesTheEarlierOneIntact) {
  const fs::path run = make_run("c", 10.0);
  const fs::path out = dir_ / "curves.png";
  plot_runs({run}, out);
  const std::string before = slurp(out);
  ASSERT_EQ(before.substr(1, 3), "PNG");
  const char* path = std::getenv("PATH");
  const std::string saved = path ? path : "";
  ::setenv("PATH", "/nonexistent", 1);
  const std::string msg = error_of<InputError>([&] { plot_runs({run}, out); });
  ::setenv("PATH", saved.c_str(), 1);
  EXPECT_NE(msg.find("gnuplot was not found"), std::string::npos) << msg;
  EXPECT_EQ(slurp(out), before);
  EXPECT_NE(error_of<InputError>([&] { plot_runs({run}, dir_ / "x.pdf"); }).find(".svg or .png"),
            std::string::npos);
}

}  // namespace
}  // namespace roformer
