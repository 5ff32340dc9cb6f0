// The cuBLASLt algorithms that CUDA matrix products run when chosen by
// timing (run.gemm_algorithms: timed), by GPU and by problem, and the file
// that keeps them (docs/formats.md, "GEMM algorithm table").
//
// Why a table: cuBLASLt's algorithms differ in their sums' order, so the
// choice decides the bits of every product. The heuristic's first answer is
// the same in every process; a choice made by timing is not, so the trainer
// saves it in the run directory and a resumed run loads it before its first
// product: it runs the algorithms, hence the bits, of the run it continues.
//
// Device-neutral (no CUDA types): core/cuda/gemm.cpp fills and reads it; the
// trainer loads and saves it in any build.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>

namespace roformer {

// How a product's algorithm is chosen: the heuristic's first answer (the
// default), or the fastest of its first answers timed on the problem's first
// run (core/cuda/gemm.h).
enum class GemmAlgorithmChoice : uint8_t { kHeuristic, kTimed };
void set_gemm_algorithm_choice(GemmAlgorithmChoice choice);
GemmAlgorithmChoice gemm_algorithm_choice();

// The sizes m, n and k one table entry holds for: x rounded up to a multiple
// of an eighth of the largest power of two not above it (exact up to 16;
// 65,536 stays, 65,537 to 73,728 share 73,728). Token streams change the
// tokens of a micro-batch, and the masked rows the head's, from step to
// step: one timing serves a bucket of them, not every count anew.
int64_t gemm_size_bucket(int64_t x);

// A product as cuBLASLt's choice depends on it, in core/cuda/gemm.h's
// row-major terms, with m, n and k as their buckets (gemm_size_bucket).
// Alignments are the largest power of two (up to 256) that divides each
// operand's address; 256 where the operand is absent.
struct GemmProblem {
  int64_t m = 0, n = 0, k = 0, batch = 1;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  bool trans_a = false, trans_b = false;
  bool accumulate = false;           // beta != 0: C is added to
  std::string epilogue = "none";     // none, bias, gelu_aux, dgelu_bias_grad, row_sums_of_a
  std::string input_dtype = "f32";   // of A and B
  std::string output_dtype = "f32";  // of C
  std::string bias_dtype;            // empty without a bias
  std::string compute = "f32";       // or tf32
  int64_t align_a = 256, align_b = 256, align_c = 256, align_bias = 256, align_aux = 256;

  auto fields() const {
    return std::tie(m, n, k, batch, lda, ldb, ldc, stride_a, stride_b, stride_c, trans_a, trans_b,
                    accumulate, epilogue, input_dtype, output_dtype, bias_dtype, compute, align_a,
                    align_b, align_c, align_bias, align_aux);
  }
  bool operator<(const GemmProblem& o) const { return fields() < o.fields(); }
  bool operator==(const GemmProblem& o) const { return fields() == o.fields(); }
};

// One choice: cuBLASLt's opaque algorithm (cublasLtMatmulAlgo_t, 64 bytes),
// and how it was made.
struct GemmAlgorithm {
  std::array<uint64_t, 8> data{};
  // false: the heuristic's first answer, kept because the problem could not
  // be timed (no device memory for the timing's scratch output).
  bool timed = true;
  double ms = 0;            // per run, when timed
  double heuristic_ms = 0;  // the heuristic's first answer's, when timed
  bool operator==(const GemmAlgorithm& o) const { return data == o.data && timed == o.timed; }
};

// `gpu` names the GPU and library a choice holds for ("NVIDIA H200, cuBLASLt
// 130100"): a table loaded on another keeps that one's entries unused.
// Thread-safe.
std::optional<GemmAlgorithm> find_gemm_algorithm(const std::string& gpu,
                                                 const GemmProblem& problem);
// Keeps `algorithm` for the problem unless the table holds one already (a
// choice, once run, stays); returns the one kept.
GemmAlgorithm add_gemm_algorithm(const std::string& gpu, const GemmProblem& problem,
                                 const GemmAlgorithm& algorithm);
size_t gemm_table_size();
// Moves on every addition, load and clear: the trainer saves the table when
// it moved.
uint64_t gemm_table_generation();
// Moves only when entries may have been replaced or removed (a load, a
// clear): what callers derived from the table may be stale then.
uint64_t gemm_table_resets();
// Empties the table (tests; a process that starts another run).
void clear_gemm_table();

// The whole table as JSON (every GPU's entries, sorted: the same table
// always gives the same text).
std::string gemm_table_json();
// Adds the entries of `text` (replacing those of the same GPU and problem).
// Throws InputError naming `source` and the entry and field at fault; the
// table is unchanged then.
void load_gemm_table_json(std::string_view text, const std::string& source);
// The same through files: the save is atomic (core/file_write.h), so a crash
// never leaves a half-written table where a good one stood.
void save_gemm_table(const std::filesystem::path& path);
void load_gemm_table(const std::filesystem::path& path);

}  // namespace roformer
