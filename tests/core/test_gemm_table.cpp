// The table of GEMM algorithms chosen by timing (core/gemm_table/gemm_table.h):
// its JSON round trip, the errors a bad file gets, and the size buckets.
// Device-neutral: these run on any machine; tests/cuda/test_gemm_timed.cpp
// fills the table on a GPU.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/gemm_table/gemm_table.h"
#include "tests/test_support.h"

namespace roformer {
namespace {

namespace fs = std::filesystem;
using testing::error_of;

// Starts and ends each test with an empty table and the heuristic choice.
class GemmTable : public ::testing::Test {
 protected:
  void SetUp() override { clear_gemm_table(); }
  void TearDown() override {
    clear_gemm_table();
    set_gemm_algorithm_choice(GemmAlgorithmChoice::kHeuristic);
  }
};

GemmProblem some_problem(int64_t m) {
  GemmProblem p;
  p.m = m;
  p.n = 3072;
  p.k = 768;
  p.lda = 768;
  p.ldb = 768;
  p.ldc = 3072;
  p.trans_b = true;
  p.epilogue = "gelu_aux";
  p.input_dtype = "bf16";
  p.output_dtype = "bf16";
  p.bias_dtype = "bf16";
  p.align_aux = 128;
  return p;
}

GemmAlgorithm some_algorithm(uint64_t seed) {
  GemmAlgorithm a;
  for (size_t i = 0; i < a.data.size(); ++i) a.data[i] = seed * 0x9E3779B97F4A7C15ull + i;
  a.ms = 0.25;
  a.heuristic_ms = 0.3;
  return a;
}

// The one entry of a valid table, to be spoiled one field at a time.
nlohmann::json one_entry_table() {
  add_gemm_algorithm("GPU A", some_problem(8192), some_algorithm(1));
  nlohmann::json j = nlohmann::json::parse(gemm_table_json());
  clear_gemm_table();
  return j;
}

std::string load_error(const nlohmann::json& j) {
  return error_of<InputError>([&] { load_gemm_table_json(j.dump(), "t.json"); });
}

TEST_F(GemmTable, RoundTripsThroughJsonWithEveryGpusEntries) {
  add_gemm_algorithm("NVIDIA H200 (132 SMs), cuBLASLt 130100", some_problem(65536),
                     some_algorithm(1));
  add_gemm_algorithm("NVIDIA H200 (132 SMs), cuBLASLt 130100", some_problem(8192),
                     some_algorithm(2));
  GemmAlgorithm untimed = some_algorithm(3);
  untimed.timed = false;
  untimed.ms = untimed.heuristic_ms = 0;
  add_gemm_algorithm("NVIDIA H100 80GB HBM3 (132 SMs), cuBLASLt 130100", some_problem(65536),
                     untimed);
  const std::string text = gemm_table_json();
  clear_gemm_table();
  EXPECT_EQ(gemm_table_size(), 0u);
  load_gemm_table_json(text, "t.json");
  EXPECT_EQ(gemm_table_size(), 3u);
  EXPECT_EQ(gemm_table_json(), text);  // the same table, the same text
  const auto h200 =
      find_gemm_algorithm("NVIDIA H200 (132 SMs), cuBLASLt 130100", some_problem(8192));
  ASSERT_TRUE(h200);
  EXPECT_EQ(h200->data, some_algorithm(2).data);
  EXPECT_TRUE(h200->timed);
  EXPECT_DOUBLE_EQ(h200->ms, 0.25);
  const auto h100 =
      find_gemm_algorithm("NVIDIA H100 80GB HBM3 (132 SMs), cuBLASLt 130100", some_problem(65536));
  ASSERT_TRUE(h100);
  EXPECT_FALSE(h100->timed);
  EXPECT_EQ(h100->data, some_algorithm(3).data);
  // Another GPU, or another problem, finds nothing.
  EXPECT_FALSE(find_gemm_algorithm("NVIDIA A100", some_problem(65536)));
  GemmProblem other = some_problem(8192);
  other.align_aux = 64;
  EXPECT_FALSE(find_gemm_algorithm("NVIDIA H200 (132 SMs), cuBLASLt 130100", other));
}

TEST_F(GemmTable, EveryAdditionLoadAndClearMovesTheGeneration) {
  const uint64_t g0 = gemm_table_generation();
  add_gemm_algorithm("G", some_problem(16), some_algorithm(1));
  const uint64_t g1 = gemm_table_generation();
  EXPECT_GT(g1, g0);
  const std::string text = gemm_table_json();
  load_gemm_table_json(text, "t.json");
  const uint64_t g2 = gemm_table_generation();
  EXPECT_GT(g2, g1);
  clear_gemm_table();
  EXPECT_GT(gemm_table_generation(), g2);
}

TEST_F(GemmTable, AnAdditionKeepsTheFirstChoiceAndALoadReplacesIt) {
  add_gemm_algorithm("G", some_problem(1024), some_algorithm(1));
  const std::string first = gemm_table_json();
  // A second timing of the same problem (another device of the kind) keeps the first.
  const uint64_t resets = gemm_table_resets(), generation = gemm_table_generation();
  EXPECT_EQ(add_gemm_algorithm("G", some_problem(1024), some_algorithm(2)).data,
            some_algorithm(1).data);
  EXPECT_EQ(gemm_table_generation(), generation);
  EXPECT_EQ(find_gemm_algorithm("G", some_problem(1024))->data, some_algorithm(1).data);
  add_gemm_algorithm("G", some_problem(2048), some_algorithm(3));
  EXPECT_EQ(gemm_table_resets(), resets);  // additions change no entry
  // A load replaces the problem's entry (and counts as a reset), keeps the others.
  clear_gemm_table();
  add_gemm_algorithm("G", some_problem(1024), some_algorithm(2));
  add_gemm_algorithm("G", some_problem(2048), some_algorithm(3));
  const uint64_t before_load = gemm_table_resets();
  load_gemm_table_json(first, "t.json");
  EXPECT_GT(gemm_table_resets(), before_load);
  EXPECT_EQ(gemm_table_size(), 2u);
  EXPECT_EQ(find_gemm_algorithm("G", some_problem(1024))->data, some_algorithm(1).data);
  EXPECT_EQ(find_gemm_algorithm("G", some_problem(2048))->data, some_algorithm(3).data);
}

TEST_F(GemmTable, BadTablesNameTheSourceAndTheFieldAndLeaveTheTableAsItWas) {
  const nlohmann::json good = one_entry_table();
  add_gemm_algorithm("kept", some_problem(64), some_algorithm(9));
  const std::string before = gemm_table_json();

  EXPECT_EQ(error_of<InputError>([] {
              load_gemm_table_json("{\"format\": ", "t.json");
            }).rfind("t.json: not JSON: ", 0),
            0u);
  auto spoiled = [&](const std::function<void(nlohmann::json&)>& spoil) {
    nlohmann::json j = good;
    spoil(j);
    return load_error(j);
  };
  EXPECT_EQ(spoiled([](auto& j) { j["format"] = "safetensors"; }),
            "t.json: format: expected \"roformer gemm algorithms\"");
  EXPECT_EQ(spoiled([](auto& j) { j["version"] = 2; }),
            "t.json: version: version 2 is not one this build reads (1)");
  EXPECT_EQ(spoiled([](auto& j) { j.erase("gpus"); }), "t.json: missing \"gpus\"");
  EXPECT_EQ(spoiled([](auto& j) { j["gpus"][0]["algorithms"][0]["problem"].erase("k"); }),
            "t.json: gpus[0].algorithms[0].problem: missing \"k\"");
  EXPECT_EQ(spoiled([](auto& j) { j["gpus"][0]["algorithms"][0]["problem"]["m"] = 0; }),
            "t.json: gpus[0].algorithms[0].problem.m: expected an integer >= 1, got 0");
  EXPECT_EQ(spoiled([](auto& j) { j["gpus"][0]["algorithms"][0]["problem"]["m"] = "8192"; }),
            "t.json: gpus[0].algorithms[0].problem.m: expected an integer");
  EXPECT_EQ(spoiled([](auto& j) { j["gpus"][0]["algorithms"][0]["problem"]["epilogue"] = "relu"; }),
            "t.json: gpus[0].algorithms[0].problem.epilogue: expected one of \"none\", \"bias\", "
            "\"gelu_aux\", \"dgelu_bias_grad\", \"row_sums_of_a\", got \"relu\"");
  EXPECT_EQ(spoiled([](auto& j) { j["gpus"][0]["algorithms"][0]["problem"]["align_a"] = 48; }),
            "t.json: gpus[0].algorithms[0].problem.align_a: expected a power of two up to 256, "
            "got 48");
  EXPECT_EQ(spoiled([](auto& j) { j["gpus"][0]["algorithms"][0]["algorithm"] = "00ff"; }),
            "t.json: gpus[0].algorithms[0].algorithm: expected 128 lower-case hex digits "
            "(cuBLASLt's 64-byte algorithm), got 4 characters");
  EXPECT_EQ(spoiled([](auto& j) { j["gpus"][0]["algorithms"][0]["timed"] = 1; }),
            "t.json: gpus[0].algorithms[0].timed: expected true or false");
  EXPECT_EQ(spoiled([](auto& j) { j["gpus"][0]["algorithms"][0]["ms"] = -1; }),
            "t.json: gpus[0].algorithms[0].ms: expected a number >= 0");
  // A second entry spoiled: the first, good one is not added either.
  EXPECT_EQ(spoiled([](auto& j) {
              j["gpus"][0]["algorithms"].push_back(j["gpus"][0]["algorithms"][0]);
              j["gpus"][0]["algorithms"][1]["problem"]["trans_a"] = "no";
            }),
            "t.json: gpus[0].algorithms[1].problem.trans_a: expected true or false");
  EXPECT_EQ(gemm_table_json(), before);
}

TEST_F(GemmTable, FilesAreWrittenWholeAndAMissingOneIsNamed) {
  const fs::path dir =
      fs::temp_directory_path() / ("roformer_gemm_table_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path path = dir / "gemm_algorithms.rank0.json";
  add_gemm_algorithm("G", some_problem(4096), some_algorithm(4));
  const std::string text = gemm_table_json();
  save_gemm_table(path);
  std::ifstream in(path);
  std::stringstream saved;
  saved << in.rdbuf();
  EXPECT_EQ(saved.str(), text);
  for (const auto& entry : fs::directory_iterator(dir))  // no temporary file left behind
    EXPECT_EQ(entry.path().filename(), "gemm_algorithms.rank0.json");
  clear_gemm_table();
  load_gemm_table(path);
  EXPECT_EQ(gemm_table_json(), text);
  EXPECT_EQ(error_of<InputError>([&] { load_gemm_table(dir / "none.json"); }),
            "cannot open GEMM algorithm table '" + (dir / "none.json").string() + "'");
  fs::remove_all(dir);
}

TEST_F(GemmTable, SizeBucketsAreExactUpTo16ThenEighthsOfAnOctave) {
  for (int64_t x = 1; x <= 16; ++x) EXPECT_EQ(gemm_size_bucket(x), x);
  EXPECT_EQ(gemm_size_bucket(17), 18);
  EXPECT_EQ(gemm_size_bucket(768), 768);
  EXPECT_EQ(gemm_size_bucket(769), 832);  // steps of 512 / 8 = 64 between 512 and 1024
  EXPECT_EQ(gemm_size_bucket(65536), 65536);
  EXPECT_EQ(gemm_size_bucket(65537), 73728);
  EXPECT_EQ(gemm_size_bucket(73728), 73728);
  // Every bucket holds its values, is at most 1/8 above them, and is its own bucket.
  for (int64_t x = 1; x < 5000; ++x) {
    const int64_t b = gemm_size_bucket(x);
    EXPECT_GE(b, x);
    EXPECT_LE(b - x, std::max<int64_t>(0, x / 8)) << x;
    EXPECT_EQ(gemm_size_bucket(b), b) << x;
  }
}

TEST_F(GemmTable, TheChoiceIsTheHeuristicUntilSet) {
  EXPECT_EQ(gemm_algorithm_choice(), GemmAlgorithmChoice::kHeuristic);
  set_gemm_algorithm_choice(GemmAlgorithmChoice::kTimed);
  EXPECT_EQ(gemm_algorithm_choice(), GemmAlgorithmChoice::kTimed);
}

}  // namespace
}  // namespace roformer
