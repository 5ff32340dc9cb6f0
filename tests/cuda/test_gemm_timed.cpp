// run.gemm_algorithms: timed on the GPU (core/cuda/gemm.h): a product's first
// run times cuBLASLt's candidates and keeps the choice in the table
// (core/gemm_table/gemm_table.h); later runs, a reloaded table and other
// sizes of the bucket run it without timing again, bit for bit; the timing
// never changes what the product computes (accumulation, epilogues); an
// entry cuBLASLt refuses falls back to the heuristic's answer.
#include <cmath>
#include <cstring>

#include "core/cuda/gemm.h"
#include "core/gemm_table/gemm_table.h"
#include "core/kernels/gelu_tanh.h"
#include "tests/cuda/gpu_test.h"

namespace roformer {
namespace {

using testing::kGpu;
using testing::relative_error;

// Each case starts with an empty table under the timed choice and leaves
// the heuristic and an empty table behind.
class CudaGemmTimed : public ::testing::Test {
 protected:
  void SetUp() override {
    clear_gemm_table();
    set_gemm_algorithm_choice(GemmAlgorithmChoice::kTimed);
  }
  void TearDown() override {
    set_gemm_algorithm_choice(GemmAlgorithmChoice::kHeuristic);
    clear_gemm_table();
  }
};

// C[m x n] (+)= A[m x k] B[k x n] in double on the bf16-rounded operands.
std::vector<double> product(const Tensor& a, const Tensor& b, int64_t m, int64_t n, int64_t k) {
  const std::vector<double> ha = a.to_vector<double>(), hb = b.to_vector<double>();
  std::vector<double> c(size_t(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t l = 0; l < k; ++l) {
      const double x = ha[size_t(i * k + l)];
      for (int64_t j = 0; j < n; ++j) c[size_t(i * n + j)] += x * hb[size_t(l * n + j)];
    }
  return c;
}

cuda::GemmArgs plain_args(const Tensor& a, const Tensor& b, const Tensor& c, int64_t m, int64_t n,
                          int64_t k) {
  cuda::GemmArgs g;
  g.m = m, g.n = n, g.k = k;
  g.a = a.data(), g.lda = k, g.b = b.data(), g.ldb = n, g.c = c.data(), g.ldc = n;
  g.input_dtype = DType::bf16, g.output_dtype = DType::f32;
  return g;
}

// plain_args' problem as the table keys it (sizes already their own buckets).
GemmProblem plain_problem(int64_t m, int64_t n, int64_t k) {
  GemmProblem p;
  p.m = m, p.n = n, p.k = k, p.lda = k, p.ldb = n, p.ldc = n;
  p.input_dtype = "bf16";
  return p;
}

bool same_bits(const Tensor& x, const Tensor& y) {
  const std::vector<float> a = x.to_vector<float>(), b = y.to_vector<float>();
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_F(CudaGemmTimed, TimesOnceKeepsTheChoiceAndRunsItAgainBitForBit) {
  RF_REQUIRE_GPU();
  const int64_t m = 512, n = 384, k = 256;
  Generator gen{71, 0};
  const Tensor a = Tensor::randn({m, k}, gen).to(DType::bf16),
               b = Tensor::randn({k, n}, gen).to(DType::bf16);
  const Tensor da = a.to(kGpu), db = b.to(kGpu);
  const std::vector<double> ref = product(a, b, m, n, k);
  auto run = [&](int64_t rows) {
    const Tensor c = Tensor::full({rows, n}, NAN).to(kGpu);
    cuda::gemm(plain_args(da, db, c, rows, n, k), 0, nullptr);
    return c;
  };

  Tensor probe = Tensor::full({m, n}, NAN).to(kGpu);
  set_gemm_algorithm_choice(GemmAlgorithmChoice::kHeuristic);
  const auto heuristic = cuda::gemm_algorithm_for(plain_args(da, db, probe, m, n, k), 0, nullptr);
  ASSERT_TRUE(heuristic);
  set_gemm_algorithm_choice(GemmAlgorithmChoice::kTimed);
  EXPECT_EQ(gemm_table_size(), 0u);  // asking the heuristic times nothing

  const Tensor first = run(m);
  EXPECT_LT(relative_error(first.to_vector<double>(), ref), 1e-5);
  ASSERT_EQ(gemm_table_size(), 1u);
  const GemmProblem problem = plain_problem(m, n, k);
  const std::string gpu = cuda::gemm_gpu_identity(0);
  const auto entry = find_gemm_algorithm(gpu, problem);
  ASSERT_TRUE(entry) << "the table names this GPU and problem: " << gemm_table_json();
  EXPECT_TRUE(entry->timed);
  EXPECT_GT(entry->heuristic_ms, 0.0);
  // The heuristic's first answer, unless another beat it by more than 1%.
  if (entry->data == *heuristic)
    EXPECT_EQ(entry->ms, entry->heuristic_ms);
  else
    EXPECT_LT(entry->ms, entry->heuristic_ms * 0.99);
  EXPECT_EQ(cuda::gemm_algorithm_for(plain_args(da, db, probe, m, n, k), 0, nullptr), entry->data);

  // Again, and from a reloaded table: no timing (the table does not move), the same bits.
  const uint64_t generation = gemm_table_generation();
  EXPECT_TRUE(same_bits(run(m), first));
  EXPECT_EQ(gemm_table_generation(), generation);
  const std::string text = gemm_table_json();
  clear_gemm_table();
  load_gemm_table_json(text, "reloaded");
  const uint64_t reloaded = gemm_table_generation();
  EXPECT_TRUE(same_bits(run(m), first));
  EXPECT_EQ(gemm_table_generation(), reloaded);

  // Another m of the bucket (500 rounds up to 512): the entry serves it,
  // untimed (cuBLASLt's algorithms take any m of a plain product).
  const Tensor fewer = run(500);
  EXPECT_EQ(gemm_table_size(), 1u);
  EXPECT_EQ(cuda::gemm_algorithm_for(plain_args(da, db, probe, 500, n, k), 0, nullptr),
            entry->data);
  EXPECT_EQ(gemm_table_generation(), reloaded);
  const std::vector<double> ref_fewer(ref.begin(), ref.begin() + 500 * n);
  EXPECT_LT(relative_error(fewer.to_vector<double>(), ref_fewer), 1e-5);
}

// Timing runs the candidates many times: into scratch when the product adds
// into C, so C gets the product once; epilogues timed in place write what
// they write once.
TEST_F(CudaGemmTimed, TheTimingLeavesWhatTheProductComputes) {
  RF_REQUIRE_GPU();
  const int64_t m = 256, n = 192, k = 128;
  Generator gen{72, 0};
  const Tensor a = Tensor::randn({m, k}, gen).to(DType::bf16),
               b = Tensor::randn({k, n}, gen).to(DType::bf16);
  const Tensor bias = Tensor::randn({n}, gen);
  const Tensor da = a.to(kGpu), db = b.to(kGpu), dbias = bias.to(kGpu);
  const std::vector<double> ab = product(a, b, m, n, k);

  // beta = 1: C = C0 + A B, not C0 + (runs) A B.
  const Tensor c0 = Tensor::randn({m, n}, gen);
  const Tensor c = c0.to(kGpu);
  cuda::GemmArgs g = plain_args(da, db, c, m, n, k);
  g.beta = 1.0f;
  cuda::gemm(g, 0, nullptr);
  std::vector<double> ref = c0.to_vector<double>();
  for (size_t i = 0; i < ref.size(); ++i) ref[i] += ab[i];
  EXPECT_LT(relative_error(c.to_vector<double>(), ref), 1e-5) << "accumulated";
  EXPECT_EQ(gemm_table_size(), 1u);

  // GELU with aux, then dGELU with the bias gradient (written, not added).
  const Tensor pre = Tensor::full({m, n}, NAN).to(kGpu), y = Tensor::full({m, n}, NAN).to(kGpu);
  cuda::GemmArgs e = plain_args(da, db, y, m, n, k);
  e.bias = dbias.data(), e.bias_dtype = DType::f32;
  e.epilogue = cuda::GemmEpilogue::kGeluAux, e.aux = pre.data(), e.ld_aux = n;
  if (!cuda::try_gemm(e, 0, nullptr)) GTEST_SKIP() << "cuBLASLt refused GELU_AUX_BIAS";
  const std::vector<double> hbias = bias.to_vector<double>();
  std::vector<double> ref_pre(ab.size()), ref_y(ab.size());
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const size_t at = size_t(i * n + j);
      ref_pre[at] = ab[at] + hbias[size_t(j)];
      ref_y[at] = kernels::gelu_tanh(ref_pre[at]);
    }
  EXPECT_LT(relative_error(pre.to_vector<double>(), ref_pre), 1e-5) << "aux";
  EXPECT_LT(relative_error(y.to_vector<double>(), ref_y), 1e-5) << "GELU";

  const Tensor dpre = Tensor::full({m, n}, NAN).to(kGpu),
               dbias_out = Tensor::full({n}, NAN).to(kGpu);
  e.c = dpre.data(), e.bias = dbias_out.data();
  e.epilogue = cuda::GemmEpilogue::kDGeluBiasGrad;
  if (!cuda::try_gemm(e, 0, nullptr)) GTEST_SKIP() << "cuBLASLt refused DGELU_BGRAD";
  std::vector<double> ref_d(ab.size()), ref_db(size_t(n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const size_t at = size_t(i * n + j);
      ref_d[at] = ab[at] * kernels::gelu_tanh_grad(ref_pre[at]);
      ref_db[size_t(j)] += ref_d[at];
    }
  EXPECT_LT(relative_error(dpre.to_vector<double>(), ref_d), 1e-5) << "dGELU";
  EXPECT_LT(relative_error(dbias_out.to_vector<double>(), ref_db), 1e-5) << "bias gradient";
  EXPECT_EQ(gemm_table_size(), 3u);
}

// An entry cuBLASLt's check refuses (here: 64 bytes of ones, no algorithm
// at all) leaves the problem on the heuristic's first answer: the
// heuristic's own result, bit for bit.
TEST_F(CudaGemmTimed, AnEntryCublasLtRefusesFallsBackToTheHeuristic) {
  RF_REQUIRE_GPU();
  const int64_t m = 128, n = 96, k = 64;
  Generator gen{73, 0};
  const Tensor da = Tensor::randn({m, k}, gen).to(DType::bf16).to(kGpu),
               db = Tensor::randn({k, n}, gen).to(DType::bf16).to(kGpu);
  set_gemm_algorithm_choice(GemmAlgorithmChoice::kHeuristic);
  const Tensor heuristic = Tensor::full({m, n}, NAN).to(kGpu);
  cuda::gemm(plain_args(da, db, heuristic, m, n, k), 0, nullptr);

  set_gemm_algorithm_choice(GemmAlgorithmChoice::kTimed);
  const GemmProblem problem = plain_problem(m, n, k);
  GemmAlgorithm nothing;
  nothing.data.fill(~uint64_t(0));
  nothing.timed = false;
  add_gemm_algorithm(cuda::gemm_gpu_identity(0), problem, nothing);
  const Tensor timed = Tensor::full({m, n}, NAN).to(kGpu);
  cuda::gemm(plain_args(da, db, timed, m, n, k), 0, nullptr);
  EXPECT_TRUE(same_bits(timed, heuristic));
  const auto runs = cuda::gemm_algorithm_for(plain_args(da, db, timed, m, n, k), 0, nullptr);
  ASSERT_TRUE(runs);
  EXPECT_NE(*runs, nothing.data);
  EXPECT_EQ(gemm_table_size(), 1u);  // the entry stays; nothing was timed
}

}  // namespace
}  // namespace roformer
