// run.gemm_algorithms in a run directory (train/run_gemm_algorithms.h): the
// timed choice loads this rank's table before the first product and saves it
// when it grew; the heuristic leaves table and files alone. Device-neutral:
// the entries here stand for what a GPU's timing adds (gpu_check's
// gemm_timed step runs the real thing).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/gemm_table/gemm_table.h"
#include "tests/test_support.h"
#include "train/run_gemm_algorithms.h"

namespace roformer {
namespace {

namespace fs = std::filesystem;

class RunGemmAlgorithmsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("rf_gemm_algorithms_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    clear_gemm_table();
  }
  void TearDown() override {
    fs::remove_all(dir_);
    clear_gemm_table();
    set_gemm_algorithm_choice(GemmAlgorithmChoice::kHeuristic);
  }
  static Config timed() {
    Config c;
    c.run.gemm_algorithms = GemmAlgorithmChoice::kTimed;
    return c;
  }
  static std::string read(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }
  static GemmProblem problem(int64_t m) {
    GemmProblem p;
    p.m = m;
    p.n = p.k = p.lda = p.ldb = p.ldc = 64;
    return p;
  }
  fs::path dir_;
};

TEST_F(RunGemmAlgorithmsTest, TheHeuristicLeavesTheTableAndTheFilesAlone) {
  add_gemm_algorithm("G", problem(64), {});
  {
    RunGemmAlgorithms run(Config{}, dir_, 0);
    EXPECT_EQ(gemm_algorithm_choice(), GemmAlgorithmChoice::kHeuristic);
    add_gemm_algorithm("G", problem(128), {});
    run.save_if_changed();
  }
  EXPECT_EQ(gemm_table_size(), 2u);
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(RunGemmAlgorithmsTest, TimedSavesThisRanksTableWhenItGrewAndLoadsItInTheNextRun) {
  const fs::path file = dir_ / "gemm_algorithms.rank2.json";
  EXPECT_EQ(RunGemmAlgorithms::file_name(2), "gemm_algorithms.rank2.json");
  add_gemm_algorithm("G", problem(16), {});  // another run's, in this process
  {
    RunGemmAlgorithms run(timed(), dir_, 2);
    EXPECT_EQ(gemm_algorithm_choice(), GemmAlgorithmChoice::kTimed);
    EXPECT_EQ(gemm_table_size(), 0u);  // a run starts from its own table only
    run.save_if_changed();
    EXPECT_FALSE(fs::exists(file));  // nothing timed yet: nothing written
    add_gemm_algorithm("G", problem(64), {});
    run.save_if_changed();
    ASSERT_TRUE(fs::exists(file));
    EXPECT_EQ(read(file), gemm_table_json());
    add_gemm_algorithm("G", problem(128), {});
    run.save_if_changed();
    EXPECT_EQ(read(file), gemm_table_json());
  }
  EXPECT_EQ(gemm_algorithm_choice(), GemmAlgorithmChoice::kHeuristic);
  const std::string saved = read(file);

  // The next run (a resume) starts from the file, and writes it only once it grows.
  add_gemm_algorithm("G", problem(16), {});
  RunGemmAlgorithms resumed(timed(), dir_, 2);
  EXPECT_EQ(gemm_table_size(), 2u);
  EXPECT_TRUE(find_gemm_algorithm("G", problem(64)));
  EXPECT_FALSE(find_gemm_algorithm("G", problem(16)));
  fs::last_write_time(file, fs::file_time_type{});
  resumed.save_if_changed();
  EXPECT_EQ(fs::last_write_time(file), fs::file_time_type{});
  EXPECT_EQ(read(file), saved);
}

TEST_F(RunGemmAlgorithmsTest, AnUnreadableTableStopsTheRunNamingItAndStaysAsItWas) {
  const fs::path file = dir_ / "gemm_algorithms.rank0.json";
  std::ofstream(file) << "{\"format\": \"roformer gemm algorithms\", \"version\": 1, \"gpus\": [";
  const std::string before = read(file);
  const std::string e =
      testing::error_of<InputError>([&] { RunGemmAlgorithms run(timed(), dir_, 0); });
  EXPECT_EQ(e.rfind(file.string() + ": not JSON: ", 0), 0u) << e;
  EXPECT_EQ(read(file), before);
  EXPECT_EQ(gemm_algorithm_choice(), GemmAlgorithmChoice::kHeuristic);
}

}  // namespace
}  // namespace roformer
