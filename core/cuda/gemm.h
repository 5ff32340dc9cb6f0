// Matrix products through cuBLASLt, in row-major terms (the library is
// column-major; the wrapper computes C^T = B^T A^T, which is the same memory).
//
//   C[b] = alpha * op(A[b]) op(B[b]) + beta * C[b]  (+ bias[n] on every row)
//
// A is M x K (stored K x M when trans_a), B is K x N (stored N x K when
// trans_b), C is M x N; lda/ldb/ldc are the row strides of the stored
// matrices; stride_* are the distances between batch entries (0 broadcasts).
// Inputs f32 or bf16 with f32 accumulation; C f32 or bf16; the bias has C's
// dtype or f32. f32 inputs use TF32 tensor cores only when allow_tf32.
//
// The GELU epilogues (cuBLASLt's GELU is the tanh approximation, HF's
// "gelu_new"; not the erf GELU) take one matrix (batch 1) and an aux matrix
// [m x n] row-major in C's dtype, row stride ld_aux (a multiple of 8):
//   kGeluAux        aux = product + bias; C = gelu_tanh(aux)
//   kDGeluBiasGrad  C = product * gelu_tanh'(aux); bias (written, [n]) = the
//                   column sums of C: the bias gradient
// and one takes no aux matrix (batch 1):
//   kRowSumsOfA     C = product; bias (written, [m]) = the sums over k of
//                   op(A)'s rows: with A = g^T, the bias gradient of a linear
//                   beside its weight gradient (cuBLASLt's BGRADB: A is its B)
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace roformer::cuda {

enum class GemmEpilogue : uint8_t { kNone, kGeluAux, kDGeluBiasGrad, kRowSumsOfA };

struct GemmArgs {
  int64_t m = 0, n = 0, k = 0;
  int64_t batch = 1;
  const void* a = nullptr;
  int64_t lda = 0, stride_a = 0;
  bool trans_a = false;
  const void* b = nullptr;
  int64_t ldb = 0, stride_b = 0;
  bool trans_b = false;
  void* c = nullptr;
  int64_t ldc = 0, stride_c = 0;
  DType input_dtype = DType::f32;   // of A and B
  DType output_dtype = DType::f32;  // of C
  const void* bias = nullptr;       // [n], or nullptr (written: kDGeluBiasGrad; [m], kRowSumsOfA)
  DType bias_dtype = DType::f32;
  GemmEpilogue epilogue = GemmEpilogue::kNone;
  void* aux = nullptr;  // the GELU input of the epilogues
  int64_t ld_aux = 0;
  float alpha = 1.0f, beta = 0.0f;
  bool allow_tf32 = false;
};

// The epilogue's name in reports and the algorithm table: none, gelu_aux,
// dgelu_bias_grad, row_sums_of_a.
const char* gemm_epilogue_name(GemmEpilogue epilogue);
// Elements a stored row-major matrix of `rows` x `cols` (row stride ld)
// spans over `batch` entries `stride` apart (0: one matrix for all).
int64_t gemm_matrix_span(int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride);

// Whether the kernel list's f32 matmul may use TF32 tensor cores (off by
// default: f32 results then match the CPU closely). Nothing sets it yet: f32
// runs use full f32 products, bf16 runs the bf16 tensor cores.
void set_allow_tf32(bool allow);
bool allow_tf32();

// Queues the product on `stream` of device `device`. The device's one
// cuBLASLt workspace is shared: run GEMMs of one device on one stream at a time. Throws naming the
// shapes when cuBLASLt has no algorithm for them, and the call when one fails.
//
// The algorithm (core/gemm_table/gemm_table.h, set_gemm_algorithm_choice):
// - heuristic (the default): cuBLASLt's first answer for the problem, asked
//   once per problem; the same in every process.
// - timed: the table's choice for this GPU and problem, its sizes in
//   buckets (gemm_size_bucket). A problem whose bucket the table lacks is
//   timed on its first run: the heuristic's first 8 answers, each
//   as the median of three groups of 5 runs after one untimed run; another
//   replaces the heuristic's first only when more than 1% faster. The
//   candidates run in the product's own buffers when that changes nothing
//   the product reads, else into zeroed scratch outputs at the same
//   alignments (accumulation, an output over an input); the product then
//   runs once as usual. The choice joins the table; a problem that cannot
//   get its scratch memory keeps the heuristic's first answer, untimed, in
//   the table. The timing synchronises the stream (once per bucket). An
//   entry cuBLASLt refuses for another problem of its bucket (its check,
//   or more workspace than the device's) leaves that problem on the
//   heuristic's first answer.
void gemm(const GemmArgs& args, int device, cudaStream_t stream);
// The same, returning false (nothing queued) when cuBLASLt has no algorithm
// for the problem: callers with an unfused way (the GELU epilogues) take it.
bool try_gemm(const GemmArgs& args, int device, cudaStream_t stream);
// The GPU and library as the table of timed choices names them: "NVIDIA
// H200 (132 SMs), cuBLASLt 130100".
std::string gemm_gpu_identity(int device);
// The algorithm gemm runs for `args` now, as cuBLASLt's 64 bytes (under the
// timed choice, timed first when its bucket is new); nullopt when cuBLASLt
// has none. For tests: what a product runs, without running it.
std::optional<std::array<uint64_t, 8>> gemm_algorithm_for(const GemmArgs& args, int device,
                                                          cudaStream_t stream);

// --- measuring the products (bench/gpu/gemm_report.cpp) ---------------------

// A problem gemm ran while a GemmRecording was alive, and how many times.
// args' pointers are the first call's: stale once their owner frees them;
// its shapes, strides, dtypes, epilogue and beta are what a bench re-runs.
struct RecordedGemm {
  GemmArgs args;
  int64_t calls = 0;
};

// While alive, gemm counts the problems it runs (one entry per distinct
// problem: shapes, strides, dtypes, epilogue, accumulation, alignments). One
// at a time in a process (a second throws).
class GemmRecording {
 public:
  GemmRecording();
  ~GemmRecording();
  GemmRecording(const GemmRecording&) = delete;
  GemmRecording& operator=(const GemmRecording&) = delete;
  std::vector<RecordedGemm> problems() const;
};

// One of cuBLASLt's answers for a problem, timed.
struct GemmCandidate {
  int rank = 0;          // 0: the algorithm gemm runs for this problem; then the heuristic's order
  double ms = 0.0;       // per run: the median of three averages of `repeats` runs
  size_t workspace = 0;  // bytes it asked for (0 where the longer list did not hold it)
  float waves = 0.0f;    // the heuristic's estimate of its waves over the SMs
};

// Times the algorithm gemm runs for `args` (rank 0: the heuristic's first
// answer, or the table's under the timed choice; the operands' alignments
// are part of the problem) and the other answers of a list of up to `candidates`, each after
// one untimed run as three groups of `repeats` runs back to back between CUDA
// events (the host's launch work then overlaps the device's); synchronises
// the stream. Runs the product into args' own buffers (with beta != 0 each
// run adds to C). An algorithm the library then refuses is left out; other
// failures throw. Empty when cuBLASLt has no algorithm for the problem.
std::vector<GemmCandidate> time_gemm_candidates(const GemmArgs& args, int device,
                                                cudaStream_t stream, int candidates, int repeats);

}  // namespace roformer::cuda
