#include "core/cuda/gemm.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

#include "core/cuda/backend.h"
#include "core/cuda/raii.h"
#include "core/error.h"
#include "core/gemm_table/gemm_table.h"

namespace roformer::cuda {

namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLAS's recommendation for Hopper

// One handle and workspace per device, created on first use and kept, and
// the GPU as the table of timed choices names it.
struct DeviceContext {
  CublasLtHandle handle;
  DeviceMemory workspace;
  std::string gpu;
};

// "NVIDIA H200 (132 SMs), cuBLASLt 130100": what a timed choice holds for.
std::string gpu_identity(int device) {
  cudaDeviceProp prop{};
  RF_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return detail::concat(prop.name, " (", prop.multiProcessorCount, " SMs), cuBLASLt ",
                        cublasLtGetVersion());
}

DeviceContext& context(int device) {
  static std::mutex mutex;
  static auto* contexts = new std::map<int, std::unique_ptr<DeviceContext>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = (*contexts)[device];
  if (!slot) {
    DeviceGuard guard(device);
    slot = std::make_unique<DeviceContext>();
    slot->handle = CublasLtHandle::create();
    slot->workspace = DeviceMemory(kWorkspaceBytes);
    slot->gpu = gpu_identity(device);
  }
  return *slot;
}

cudaDataType_t cuda_type(DType t, const char* role) {
  switch (t) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::bf16:
      return CUDA_R_16BF;
    default:
      break;
  }
  throw Error(detail::concat("gemm: ", role, " must be f32 or bf16, got ", dtype_name(t)));
}

// The largest power of two (up to 256) dividing the address: the heuristic
// must know how aligned the operands really are.
uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && address % a) a /= 2;
  return a;
}

template <class Handle, cublasStatus_t (*Destroy)(Handle)>
struct LtDescriptor {
  Handle h = nullptr;
  ~LtDescriptor() {
    if (h) Destroy(h);
  }
};
using MatmulDesc = LtDescriptor<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using LayoutDesc = LtDescriptor<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using PreferenceDesc = LtDescriptor<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

void make_layout(LayoutDesc& layout, cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld,
                 int64_t batch, int64_t stride) {
  RF_CUDA_CHECK(cublasLtMatrixLayoutCreate(&layout.h, type, uint64_t(rows), uint64_t(cols), ld));
  if (batch > 1) {
    const int32_t count = int32_t(batch);
    RF_CUDA_CHECK(cublasLtMatrixLayoutSetAttribute(layout.h, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                   &count, sizeof(count)));
    RF_CUDA_CHECK(cublasLtMatrixLayoutSetAttribute(
        layout.h, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  }
}

// Sets one attribute of a matmul descriptor, naming it when cuBLASLt refuses.
template <class V>
void set_desc(const MatmulDesc& op, cublasLtMatmulDescAttributes_t attribute, const V& value,
              const char* call, int line) {
  check_status(cublasLtMatmulDescSetAttribute(op.h, attribute, &value, sizeof(value)), call,
               __FILE__, line);
}
#define RF_SET_DESC(op, attribute, value) \
  set_desc(op, attribute, value, "cublasLtMatmulDescSetAttribute(" #attribute ")", __LINE__)

cublasLtEpilogue_t epilogue_of(const GemmArgs& g) {
  switch (g.epilogue) {
    case GemmEpilogue::kGeluAux:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case GemmEpilogue::kDGeluBiasGrad:
      return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    case GemmEpilogue::kRowSumsOfA:
      return CUBLASLT_EPILOGUE_BGRADB;  // cuBLASLt's B is our A's memory (column-major view)
    case GemmEpilogue::kNone:
      break;
  }
  return g.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
}

std::string describe(const GemmArgs& g) {
  return detail::concat(
      "gemm ", g.batch, " x [", g.m, " x ", g.k, "]", g.trans_a ? "^T" : "", " * [", g.k, " x ",
      g.n, "]", g.trans_b ? "^T" : "", " (", dtype_name(g.input_dtype), " -> ",
      dtype_name(g.output_dtype), g.bias ? ", bias" : "",
      g.epilogue == GemmEpilogue::kGeluAux         ? ", GELU (tanh) with aux"
      : g.epilogue == GemmEpilogue::kDGeluBiasGrad ? ", dGELU (tanh) and bias gradient"
      : g.epilogue == GemmEpilogue::kRowSumsOfA    ? ", row sums of A (bias gradient)"
                                                   : "",
      ")");
}

// Heuristic answers by problem, so each shape asks cuBLASLt once.
using AlgoKey = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int,
                           int, int, int, int, int64_t, int64_t, int64_t, uint64_t>;

std::atomic<bool> g_allow_tf32{false};

}  // namespace

const char* gemm_epilogue_name(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::kGeluAux:
      return "gelu_aux";
    case GemmEpilogue::kDGeluBiasGrad:
      return "dgelu_bias_grad";
    case GemmEpilogue::kRowSumsOfA:
      return "row_sums_of_a";
    case GemmEpilogue::kNone:
      break;
  }
  return "none";
}

int64_t gemm_matrix_span(int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
  if (rows == 0 || cols == 0) return 0;
  return stride * (batch - 1) + (rows - 1) * ld + cols;
}

void set_allow_tf32(bool allow) {
  g_allow_tf32 = allow;
}

bool allow_tf32() {
  return g_allow_tf32;
}

std::string gemm_gpu_identity(int device) {
  return context(device).gpu;
}

void gemm(const GemmArgs& g, int device, cudaStream_t stream) {
  RF_CHECK(try_gemm(g, device, stream), describe(g),
           ": cuBLASLt has no algorithm for this problem");
}

namespace {

// A problem as cuBLASLt takes it: the matmul and layout descriptors, and the
// key its heuristic answers are cached under.
struct LtProblem {
  MatmulDesc op;
  LayoutDesc x, y, d;
  AlgoKey key;
  uint32_t align_a = 0, align_b = 0, align_c = 0, align_bias = 256, align_aux = 256;
};

// Builds g's descriptors (checking what cuBLASLt would reject less clearly).
void build_problem(LtProblem& p, const GemmArgs& g, int device) {
  const cudaDataType_t in_type = cuda_type(g.input_dtype, "the inputs");
  const cudaDataType_t out_type = cuda_type(g.output_dtype, "the output");
  const cublasComputeType_t compute = g.input_dtype == DType::f32 && g.allow_tf32
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  MatmulDesc& op = p.op;
  RF_CUDA_CHECK(cublasLtMatmulDescCreate(&op.h, compute, CUDA_R_32F));
  // Column-major view: D^T[N x M] = X * Y with X = B's memory, Y = A's memory.
  const cublasOperation_t op_x = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_y = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  RF_SET_DESC(op, CUBLASLT_MATMUL_DESC_TRANSA, op_x);
  RF_SET_DESC(op, CUBLASLT_MATMUL_DESC_TRANSB, op_y);
  RF_SET_DESC(op, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue_of(g));
  if (g.bias) {
    // Read (the bias), or written (a bias gradient): [n] in our terms, the
    // rows of the column-major D^T; [m], its columns, for kRowSumsOfA.
    RF_SET_DESC(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
    RF_SET_DESC(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, cuda_type(g.bias_dtype, "the bias"));
    // One bias for every entry; the row sums take one matrix and no stride
    // (cuBLASLt 13 on an H100 answered BGRADB with a stride set: invalid value).
    if (g.epilogue != GemmEpilogue::kRowSumsOfA)
      RF_SET_DESC(op, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, int64_t(0));
  }
  const bool gelu =
      g.epilogue == GemmEpilogue::kGeluAux || g.epilogue == GemmEpilogue::kDGeluBiasGrad;
  if (gelu) {
    // The GELU input, [m x n] row-major in C's dtype (column-major [n x m] for cuBLASLt).
    RF_SET_DESC(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux);
    RF_SET_DESC(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, g.ld_aux);
  }

  make_layout(p.x, in_type, g.trans_b ? g.k : g.n, g.trans_b ? g.n : g.k, g.ldb, g.batch,
              g.stride_b);
  make_layout(p.y, in_type, g.trans_a ? g.m : g.k, g.trans_a ? g.k : g.m, g.lda, g.batch,
              g.stride_a);
  make_layout(p.d, out_type, g.n, g.m, g.ldc, g.batch, g.stride_c);

  p.align_a = alignment_of(g.a);
  p.align_b = alignment_of(g.b);
  p.align_c = alignment_of(g.c);
  p.align_bias = g.bias ? alignment_of(g.bias) : 256;
  // The heuristic reads the aux pointer too (for its alignment).
  p.align_aux = g.aux ? alignment_of(g.aux) : 256;
  RF_CHECK(!gelu || (g.batch == 1 && g.aux && g.ld_aux >= g.n && g.ld_aux % 8 == 0 &&
                     alignment_of(g.aux) >= 16 && g.bias),
           describe(g),
           ": the GELU epilogues take one matrix, a bias (or bias gradient) and an aux matrix "
           "16-byte aligned with a row stride >= n and a multiple of 8");
  RF_CHECK(g.epilogue != GemmEpilogue::kRowSumsOfA || (g.batch == 1 && g.bias && g.beta == 0.0f),
           describe(g),
           ": the row sums epilogue takes one matrix, no accumulation, and the sums' "
           "vector");
  p.key = AlgoKey{
      device,
      g.m,
      g.n,
      g.k,
      g.batch,
      g.lda,
      g.ldb,
      g.ldc,
      int(g.trans_a) | int(g.trans_b) << 1 | int(g.beta != 0.0f) << 2 | int(g.epilogue) << 3,
      int(g.input_dtype),
      int(g.output_dtype),
      g.bias ? int(g.bias_dtype) : -1,
      int(compute),
      g.stride_a,
      g.stride_b,
      g.stride_c,
      uint64_t(p.align_a) | uint64_t(p.align_b) << 9 | uint64_t(p.align_c) << 18 |
          uint64_t(p.align_bias) << 27 | uint64_t(p.align_aux) << 36};
}

// Up to `wanted` of the heuristic's answers for p, best-ranked first; none
// when cuBLASLt does not take the problem.
std::vector<cublasLtMatmulHeuristicResult_t> heuristic_answers(const DeviceContext& ctx,
                                                               const LtProblem& p,
                                                               const GemmArgs& g, int wanted) {
  PreferenceDesc pref;
  RF_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&pref.h));
  const uint64_t workspace = ctx.workspace.size();
  RF_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref.h, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, p.align_b},  // X is B's memory
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, p.align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, p.align_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, p.align_c}};
  for (const auto& [attribute, value] : alignments)
    RF_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.h, attribute, &value, sizeof(value)));
  std::vector<cublasLtMatmulHeuristicResult_t> results(size_t(std::max(wanted, 1)));
  int returned = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(ctx.handle.get(), p.op.h, p.x.h, p.y.h, p.d.h, p.d.h, pref.h,
                                     int(results.size()), results.data(), &returned);
  // A problem cuBLASLt does not take comes back as "not supported" or, for
  // BGRADB with bf16 sums on cuBLASLt 13 (H100), "invalid value": both mean
  // no algorithm, so callers with an unfused way take it. Other "invalid
  // value" answers stay errors (a wrong descriptor must not pass for a refusal).
  const bool refused =
      status == CUBLAS_STATUS_NOT_SUPPORTED ||
      (status == CUBLAS_STATUS_INVALID_VALUE && g.epilogue == GemmEpilogue::kRowSumsOfA);
  if (!refused) check_status(status, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
  results.resize(status == CUBLAS_STATUS_SUCCESS ? size_t(std::max(returned, 0)) : 0);
  return results;
}

cublasStatus_t run_algorithm(const DeviceContext& ctx, const LtProblem& p, const GemmArgs& g,
                             const cublasLtMatmulAlgo_t& algo, cudaStream_t stream) {
  return cublasLtMatmul(ctx.handle.get(), p.op.h, &g.alpha, g.b, p.x.h, g.a, p.y.h, &g.beta, g.c,
                        p.d.h, g.c, p.d.h, &algo, ctx.workspace.get(), ctx.workspace.size(),
                        stream);
}

// Whether two of cuBLASLt's answers are one algorithm (an opaque struct).
bool same_algorithm(const cublasLtMatmulAlgo_t& x, const cublasLtMatmulAlgo_t& y) {
  return std::memcmp(&x, &y, sizeof(x)) == 0;
}

// The heuristic's first answer by problem, or nullopt when it has none
// (asked once per problem).
std::mutex g_algorithm_mutex;
auto* g_algorithms = new std::map<AlgoKey, std::optional<cublasLtMatmulAlgo_t>>();

std::optional<cublasLtMatmulAlgo_t> heuristic_algorithm(const DeviceContext& ctx,
                                                        const LtProblem& p, const GemmArgs& g) {
  {
    std::lock_guard<std::mutex> lock(g_algorithm_mutex);
    auto it = g_algorithms->find(p.key);
    if (it != g_algorithms->end()) return it->second;
  }
  std::optional<cublasLtMatmulAlgo_t> algo;
  const auto answers = heuristic_answers(ctx, p, g, 1);
  if (!answers.empty()) algo = answers.front().algo;
  std::lock_guard<std::mutex> lock(g_algorithm_mutex);
  return g_algorithms->try_emplace(p.key, algo).first->second;
}

// --- the choice by timing (run.gemm_algorithms: timed) ----------------------

constexpr int kTimedCandidates = 8;  // the heuristic's first answers that are timed
constexpr int kTimedRepeats = 5;     // runs per timed group (three groups each)
// Another algorithm replaces the heuristic's first only when faster by more
// than this fraction: closer than that is the timing's noise.
constexpr double kTimedMargin = 0.01;

static_assert(sizeof(cublasLtMatmulAlgo_t) == sizeof(GemmAlgorithm::data),
              "the table keeps cuBLASLt's algorithm as its 64 bytes");

std::array<uint64_t, 8> bytes_of(const cublasLtMatmulAlgo_t& algo) {
  std::array<uint64_t, 8> data{};
  std::memcpy(data.data(), &algo, sizeof(algo));
  return data;
}

cublasLtMatmulAlgo_t algorithm_of(const std::array<uint64_t, 8>& data) {
  cublasLtMatmulAlgo_t algo;
  std::memcpy(&algo, data.data(), sizeof(algo));
  return algo;
}

// The problem as the table keys it: p.key's fields by name, the sizes as
// their buckets.
GemmProblem table_problem(const LtProblem& p, const GemmArgs& g) {
  GemmProblem t;
  t.m = gemm_size_bucket(g.m);
  t.n = gemm_size_bucket(g.n);
  t.k = gemm_size_bucket(g.k);
  t.batch = g.batch;
  t.lda = g.lda;
  t.ldb = g.ldb;
  t.ldc = g.ldc;
  t.stride_a = g.stride_a;
  t.stride_b = g.stride_b;
  t.stride_c = g.stride_c;
  t.trans_a = g.trans_a;
  t.trans_b = g.trans_b;
  t.accumulate = g.beta != 0.0f;
  // The bias epilogue is a problem of its own for cuBLASLt: named apart.
  t.epilogue =
      g.epilogue == GemmEpilogue::kNone && g.bias ? "bias" : gemm_epilogue_name(g.epilogue);
  t.input_dtype = dtype_name(g.input_dtype);
  t.output_dtype = dtype_name(g.output_dtype);
  t.bias_dtype = g.bias ? dtype_name(g.bias_dtype) : "";
  t.compute = g.input_dtype == DType::f32 && g.allow_tf32 ? "tf32" : "f32";
  t.align_a = p.align_a;
  t.align_b = p.align_b;
  t.align_c = p.align_c;
  t.align_bias = p.align_bias;
  t.align_aux = p.align_aux;
  return t;
}

// The bytes a row-major operand spans: `batch` matrices `stride` elements
// apart, of `rows` rows `ld` elements apart and `cols` elements each.
struct Span {
  uintptr_t begin = 0, end = 0;
  bool overlaps(const Span& o) const { return begin < o.end && o.begin < end; }
};
Span span_of(const void* p, int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride,
             DType dtype) {
  if (!p) return {};
  const auto begin = reinterpret_cast<uintptr_t>(p);
  return {begin,
          begin + uintptr_t(gemm_matrix_span(rows, cols, ld, batch, stride)) * dtype_size(dtype)};
}

// Where the candidates are timed. In the product's own buffers when running
// it again changes nothing it reads (no accumulation into C, no output over
// an input): the real run that follows writes the same outputs. Otherwise
// the outputs (C, and the aux matrix or bias gradient an epilogue writes) go
// to zeroed scratch memory at the same alignments, so the timing leaves the
// product's buffers as they were. Scratch that cannot be had (the device is
// full) leaves ok() false: the problem is then not timed.
class TimingOperands {
 public:
  TimingOperands(const GemmArgs& g, int device, cudaStream_t stream)
      : args_(g), device_(device), stream_(stream) {
    const bool writes_aux = g.epilogue == GemmEpilogue::kGeluAux;
    const bool reads_aux = g.epilogue == GemmEpilogue::kDGeluBiasGrad;
    const bool writes_bias =
        g.epilogue == GemmEpilogue::kDGeluBiasGrad || g.epilogue == GemmEpilogue::kRowSumsOfA;
    const int64_t bias_length = g.epilogue == GemmEpilogue::kRowSumsOfA ? g.m : g.n;
    const Span a = span_of(g.a, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.lda, g.batch,
                           g.stride_a, g.input_dtype);
    const Span b = span_of(g.b, g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.ldb, g.batch,
                           g.stride_b, g.input_dtype);
    const Span c = span_of(g.c, g.m, g.n, g.ldc, g.batch, g.stride_c, g.output_dtype);
    const Span aux = span_of(g.aux, g.m, g.n, g.ld_aux, 1, 0, g.output_dtype);
    const Span bias = span_of(g.bias, 1, bias_length, bias_length, 1, 0, g.bias_dtype);
    std::vector<Span> reads{a, b}, writes{c};
    (reads_aux ? reads : writes).push_back(writes_aux || reads_aux ? aux : Span{});
    (writes_bias ? writes : reads).push_back(bias);
    bool in_place = g.beta == 0.0f;
    for (const Span& w : writes)
      for (const Span& r : reads) in_place = in_place && !w.overlaps(r);
    if (in_place) return;
    args_.c = scratch(g.c, c);
    if (writes_aux) args_.aux = scratch(g.aux, aux);
    if (writes_bias) args_.bias = scratch(g.bias, bias);
  }

  bool ok() const { return ok_; }
  const GemmArgs& args() const { return args_; }

 private:
  // Zeroed device memory for an operand spanning `span`, as aligned as it;
  // the operand itself (and ok() false) when the device has no room.
  void* scratch(const void* original, const Span& span) {
    if (!ok_) return const_cast<void*>(original);
    const size_t offset = reinterpret_cast<uintptr_t>(original) % 256;
    const size_t nbytes = size_t(span.end - span.begin) + 256;
    try {
      blocks_.push_back(std::make_unique<StreamMemory>(device_, stream_, nbytes));
    } catch (const OutOfMemoryError&) {  // the caller keeps the heuristic's answer
      ok_ = false;
      return const_cast<void*>(original);
    }
    void* block = blocks_.back()->get();
    RF_CUDA_CHECK(cudaMemsetAsync(block, 0, nbytes, stream_));
    return static_cast<char*>(block) + offset;  // blocks are 256-byte aligned
  }

  GemmArgs args_;
  int device_;
  cudaStream_t stream_;
  bool ok_ = true;
  std::vector<std::unique_ptr<StreamMemory>> blocks_;  // given back with the operands
};

// One algorithm's time per run: after one untimed run, three groups of
// `repeats` runs back to back between CUDA events (the host's launch work
// then overlaps the device's); the median group's average. nullopt when the
// library refuses the algorithm for the problem. Synchronises the stream.
std::optional<double> time_algorithm(const DeviceContext& ctx, const LtProblem& p,
                                     const GemmArgs& g, const cublasLtMatmulAlgo_t& algo,
                                     cudaStream_t stream, int repeats) {
  const cublasStatus_t first = run_algorithm(ctx, p, g, algo, stream);
  if (first == CUBLAS_STATUS_NOT_SUPPORTED) return std::nullopt;
  check_status(first, "cublasLtMatmul", __FILE__, __LINE__);
  const CudaEvent start = CudaEvent::create(true), stop = CudaEvent::create(true);
  std::vector<double> ms;
  for (int group = 0; group < 3; ++group) {
    start.record(stream);
    for (int r = 0; r < repeats; ++r)
      check_status(run_algorithm(ctx, p, g, algo, stream), "cublasLtMatmul", __FILE__, __LINE__);
    stop.record(stream);
    RF_CUDA_CHECK(cudaEventSynchronize(stop.get()));
    float elapsed = 0.0f;
    RF_CUDA_CHECK(cudaEventElapsedTime(&elapsed, start.get(), stop.get()));
    ms.push_back(double(elapsed) / repeats);
  }
  std::sort(ms.begin(), ms.end());
  return ms[1];
}

// The heuristic's first answer, then the other answers of a longer list,
// each once, `candidates` in all.
std::vector<cublasLtMatmulAlgo_t> candidate_algorithms(
    const cublasLtMatmulAlgo_t& first, const std::vector<cublasLtMatmulHeuristicResult_t>& answers,
    int candidates) {
  std::vector<cublasLtMatmulAlgo_t> algos{first};
  for (const auto& answer : answers) {
    const bool seen = std::any_of(algos.begin(), algos.end(),
                                  [&](const auto& a) { return same_algorithm(a, answer.algo); });
    if (!seen && int(algos.size()) < candidates) algos.push_back(answer.algo);
  }
  return algos;
}

// Times the heuristic's first kTimedCandidates answers for g (on
// TimingOperands) and returns the fastest, or `first` untimed when the
// problem cannot be timed.
GemmAlgorithm choose_by_timing(const DeviceContext& ctx, const GemmArgs& g, int device,
                               cudaStream_t stream, const cublasLtMatmulAlgo_t& first) {
  GemmAlgorithm chosen;
  chosen.data = bytes_of(first);
  chosen.timed = false;
  const TimingOperands operands(g, device, stream);
  if (!operands.ok()) return chosen;
  LtProblem t;  // descriptors naming the timing's operands (an epilogue's pointers)
  build_problem(t, operands.args(), device);
  const auto algos = candidate_algorithms(
      first, heuristic_answers(ctx, t, operands.args(), kTimedCandidates), kTimedCandidates);
  // The first that runs is the baseline (the heuristic's own, unless refused);
  // another replaces it only when faster by more than the margin.
  for (size_t rank = 0; rank < algos.size(); ++rank) {
    const std::optional<double> ms =
        time_algorithm(ctx, t, operands.args(), algos[rank], stream, kTimedRepeats);
    if (!ms) continue;
    if (rank == 0) chosen.heuristic_ms = *ms;
    if (!chosen.timed || *ms < chosen.ms * (1 - kTimedMargin)) {
      chosen.data = bytes_of(algos[rank]);
      chosen.ms = *ms;
      chosen.timed = true;
    }
  }
  return chosen;
}

// Whether cuBLASLt takes `algo` for this exact problem within the workspace
// (a table entry holds for a bucket of sizes: core/gemm_table/gemm_table.h).
bool algorithm_fits(const DeviceContext& ctx, const LtProblem& p,
                    const cublasLtMatmulAlgo_t& algo) {
  cublasLtMatmulHeuristicResult_t result{};
  const cublasStatus_t status =
      cublasLtMatmulAlgoCheck(ctx.handle.get(), p.op.h, p.x.h, p.y.h, p.d.h, p.d.h, &algo, &result);
  return status == CUBLAS_STATUS_SUCCESS && result.workspaceSize <= ctx.workspace.size();
}

// Under the timed choice, what each exact problem runs (the table's entry
// for its bucket, or the heuristic's first answer where that entry does not
// fit it), so a product asks the table once. Emptied when entries may have
// changed (a load, a clear); an addition changes no entry resolved before.
std::mutex g_timed_mutex;
auto* g_timed = new std::map<AlgoKey, std::optional<cublasLtMatmulAlgo_t>>();
uint64_t g_timed_resets = 0;

// The cache, emptied first when the table was reset since it was filled
// (the caller holds g_timed_mutex).
std::map<AlgoKey, std::optional<cublasLtMatmulAlgo_t>>& timed_cache() {
  if (g_timed_resets != gemm_table_resets()) {
    g_timed->clear();
    g_timed_resets = gemm_table_resets();
  }
  return *g_timed;
}

std::optional<std::optional<cublasLtMatmulAlgo_t>> resolved_timed(const AlgoKey& key) {
  std::lock_guard<std::mutex> lock(g_timed_mutex);
  const auto& cache = timed_cache();
  auto it = cache.find(key);
  if (it == cache.end()) return std::nullopt;
  return it->second;
}

void resolve_timed(const AlgoKey& key, const std::optional<cublasLtMatmulAlgo_t>& algo) {
  std::lock_guard<std::mutex> lock(g_timed_mutex);
  timed_cache()[key] = algo;
}

// What gemm runs for a problem under the timed choice: the table's entry for
// this GPU and the problem's bucket, or, on the bucket's first product, the
// choice timed now and added to the table (the trainer saves it). Where the
// entry does not fit this exact problem, the heuristic's first answer: a
// deterministic rule, so a resumed run falls back alike.
std::optional<cublasLtMatmulAlgo_t> timed_algorithm(const DeviceContext& ctx, const LtProblem& p,
                                                    const GemmArgs& g, int device,
                                                    cudaStream_t stream) {
  if (const auto known = resolved_timed(p.key)) return *known;
  const GemmProblem problem = table_problem(p, g);
  std::optional<GemmAlgorithm> entry = find_gemm_algorithm(ctx.gpu, problem);
  const std::optional<cublasLtMatmulAlgo_t> first = heuristic_algorithm(ctx, p, g);
  if (!entry) {
    if (!first) return std::nullopt;  // no algorithm at all: nothing to time or to keep
    // Two devices of one kind may time a bucket at once: the first kept wins.
    entry = add_gemm_algorithm(ctx.gpu, problem, choose_by_timing(ctx, g, device, stream, *first));
  }
  std::optional<cublasLtMatmulAlgo_t> algo = algorithm_of(entry->data);
  if (!algorithm_fits(ctx, p, *algo)) algo = first;
  resolve_timed(p.key, algo);
  return algo;
}

// The algorithm gemm runs for the problem, by run.gemm_algorithms.
std::optional<cublasLtMatmulAlgo_t> chosen_algorithm(const DeviceContext& ctx, const LtProblem& p,
                                                     const GemmArgs& g, int device,
                                                     cudaStream_t stream) {
  if (gemm_algorithm_choice() == GemmAlgorithmChoice::kTimed)
    return timed_algorithm(ctx, p, g, device, stream);
  return heuristic_algorithm(ctx, p, g);
}

// Refused when run though chosen (seen nowhere yet; an epilogue is the
// likely case). Under the heuristic: remembered as no algorithm, so callers
// with an unfused way take it from now on. Under the timed choice: the
// problem falls back to the heuristic's first answer, returned to run now
// when it is another algorithm.
std::optional<cublasLtMatmulAlgo_t> forget_algorithm(const DeviceContext& ctx, const LtProblem& p,
                                                     const GemmArgs& g,
                                                     const cublasLtMatmulAlgo_t& refused) {
  if (gemm_algorithm_choice() == GemmAlgorithmChoice::kTimed) {
    const std::optional<cublasLtMatmulAlgo_t> first = heuristic_algorithm(ctx, p, g);
    const bool other = first && !same_algorithm(*first, refused);
    resolve_timed(p.key, other ? first : std::nullopt);
    if (other) return first;
  }
  std::lock_guard<std::mutex> lock(g_algorithm_mutex);
  (*g_algorithms)[p.key] = std::nullopt;
  return std::nullopt;
}

// The recording in progress, if any (GemmRecording), by problem; the flag
// spares gemm the mutex when nothing records.
std::atomic<bool> g_recording_on{false};
std::mutex g_recording_mutex;
std::map<AlgoKey, RecordedGemm>* g_recording = nullptr;

void record(const LtProblem& p, const GemmArgs& g) {
  if (!g_recording_on.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(g_recording_mutex);
  if (!g_recording) return;
  ++g_recording->try_emplace(p.key, RecordedGemm{g, 0}).first->second.calls;
}

}  // namespace

GemmRecording::GemmRecording() {
  std::lock_guard<std::mutex> lock(g_recording_mutex);
  RF_CHECK(!g_recording, "gemm: a GemmRecording is already in progress");
  g_recording = new std::map<AlgoKey, RecordedGemm>();
  g_recording_on = true;
}

GemmRecording::~GemmRecording() {
  std::lock_guard<std::mutex> lock(g_recording_mutex);
  g_recording_on = false;
  delete g_recording;
  g_recording = nullptr;
}

std::vector<RecordedGemm> GemmRecording::problems() const {
  std::lock_guard<std::mutex> lock(g_recording_mutex);
  std::vector<RecordedGemm> out;
  for (const auto& [key, problem] : *g_recording) out.push_back(problem);
  return out;
}

bool try_gemm(const GemmArgs& g, int device, cudaStream_t stream) {
  RF_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0 && g.batch >= 1, describe(g), ": bad sizes");
  if (g.m == 0 || g.n == 0) return true;
  DeviceContext& ctx = context(device);
  DeviceGuard guard(device);
  LtProblem p;
  build_problem(p, g, device);
  const std::optional<cublasLtMatmulAlgo_t> algo = chosen_algorithm(ctx, p, g, device, stream);
  if (!algo) return false;
  cublasStatus_t status = run_algorithm(ctx, p, g, *algo, stream);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) {
    const std::optional<cublasLtMatmulAlgo_t> other = forget_algorithm(ctx, p, g, *algo);
    if (!other) return false;
    status = run_algorithm(ctx, p, g, *other, stream);
    if (status == CUBLAS_STATUS_NOT_SUPPORTED) {
      forget_algorithm(ctx, p, g, *other);
      return false;
    }
  }
  check_status(status, "cublasLtMatmul", __FILE__, __LINE__);
  record(p, g);
  return true;
}

std::optional<std::array<uint64_t, 8>> gemm_algorithm_for(const GemmArgs& g, int device,
                                                          cudaStream_t stream) {
  RF_CHECK(g.m > 0 && g.n > 0 && g.k >= 0 && g.batch >= 1, describe(g), ": bad sizes");
  DeviceContext& ctx = context(device);
  DeviceGuard guard(device);
  LtProblem p;
  build_problem(p, g, device);
  const std::optional<cublasLtMatmulAlgo_t> algo = chosen_algorithm(ctx, p, g, device, stream);
  if (!algo) return std::nullopt;
  return bytes_of(*algo);
}

std::vector<GemmCandidate> time_gemm_candidates(const GemmArgs& g, int device, cudaStream_t stream,
                                                int candidates, int repeats) {
  RF_CHECK(candidates >= 1 && repeats >= 1, describe(g),
           ": timing takes at least one candidate and one run");
  RF_CHECK(g.m > 0 && g.n > 0 && g.k >= 0 && g.batch >= 1, describe(g), ": bad sizes to time");
  DeviceContext& ctx = context(device);
  DeviceGuard guard(device);
  LtProblem p;
  build_problem(p, g, device);
  // Rank 0 is gemm's own choice (the cached first answer, or the table's
  // timed one), then the other answers of a longer list, each once.
  const std::optional<cublasLtMatmulAlgo_t> chosen = chosen_algorithm(ctx, p, g, device, stream);
  if (!chosen) return {};
  const std::vector<cublasLtMatmulHeuristicResult_t> answers =
      heuristic_answers(ctx, p, g, candidates);
  const std::vector<cublasLtMatmulAlgo_t> algos =
      candidate_algorithms(*chosen, answers, candidates);
  std::vector<GemmCandidate> out;
  for (size_t rank = 0; rank < algos.size(); ++rank) {
    const std::optional<double> ms = time_algorithm(ctx, p, g, algos[rank], stream, repeats);
    if (!ms) continue;  // an answer the library then refuses is left out
    GemmCandidate c;
    c.rank = int(rank);
    c.ms = *ms;
    // The heuristic's own estimates, where this algorithm is one of its answers.
    for (const auto& answer : answers)
      if (same_algorithm(answer.algo, algos[rank])) {
        c.workspace = answer.workspaceSize;
        c.waves = answer.wavesCount;
      }
    out.push_back(c);
  }
  return out;
}

}  // namespace roformer::cuda
