#include "core/cuda/gemm.h"

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
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

std::string describe(const GemmArgs& g) {
  return detail::concat("gemm ", g.batch, " x [", g.m, " x ", g.k, "]", g.trans_a ? "^T" : "",
                        " * [", g.k, " x ", g.n, "]", g.trans_b ? "^T" : "", " (",
                        dtype_name(g.input_dtype), " -> ", dtype_name(g.output_dtype),
                        g.bias ? ", bias" : "", ")");
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
  RF_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0 && g.batch >= 1, describe(g), ": bad sizes");
  if (g.m == 0 || g.n == 0) return;
  const cudaDataType_t in_type = cuda_type(g.input_dtype, "the inputs");
  const cudaDataType_t out_type = cuda_type(g.output_dtype, "the output");
  DeviceContext& ctx = context(device);
  DeviceGuard guard(device);

  const cublasComputeType_t compute = g.input_dtype == DType::f32 && g.allow_tf32
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  MatmulDesc op;
  RF_CUDA_CHECK(cublasLtMatmulDescCreate(&op.h, compute, CUDA_R_32F));
  // Column-major view: D^T[N x M] = X * Y with X = B's memory, Y = A's memory.
  const cublasOperation_t op_x = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_y = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  RF_CUDA_CHECK(
      cublasLtMatmulDescSetAttribute(op.h, CUBLASLT_MATMUL_DESC_TRANSA, &op_x, sizeof(op_x)));
  RF_CUDA_CHECK(
      cublasLtMatmulDescSetAttribute(op.h, CUBLASLT_MATMUL_DESC_TRANSB, &op_y, sizeof(op_y)));
  if (g.bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    RF_CUDA_CHECK(cublasLtMatmulDescSetAttribute(op.h, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                 sizeof(epilogue)));
    RF_CUDA_CHECK(cublasLtMatmulDescSetAttribute(op.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias,
                                                 sizeof(g.bias)));
    const cudaDataType_t bias_type = cuda_type(g.bias_dtype, "the bias");
    RF_CUDA_CHECK(cublasLtMatmulDescSetAttribute(op.h, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                 &bias_type, sizeof(bias_type)));
    const int64_t bias_stride = 0;  // one bias for every batch entry
    RF_CUDA_CHECK(cublasLtMatmulDescSetAttribute(op.h, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE,
                                                 &bias_stride, sizeof(bias_stride)));
  }

  LayoutDesc x, y, d;
  if (g.trans_b)
    make_layout(x, in_type, g.k, g.n, g.ldb, g.batch, g.stride_b);
  else
    make_layout(x, in_type, g.n, g.k, g.ldb, g.batch, g.stride_b);
  if (g.trans_a)
    make_layout(y, in_type, g.m, g.k, g.lda, g.batch, g.stride_a);
  else
    make_layout(y, in_type, g.k, g.m, g.lda, g.batch, g.stride_a);
  make_layout(d, out_type, g.n, g.m, g.ldc, g.batch, g.stride_c);

  const uint32_t align_a = alignment_of(g.a), align_b = alignment_of(g.b);
  const uint32_t align_c = alignment_of(g.c);
  const uint32_t align_bias = g.bias ? alignment_of(g.bias) : 256;
  const AlgoKey key{device,
                    g.m,
                    g.n,
                    g.k,
                    g.batch,
                    g.lda,
                    g.ldb,
                    g.ldc,
                    int(g.trans_a) | int(g.trans_b) << 1 | int(g.beta != 0.0f) << 2,
                    int(g.input_dtype),
                    int(g.output_dtype),
                    g.bias ? int(g.bias_dtype) : -1,
                    int(compute),
                    g.stride_a,
                    g.stride_b,
                    g.stride_c,
                    uint64_t(align_a) | uint64_t(align_b) << 9 | uint64_t(align_c) << 18 |
                        uint64_t(align_bias) << 27};
  static std::mutex cache_mutex;
  static auto* cache = new std::map<AlgoKey, cublasLtMatmulAlgo_t>();
  cublasLtMatmulAlgo_t algo;
  bool found = false;
  {
    std::lock_guard<std::mutex> lock(cache_mutex);
    auto it = cache->find(key);
    if (it != cache->end()) {
      algo = it->second;
      found = true;
    }
  }
  if (!found) {
    PreferenceDesc pref;
    RF_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&pref.h));
    const uint64_t workspace = ctx.workspace.size();
    RF_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref.h, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_b},  // X is B's memory
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c}};
    for (const auto& [attribute, value] : alignments)
      RF_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.h, attribute, &value, sizeof(value)));
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    RF_CUDA_CHECK(cublasLtMatmulAlgoGetHeuristic(ctx.handle.get(), op.h, x.h, y.h, d.h, d.h, pref.h,
                                                 1, &result, &returned));
    RF_CHECK(returned > 0, describe(g), ": cuBLASLt has no algorithm for this problem");
    algo = result.algo;
    std::lock_guard<std::mutex> lock(cache_mutex);
    (*cache)[key] = algo;
  }
  RF_CUDA_CHECK(cublasLtMatmul(ctx.handle.get(), op.h, &g.alpha, g.b, x.h, g.a, y.h, &g.beta, g.c,
                               d.h, g.c, d.h, &algo, ctx.workspace.get(), ctx.workspace.size(),
                               stream));
}

}  // namespace roformer::cuda
