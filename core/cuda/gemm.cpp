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

#include "core/cuda/raii.h"
#include "core/error.h"

namespace roformer::cuda {

namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLAS's recommendation for Hopper

// One handle and workspace per device, created on first use and kept.
struct DeviceContext {
  CublasLtHandle handle;
  DeviceMemory workspace;
};

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

void set_allow_tf32(bool allow) {
  g_allow_tf32 = allow;
}

bool allow_tf32() {
  return g_allow_tf32;
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
  uint32_t align_a = 0, align_b = 0, align_c = 0;
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
  const uint32_t align_bias = g.bias ? alignment_of(g.bias) : 256;
  // The heuristic reads the aux pointer too (for its alignment).
  const uint32_t align_aux = g.aux ? alignment_of(g.aux) : 256;
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
          uint64_t(align_bias) << 27 | uint64_t(align_aux) << 36};
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
// (asked once per problem): what gemm runs.
std::mutex g_algorithm_mutex;
auto* g_algorithms = new std::map<AlgoKey, std::optional<cublasLtMatmulAlgo_t>>();

std::optional<cublasLtMatmulAlgo_t> chosen_algorithm(const DeviceContext& ctx, const LtProblem& p,
                                                     const GemmArgs& g) {
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

// Refused when run though the heuristic offered it (seen nowhere yet; an
// epilogue is the likely case): remembered as no algorithm, so callers with
// an unfused way take it from now on.
void forget_algorithm(const LtProblem& p) {
  std::lock_guard<std::mutex> lock(g_algorithm_mutex);
  (*g_algorithms)[p.key] = std::nullopt;
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
  const std::optional<cublasLtMatmulAlgo_t> algo = chosen_algorithm(ctx, p, g);
  if (!algo) return false;
  const cublasStatus_t status = run_algorithm(ctx, p, g, *algo, stream);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) {
    forget_algorithm(p);
    return false;
  }
  check_status(status, "cublasLtMatmul", __FILE__, __LINE__);
  record(p, g);
  return true;
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
  // Rank 0 is gemm's own choice (the cached first answer), then the other
  // answers of a longer list, each once.
  std::vector<cublasLtMatmulAlgo_t> algos;
  std::vector<cublasLtMatmulHeuristicResult_t> answers = heuristic_answers(ctx, p, g, candidates);
  if (const auto chosen = chosen_algorithm(ctx, p, g)) algos.push_back(*chosen);
  for (const auto& answer : answers) {
    const bool seen = std::any_of(algos.begin(), algos.end(),
                                  [&](const auto& a) { return same_algorithm(a, answer.algo); });
    if (!seen && int(algos.size()) < candidates) algos.push_back(answer.algo);
  }
  const CudaEvent start = CudaEvent::create(true), stop = CudaEvent::create(true);
  std::vector<GemmCandidate> out;
  for (size_t rank = 0; rank < algos.size(); ++rank) {
    const cublasLtMatmulAlgo_t& algo = algos[rank];
    // One untimed run; an answer the library then refuses is left out.
    const cublasStatus_t first = run_algorithm(ctx, p, g, algo, stream);
    if (first == CUBLAS_STATUS_NOT_SUPPORTED) continue;
    check_status(first, "cublasLtMatmul", __FILE__, __LINE__);
    // `repeats` runs back to back between one pair of events (so the host's
    // launch work overlaps the device's), three times: the median average.
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
    GemmCandidate c;
    c.rank = int(rank);
    c.ms = ms[1];
    // The heuristic's own estimates, where this algorithm is one of its answers.
    for (const auto& answer : answers)
      if (same_algorithm(answer.algo, algo)) {
        c.workspace = answer.workspaceSize;
        c.waves = answer.wavesCount;
      }
    out.push_back(c);
  }
  return out;
}

}  // namespace roformer::cuda
