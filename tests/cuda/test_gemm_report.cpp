// The gemm report's rows (bench/gpu/gemm_report.h) as the peer script reads
// them: bench/gpu/testdata/gemm_report.jsonl, which ctest's bench.gemm_peer
// feeds to bench/gpu/gemm_peer_torch.py, must be what gemm_report_row writes
// for its problems, so neither side can rename or drop a field alone. No GPU
// needed. ROFORMER_WRITE_GEMM_TESTDATA=1 rewrites the file from the rows.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/gpu/gemm_report.h"

namespace roformer {
namespace {

// A pointer `offset` bytes past a 256-byte boundary (the row reads only its alignment).
const void* at(uintptr_t offset) {
  return reinterpret_cast<const void*>(uintptr_t(1) << 20 | offset);
}

cuda::GemmArgs problem(int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b) {
  cuda::GemmArgs g;
  g.m = m, g.n = n, g.k = k;
  g.trans_a = trans_a, g.trans_b = trans_b;
  g.lda = trans_a ? m : k, g.ldb = trans_b ? k : n, g.ldc = n;
  g.a = at(0), g.b = at(0), g.c = const_cast<void*>(at(0));
  g.input_dtype = DType::bf16, g.output_dtype = DType::bf16;
  return g;
}

cuda::GemmCandidate timed(int rank, double ms) {
  cuda::GemmCandidate c;
  c.rank = rank, c.ms = ms, c.workspace = 1024, c.waves = 1.5f;
  return c;
}

// One of each kind the step issues: a bias product, an accumulating one
// into f32, the three epilogues, a strided batch with no algorithm that ran.
nlohmann::json report() {
  const void* bias = at(0);
  nlohmann::json rows = nlohmann::json::array();
  cuda::GemmArgs g = problem(256, 96, 32, false, true);
  g.bias = bias;
  rows.push_back(bench::gemm_report_row(g, 2, {timed(0, 0.01), timed(1, 0.009)}));
  g = problem(96, 32, 256, true, false);
  g.beta = 1.0f, g.output_dtype = DType::f32, g.c = const_cast<void*>(at(64));
  rows.push_back(bench::gemm_report_row(g, 2, {timed(0, 0.01), timed(2, 0.011)}));
  g = problem(256, 128, 32, false, true);
  g.bias = bias, g.epilogue = cuda::GemmEpilogue::kGeluAux;
  rows.push_back(bench::gemm_report_row(g, 1, {timed(0, 0.02)}));
  g = problem(256, 128, 32, false, false);
  g.bias = bias, g.epilogue = cuda::GemmEpilogue::kDGeluBiasGrad;
  rows.push_back(bench::gemm_report_row(g, 1, {timed(0, 0.02), timed(1, 0.015)}));
  g = problem(32, 96, 256, true, false);
  g.bias = bias, g.epilogue = cuda::GemmEpilogue::kRowSumsOfA, g.output_dtype = DType::f32;
  rows.push_back(bench::gemm_report_row(g, 1, {timed(0, 0.02)}));
  g = problem(64, 64, 16, false, true);
  g.batch = 3, g.lda = 48, g.ldb = 48, g.stride_a = 16, g.stride_b = 16, g.stride_c = 64 * 64;
  rows.push_back(bench::gemm_report_row(g, 1, {}));
  return rows;
}

TEST(GemmReport, ThePeersTestDataIsWhatTheRowsSay) {
  const std::string path =
      std::string(ROFORMER_SOURCE_DIR) + "/bench/gpu/testdata/gemm_report.jsonl";
  const nlohmann::json head = {{"setup", "ours bf16"}, {"seq", 64}, {"batch", 4}, {"status", "ok"}};
  nlohmann::json with_report = head;
  with_report["gemm_report"] = report();
  if (std::getenv("ROFORMER_WRITE_GEMM_TESTDATA")) {
    std::ofstream out(path);
    out << head.dump() << "\n" << with_report.dump() << "\n";
  }
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  std::string first, second;
  std::getline(in, first);
  std::getline(in, second);
  EXPECT_EQ(nlohmann::json::parse(first), head);
  EXPECT_EQ(nlohmann::json::parse(second), with_report)
      << path << " is not what gemm_report_row writes (ROFORMER_WRITE_GEMM_TESTDATA=1 rewrites it)";
}

// The timings: rank 0 is the chosen algorithm; the best may be another; no
// chosen timing where the library refused rank 0; an error where none ran.
TEST(GemmReport, RowsCarryTheChosenAndTheBestTimings) {
  const cuda::GemmArgs g = problem(512, 256, 128, false, true);
  const double flop = 2.0 * 512 * 256 * 128;
  nlohmann::json row = bench::gemm_report_row(g, 3, {timed(0, 0.5), timed(1, 0.25), timed(2, 1)});
  EXPECT_EQ(row["calls"], 3);
  EXPECT_EQ(row["best_rank"], 1);
  EXPECT_DOUBLE_EQ(row["heuristic_ms"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(row["best_ms"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(row["tflops_heuristic"].get<double>(), flop / 0.5 * 1e-9);
  EXPECT_EQ(row["candidates"].size(), 3u);
  row = bench::gemm_report_row(g, 1, {timed(1, 0.25)});
  EXPECT_FALSE(row.contains("heuristic_ms"));
  EXPECT_EQ(row["best_rank"], 1);
  row = bench::gemm_report_row(g, 1, {});
  EXPECT_TRUE(row.contains("error"));
  EXPECT_FALSE(row.contains("best_ms"));
  cuda::GemmArgs shifted = g;
  shifted.a = at(16), shifted.b = at(2);
  row = bench::gemm_report_row(shifted, 1, {});
  EXPECT_EQ(row["offset_a"], 16);
  EXPECT_EQ(row["offset_b"], 2);
}

}  // namespace
}  // namespace roformer
