#include "core/cuda/cudnn_sdpa.h"

#include <cudnn.h>

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "core/cuda/backend.h"
#include "core/cuda/check_cudnn.h"
#include "core/cuda/cudnn_library.h"
#include "core/error.h"

namespace roformer::cuda {

std::string SdpaGeometry::desc() const {
  return detail::concat("B=", batch, " H=", heads, " Sq=", seq_q, " Skv=", seq_kv, " D=", head_dim);
}

namespace {

// cuDNN's last error message (it says why a call failed), or "".
std::string last_cudnn_message() {
  char message[1024] = {0};
  cudnn_library().cudnnGetLastErrorString(message, sizeof(message));
  return message;
}

// A failed cuDNN call: the function called (the call's text up to its
// arguments), what it was for, cuDNN's status and its last error message.
[[noreturn]] void throw_cudnn(cudnnStatus_t status, const std::string& call,
                              const std::string& what, const char* file, int line) {
  // The call's text up to its arguments, without "cudnn_library().".
  std::string function = call.substr(0, call.find('('));
  function = function.substr(function.rfind('.') + 1);
  const std::string name = detail::concat(function, " (", what, ")");
  const std::string message = last_cudnn_message();
  const std::string text = detail::concat(cudnn_library().cudnnGetErrorString(status),
                                          message.empty() ? "" : ": ", message);
  throw_call_error("cuDNN", name.c_str(), text.c_str(), file, line);
}

#define RF_CUDNN_CALL(call, what)                                                               \
  do {                                                                                          \
    const cudnnStatus_t status_ = (call);                                                       \
    if (status_ != CUDNN_STATUS_SUCCESS) throw_cudnn(status_, #call, what, __FILE__, __LINE__); \
  } while (0)

// One backend descriptor, destroyed with its owner.
class Descriptor {
 public:
  Descriptor(cudnnBackendDescriptorType_t type, std::string what) : what_(std::move(what)) {
    RF_CUDNN_CALL(cudnn_library().cudnnBackendCreateDescriptor(type, &desc_), what_);
  }
  ~Descriptor() {
    if (desc_) cudnn_library().cudnnBackendDestroyDescriptor(desc_);
  }
  Descriptor(Descriptor&& other) noexcept
      : desc_(std::exchange(other.desc_, nullptr)), what_(std::move(other.what_)) {}
  Descriptor& operator=(Descriptor&& other) noexcept {
    if (this != &other) {
      if (desc_) cudnn_library().cudnnBackendDestroyDescriptor(desc_);
      desc_ = std::exchange(other.desc_, nullptr);
      what_ = std::move(other.what_);
    }
    return *this;
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;

  cudnnBackendDescriptor_t get() const { return desc_; }
  const std::string& what() const { return what_; }

  template <class T>
  Descriptor& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                  const T* values, int64_t count = 1) {
    RF_CUDNN_CALL(cudnn_library().cudnnBackendSetAttribute(desc_, name, type, count, values),
                  what_);
    return *this;
  }
  Descriptor& set_desc(cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t value) {
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, &value);
  }
  Descriptor& finalize() {
    RF_CUDNN_CALL(cudnn_library().cudnnBackendFinalize(desc_), what_);
    return *this;
  }

 private:
  cudnnBackendDescriptor_t desc_ = nullptr;
  std::string what_;
};

using Dims = std::array<int64_t, 4>;

// Unique ids of the tensors the caller supplies (the variant pack's);
// virtual tensors are numbered from kFirstVirtual.
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kSeqQ,
  kSeqKv,
  kScale,
  kNegInf,
  kOne,
  kGradO,
  kGradQ,
  kGradK,
  kGradV,
  kSoftmaxSum,  // backward scratch: rowsum(grad_o * o), f32 [B, H, Sq, 1]
  kGradQAccum,  // backward scratch: grad_q in f32 [B, H, Sq, D]
  kFirstVirtual = 100
};

// The tensors and operations of one graph, built with cuDNN's names.
class GraphBuilder {
 public:
  using T = cudnnBackendDescriptor_t;

  T tensor(const char* name, Dims dims, Dims strides, cudnnDataType_t type, int64_t uid) {
    return add_tensor(name, dims, strides, type, uid, false, false);
  }
  T virtual_tensor(const char* name, Dims dims, Dims strides,
                   cudnnDataType_t type = CUDNN_DATA_FLOAT) {
    return add_tensor(name, dims, strides, type, next_virtual_++, true, false);
  }
  // A scalar passed by value in the variant pack (host memory).
  T scalar(const char* name, cudnnDataType_t type, int64_t uid) {
    return add_tensor(name, {1, 1, 1, 1}, {1, 1, 1, 1}, type, uid, false, true);
  }

  // y = mode(x[, b[, t]]); GEN_INDEX takes `axis`.
  void pointwise(const char* name, cudnnPointwiseMode_t mode, T x, T b, T t, T y,
                 cudnnDataType_t compute = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    Descriptor pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, detail::concat("pointwise ", name));
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, &mode);
    pw.set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, &compute);
    if (axis >= 0) pw.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, &axis);
    pw.finalize();
    Descriptor op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, detail::concat("operation ", name));
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw.get());
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    if (t) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    op.finalize();
    keep_.push_back(std::move(pw));
    ops_.push_back(std::move(op));
  }

  // c = a b per batch entry; the overrides give the valid rows (m), columns
  // (n) or inner length (k) per sequence; `padding`: the value of c outside them.
  void matmul(const char* name, T a, T b, T c, T m_override, T n_override, T k_override,
              bool padded) {
    Descriptor mm(CUDNN_BACKEND_MATMUL_DESCRIPTOR, detail::concat("matmul ", name));
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    mm.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &compute);
    if (padded) {
      const double zero = 0.0;
      mm.set(CUDNN_ATTR_MATMUL_PADDING_VALUE, CUDNN_TYPE_DOUBLE, &zero);
    }
    mm.finalize();
    Descriptor op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, detail::concat("operation ", name));
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, mm.get());
    if (m_override) op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, m_override);
    if (n_override) op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, n_override);
    if (k_override) op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, k_override);
    op.finalize();
    keep_.push_back(std::move(mm));
    ops_.push_back(std::move(op));
  }

  // y = reduce(x) over the dimensions where y has size 1.
  void reduction(const char* name, cudnnReduceTensorOp_t mode, T x, T y) {
    Descriptor red(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, detail::concat("reduction ", name));
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    red.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &mode);
    red.set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &compute);
    red.finalize();
    Descriptor op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, detail::concat("operation ", name));
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, red.get());
    op.finalize();
    keep_.push_back(std::move(red));
    ops_.push_back(std::move(op));
  }

  // y: x seen with other dimensions and strides (a transpose here).
  void reshape(const char* name, T x, T y) {
    Descriptor op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, detail::concat("operation ", name));
    op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    op.finalize();
    ops_.push_back(std::move(op));
  }

  int operation_count() const { return int(ops_.size()); }

  // The operation graph on `handle`.
  Descriptor graph(cudnnHandle_t handle) const {
    std::vector<cudnnBackendDescriptor_t> ops;
    for (const Descriptor& op : ops_) ops.push_back(op.get());
    Descriptor g(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    g.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &handle);
    g.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ops.data(),
          int64_t(ops.size()));
    g.finalize();
    return g;
  }

 private:
  T add_tensor(const char* name, Dims dims, Dims strides, cudnnDataType_t type, int64_t uid,
               bool is_virtual, bool by_value) {
    Descriptor t(CUDNN_BACKEND_TENSOR_DESCRIPTOR,
                 detail::concat("tensor ", name, " [", dims[0], ", ", dims[1], ", ", dims[2], ", ",
                                dims[3], "] strides [", strides[0], ", ", strides[1], ", ",
                                strides[2], ", ", strides[3], "]"));
    const int64_t alignment = 16;
    t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &type);
    t.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims.data(), 4);
    t.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, strides.data(), 4);
    t.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &uid);
    t.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &alignment);
    if (is_virtual) t.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, &is_virtual);
    if (by_value) t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, &by_value);
    t.finalize();
    tensors_.push_back(std::move(t));
    return tensors_.back().get();
  }

  std::vector<Descriptor> tensors_, keep_, ops_;
  int64_t next_virtual_ = kFirstVirtual;
};

// What both graphs share: the problem's sizes and tensors of common shapes.
struct Shapes {
  int64_t b, h, sq, skv, d;
  explicit Shapes(const SdpaGeometry& g)
      : b(g.batch), h(g.heads), sq(g.seq_q), skv(g.seq_kv), d(g.head_dim) {}
  Dims scores() const { return {b, h, sq, skv}; }
  Dims scores_strides() const { return {h * sq * skv, sq * skv, skv, 1}; }
  // The scores seen transposed: [B, H, Skv, Sq] over the same layout.
  Dims scores_t() const { return {b, h, skv, sq}; }
  Dims scores_t_strides() const { return {h * sq * skv, sq * skv, 1, skv}; }
  Dims rows() const { return {b, h, sq, 1}; }
  Dims rows_strides() const { return {h * sq, sq, 1, 1}; }
};

Dims dims_of(int64_t b, int64_t h, int64_t s, int64_t d) {
  return {b, h, s, d};
}
// [B, H, S, D] strides seen as [B, H, D, S] (the transpose the engine reads k and v as).
Dims transposed(const Dims& s) {
  return {s[0], s[1], s[3], s[2]};
}

// scores -> scores with -inf where the row is at or past seq_len_q or the
// column at or past seq_len_kv (the padding mask the engine recognises).
GraphBuilder::T padding_mask(GraphBuilder& g, const Shapes& s, GraphBuilder::T scores,
                             GraphBuilder::T seq_q, GraphBuilder::T seq_kv,
                             GraphBuilder::T neg_inf) {
  auto index = [&](const char* name, int64_t axis) {
    GraphBuilder::T out = g.virtual_tensor(name, s.scores(), s.scores_strides(), CUDNN_DATA_INT32);
    g.pointwise(name, CUDNN_POINTWISE_GEN_INDEX, scores, nullptr, nullptr, out, CUDNN_DATA_INT32,
                axis);
    return out;
  };
  auto compare = [&](const char* name, cudnnPointwiseMode_t mode, GraphBuilder::T a,
                     GraphBuilder::T b) {
    GraphBuilder::T out =
        g.virtual_tensor(name, s.scores(), s.scores_strides(), CUDNN_DATA_BOOLEAN);
    g.pointwise(name, mode, a, b, nullptr, out, CUDNN_DATA_BOOLEAN);
    return out;
  };
  const GraphBuilder::T row = index("row_index", 2), col = index("col_index", 3);
  const GraphBuilder::T keep = compare("row_col_valid", CUDNN_POINTWISE_LOGICAL_AND,
                                       compare("row_valid", CUDNN_POINTWISE_CMP_LT, row, seq_q),
                                       compare("col_valid", CUDNN_POINTWISE_CMP_LT, col, seq_kv));
  const GraphBuilder::T masked = g.virtual_tensor("masked_scores", s.scores(), s.scores_strides());
  g.pointwise("select_padding", CUDNN_POINTWISE_BINARY_SELECT, scores, neg_inf, keep, masked);
  return masked;
}

// The inputs both graphs take: the lengths and the by-value scalars.
struct Common {
  GraphBuilder::T seq_q, seq_kv, scale, neg_inf;
};
Common common_inputs(GraphBuilder& g, const Shapes& s) {
  Common c;
  c.seq_q = g.tensor("seq_len_q", {s.b, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_INT32, kSeqQ);
  c.seq_kv = g.tensor("seq_len_kv", {s.b, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_INT32, kSeqKv);
  c.scale = g.scalar("attn_scale", CUDNN_DATA_FLOAT, kScale);
  c.neg_inf = g.scalar("negative_infinity", CUDNN_DATA_FLOAT, kNegInf);
  return c;
}

// Scaled, masked scores q k^T * scale; kt is k seen as [B, H, D, Skv].
GraphBuilder::T masked_scores(GraphBuilder& g, const Shapes& s, const Common& c, GraphBuilder::T q,
                              GraphBuilder::T kt, bool padded) {
  const GraphBuilder::T raw = g.virtual_tensor("scores", s.scores(), s.scores_strides());
  g.matmul("q_kt", q, kt, raw, c.seq_q, c.seq_kv, nullptr, padded);
  const GraphBuilder::T scaled = g.virtual_tensor("scaled_scores", s.scores(), s.scores_strides());
  g.pointwise("attn_scale", CUDNN_POINTWISE_MUL, raw, c.scale, nullptr, scaled);
  return padding_mask(g, s, scaled, c.seq_q, c.seq_kv, c.neg_inf);
}

// Forward: o = softmax(mask(q k^T * scale)) v, stats = the rows' log-sum-exp.
void build_forward(GraphBuilder& g, const SdpaGeometry& geo) {
  const Shapes s(geo);
  const cudnnDataType_t io = CUDNN_DATA_BFLOAT16;
  const GraphBuilder::T q =
      g.tensor("q", dims_of(s.b, s.h, s.sq, s.d), geo.stride(SdpaTensor::q), io, kQ);
  const GraphBuilder::T kt =
      g.tensor("k", dims_of(s.b, s.h, s.d, s.skv), transposed(geo.stride(SdpaTensor::k)), io, kK);
  const GraphBuilder::T v =
      g.tensor("v", dims_of(s.b, s.h, s.skv, s.d), geo.stride(SdpaTensor::v), io, kV);
  const GraphBuilder::T o =
      g.tensor("o", dims_of(s.b, s.h, s.sq, s.d), geo.stride(SdpaTensor::o), io, kO);
  const GraphBuilder::T stats =
      g.tensor("stats", s.rows(), s.rows_strides(), CUDNN_DATA_FLOAT, kStats);
  const Common c = common_inputs(g, s);
  const GraphBuilder::T scores = masked_scores(g, s, c, q, kt, /*padded=*/true);

  // Softmax as the engine's pattern: max, subtract, exp, sum, log + max, divide.
  const GraphBuilder::T row_max = g.virtual_tensor("row_max", s.rows(), s.rows_strides());
  g.reduction("row_max", CUDNN_REDUCE_TENSOR_MAX, scores, row_max);
  const GraphBuilder::T shifted = g.virtual_tensor("shifted", s.scores(), s.scores_strides());
  g.pointwise("sub_max", CUDNN_POINTWISE_SUB, scores, row_max, nullptr, shifted);
  const GraphBuilder::T exps = g.virtual_tensor("exp", s.scores(), s.scores_strides());
  g.pointwise("exp", CUDNN_POINTWISE_EXP, shifted, nullptr, nullptr, exps);
  const GraphBuilder::T row_sum = g.virtual_tensor("row_sum", s.rows(), s.rows_strides());
  g.reduction("row_sum", CUDNN_REDUCE_TENSOR_ADD, exps, row_sum);
  const GraphBuilder::T log_sum = g.virtual_tensor("log_sum", s.rows(), s.rows_strides());
  g.pointwise("log", CUDNN_POINTWISE_LOG, row_sum, nullptr, nullptr, log_sum);
  g.pointwise("stats", CUDNN_POINTWISE_ADD, row_max, log_sum, nullptr, stats);
  // The probabilities in the i/o type: the engine's second product reads them so.
  const GraphBuilder::T probs = g.virtual_tensor("probs", s.scores(), s.scores_strides(), io);
  g.pointwise("div_sum", CUDNN_POINTWISE_DIV, exps, row_sum, nullptr, probs);
  g.matmul("probs_v", probs, v, o, c.seq_q, nullptr, c.seq_kv, false);
}

// Backward: with P = exp(scores - stats) and D = rowsum(grad_o * o),
// grad_v = P^T grad_o, dS = P (grad_o v^T - D) * scale, grad_q = dS k,
// grad_k = dS^T q (grad_q accumulated in f32 scratch).
void build_backward(GraphBuilder& g, const SdpaGeometry& geo) {
  const Shapes s(geo);
  const cudnnDataType_t io = CUDNN_DATA_BFLOAT16;
  const Dims q_dims = dims_of(s.b, s.h, s.sq, s.d), kv_dims = dims_of(s.b, s.h, s.skv, s.d);
  const Dims kv_t_dims = dims_of(s.b, s.h, s.d, s.skv);
  const GraphBuilder::T q = g.tensor("q", q_dims, geo.stride(SdpaTensor::q), io, kQ);
  const GraphBuilder::T kt =
      g.tensor("k", kv_t_dims, transposed(geo.stride(SdpaTensor::k)), io, kK);
  const GraphBuilder::T vt =
      g.tensor("v", kv_t_dims, transposed(geo.stride(SdpaTensor::v)), io, kV);
  const GraphBuilder::T o = g.tensor("o", q_dims, geo.stride(SdpaTensor::o), io, kO);
  const GraphBuilder::T grad_o =
      g.tensor("grad_o", q_dims, geo.stride(SdpaTensor::grad_o), io, kGradO);
  const GraphBuilder::T stats =
      g.tensor("stats", s.rows(), s.rows_strides(), CUDNN_DATA_FLOAT, kStats);
  const GraphBuilder::T grad_q =
      g.tensor("grad_q", q_dims, geo.stride(SdpaTensor::grad_q), io, kGradQ);
  const GraphBuilder::T grad_k =
      g.tensor("grad_k", kv_dims, geo.stride(SdpaTensor::grad_k), io, kGradK);
  const GraphBuilder::T grad_v =
      g.tensor("grad_v", kv_dims, geo.stride(SdpaTensor::grad_v), io, kGradV);
  const Common c = common_inputs(g, s);
  const GraphBuilder::T one = g.scalar("one", CUDNN_DATA_FLOAT, kOne);

  // D = rowsum(grad_o * o), kept in f32 scratch.
  const GraphBuilder::T prod =
      g.virtual_tensor("grad_o_o", q_dims, {s.h * s.sq * s.d, s.sq * s.d, s.h * s.d, 1});
  g.pointwise("mul_grad_o_o", CUDNN_POINTWISE_MUL, grad_o, o, nullptr, prod);
  const GraphBuilder::T row_dot = g.virtual_tensor("row_dot", s.rows(), s.rows_strides());
  g.reduction("row_dot", CUDNN_REDUCE_TENSOR_ADD, prod, row_dot);
  const GraphBuilder::T softmax_sum =
      g.tensor("softmax_sum", s.rows(), s.rows_strides(), CUDNN_DATA_FLOAT, kSoftmaxSum);
  g.pointwise("softmax_sum", CUDNN_POINTWISE_MUL, row_dot, one, nullptr, softmax_sum);

  // P recomputed from the statistics.
  const GraphBuilder::T scores = masked_scores(g, s, c, q, kt, /*padded=*/false);
  const GraphBuilder::T shifted = g.virtual_tensor("shifted", s.scores(), s.scores_strides());
  g.pointwise("sub_stats", CUDNN_POINTWISE_SUB, scores, stats, nullptr, shifted);
  const GraphBuilder::T probs = g.virtual_tensor("probs", s.scores(), s.scores_strides());
  g.pointwise("exp", CUDNN_POINTWISE_EXP, shifted, nullptr, nullptr, probs);

  // grad_v = P^T grad_o.
  const GraphBuilder::T probs_t =
      g.virtual_tensor("probs_t", s.scores_t(), s.scores_t_strides(), io);
  g.reshape("probs_t", probs, probs_t);
  g.matmul("probs_t_grad_o", probs_t, grad_o, grad_v, c.seq_kv, nullptr, c.seq_q, false);

  // dS = P (grad_o v^T - D) * scale.
  const GraphBuilder::T grad_p = g.virtual_tensor("grad_p", s.scores(), s.scores_strides());
  g.matmul("grad_o_vt", grad_o, vt, grad_p, c.seq_q, c.seq_kv, nullptr, false);
  const GraphBuilder::T centred =
      g.virtual_tensor("grad_p_centred", s.scores(), s.scores_strides());
  g.pointwise("sub_softmax_sum", CUDNN_POINTWISE_SUB, grad_p, softmax_sum, nullptr, centred);
  const GraphBuilder::T grad_s0 =
      g.virtual_tensor("grad_s_unscaled", s.scores(), s.scores_strides());
  g.pointwise("mul_probs", CUDNN_POINTWISE_MUL, centred, probs, nullptr, grad_s0);
  const GraphBuilder::T grad_s = g.virtual_tensor("grad_s", s.scores(), s.scores_strides());
  g.pointwise("mul_grad_s_scale", CUDNN_POINTWISE_MUL, grad_s0, c.scale, nullptr, grad_s);

  // grad_k = dS^T q.
  const GraphBuilder::T grad_s_t =
      g.virtual_tensor("grad_s_t", s.scores_t(), s.scores_t_strides(), io);
  g.reshape("grad_s_t", grad_s, grad_s_t);
  g.matmul("grad_s_t_q", grad_s_t, q, grad_k, c.seq_kv, nullptr, c.seq_q, false);

  // grad_q = dS k, accumulated in f32, then converted. (The view of k is
  // typed as an intermediate, f32, as cudnn_frontend types it.)
  const GraphBuilder::T k = g.virtual_tensor("k_untransposed", kv_dims, geo.stride(SdpaTensor::k));
  g.reshape("k_untransposed", kt, k);
  const GraphBuilder::T accum =
      g.tensor("grad_q_accum", q_dims, {s.h * s.sq * s.d, s.sq * s.d, s.d, 1}, CUDNN_DATA_FLOAT,
               kGradQAccum);
  g.matmul("grad_s_k", grad_s, k, accum, c.seq_q, nullptr, c.seq_kv, false);
  g.pointwise("grad_q", CUDNN_POINTWISE_IDENTITY, accum, nullptr, nullptr, grad_q);
}

void build(GraphBuilder& g, const SdpaGeometry& geo, bool backward) {
  if (geo.batch <= 0 || geo.heads <= 0 || geo.seq_q <= 0 || geo.seq_kv <= 0 || geo.head_dim <= 0)
    throw Error(detail::concat("cuDNN SDPA: empty or negative shape ", geo.desc()));
  if (backward) {
    build_backward(g, geo);
  } else {
    build_forward(g, geo);
  }
}

// --- handles, plans and their cache -------------------------------------------------

struct ReleaseCudnn {
  void operator()(cudnnHandle_t h) const { cudnn_library().cudnnDestroy(h); }
};
using CudnnHandle = UniqueHandle<cudnnHandle_t, ReleaseCudnn>;

// A finalized execution plan with the graph it was built from.
struct Plan {
  GraphBuilder builder;
  std::unique_ptr<Descriptor> graph;
  std::unique_ptr<Descriptor> plan;
  int64_t workspace = 0;
};

// The engine configurations cuDNN's heuristics rank for `graph`, best first.
std::vector<Descriptor> engine_configs(const Descriptor& graph) {
  Descriptor heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "engine heuristics");
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph.get());
  heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode);
  heur.finalize();
  int64_t count = 0;
  RF_CUDNN_CALL(
      cudnn_library().cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
      "engine heuristics: count");
  std::vector<Descriptor> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, detail::concat("engine config ", i));
    raw.push_back(configs.back().get());
  }
  int64_t got = 0;
  if (count > 0)
    RF_CUDNN_CALL(cudnn_library().cudnnBackendGetAttribute(
                      heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                      count, &got, raw.data()),
                  "engine heuristics: results");
  configs.erase(configs.begin() + std::min(got, count), configs.end());
  return configs;
}

std::unique_ptr<Plan> make_plan(cudnnHandle_t handle, const SdpaGeometry& geo, bool backward) {
  auto p = std::make_unique<Plan>();
  build(p->builder, geo, backward);
  const char* direction = backward ? "backward" : "forward";
  std::vector<Descriptor> configs;
  try {
    p->graph = std::make_unique<Descriptor>(p->builder.graph(handle));
    configs = engine_configs(*p->graph);
  } catch (const Error& e) {
    throw Error(detail::concat("cuDNN SDPA ", direction, " for ", geo.desc(),
                               " (bf16): cuDNN does not take the graph: ", e.what()));
  }
  std::string why = "the heuristics returned no engine";
  if (configs.empty()) {
    const std::string message = last_cudnn_message();
    if (!message.empty()) why += ": " + message;
  }
  for (Descriptor& config : configs) {
    try {
      auto plan = std::make_unique<Descriptor>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR,
                                               detail::concat("execution plan ", direction));
      plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &handle);
      plan->set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config.get());
      plan->finalize();
      RF_CUDNN_CALL(cudnn_library().cudnnBackendGetAttribute(
                        plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                        nullptr, &p->workspace),
                    "execution plan workspace size");
      p->plan = std::move(plan);
      return p;
    } catch (const Error& e) {
      why = e.what();  // the next engine may take it
    }
  }
  throw Error(detail::concat("cuDNN SDPA ", direction, ": no engine for ", geo.desc(),
                             " (bf16, head dim ", geo.head_dim, "): ", why));
}

struct DeviceState {
  CudnnHandle handle;
  // By direction and geometry (the scale goes by value in the variant pack).
  std::map<std::pair<bool, std::vector<int64_t>>, std::unique_ptr<Plan>> plans;
};

// The key of a geometry: its sizes and strides.
std::vector<int64_t> geometry_key(const SdpaGeometry& g) {
  std::vector<int64_t> key = {g.batch, g.heads, g.seq_q, g.seq_kv, g.head_dim};
  for (const auto& s : g.strides) key.insert(key.end(), s.begin(), s.end());
  return key;
}

std::mutex& state_mutex() {
  static std::mutex m;
  return m;
}

DeviceState& device_state(int device) {
  static auto* states = new std::map<int, std::unique_ptr<DeviceState>>();
  auto& slot = (*states)[device];
  if (!slot) {
    DeviceGuard guard(device);
    cudnnHandle_t h = nullptr;
    RF_CUDNN_CALL(cudnn_library().cudnnCreate(&h), detail::concat("device ", device));
    slot = std::make_unique<DeviceState>();
    slot->handle = CudnnHandle(h);
  }
  return *slot;
}

// Runs the plan of (geometry, direction, scale) with the variant pack's
// pointers by uid (scalars by value: host pointers).
void execute(const SdpaGeometry& geo, bool backward, float scale,
             std::vector<std::pair<int64_t, void*>> pointers, int device, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(state_mutex());
  DeviceGuard guard(device);
  DeviceState& state = device_state(device);
  auto& plan = state.plans[{backward, geometry_key(geo)}];
  if (!plan) plan = make_plan(state.handle.get(), geo, backward);

  float scale_value = scale, neg_inf = -std::numeric_limits<float>::infinity(), one = 1.0f;
  pointers.emplace_back(kScale, &scale_value);
  pointers.emplace_back(kNegInf, &neg_inf);
  if (backward) pointers.emplace_back(kOne, &one);
  const StreamMemory workspace(device, stream, size_t(plan->workspace));
  std::vector<int64_t> uids;
  std::vector<void*> data;
  for (const auto& [uid, ptr] : pointers) {
    uids.push_back(uid);
    data.push_back(ptr);
  }
  void* workspace_ptr = workspace.get();
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "variant pack");
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids.data(), int64_t(uids.size()));
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, data.data(),
           int64_t(data.size()));
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &workspace_ptr);
  pack.finalize();
  RF_CUDNN_CALL(cudnn_library().cudnnSetStream(state.handle.get(), stream), "SDPA stream");
  RF_CUDNN_CALL(
      cudnn_library().cudnnBackendExecute(state.handle.get(), plan->plan->get(), pack.get()),
      detail::concat(backward ? "SDPA backward " : "SDPA forward ", geo.desc()));
}

}  // namespace

void sdpa_forward(const SdpaGeometry& geometry, float scale, const SdpaForwardData& d, int device,
                  cudaStream_t stream) {
  execute(geometry, false, scale,
          {{kQ, const_cast<void*>(d.q)},
           {kK, const_cast<void*>(d.k)},
           {kV, const_cast<void*>(d.v)},
           {kO, d.o},
           {kStats, d.stats},
           {kSeqQ, const_cast<int32_t*>(d.seq_len_q)},
           {kSeqKv, const_cast<int32_t*>(d.seq_len_kv)}},
          device, stream);
}

void sdpa_backward(const SdpaGeometry& geometry, float scale, const SdpaBackwardData& d, int device,
                   cudaStream_t stream) {
  const size_t rows = size_t(geometry.batch * geometry.heads * geometry.seq_q);
  const StreamMemory softmax_sum(device, stream, rows * sizeof(float));
  const size_t accum_bytes = rows * size_t(geometry.head_dim) * sizeof(float);
  const StreamMemory accum(device, stream, accum_bytes);
  // cuDNN before 9.6 expected the accumulator zeroed by the caller.
  if (cudnn_library().cudnnGetVersion() < 90600)
    RF_CUDA_CHECK(cudaMemsetAsync(accum.get(), 0, accum_bytes, stream));
  execute(geometry, true, scale,
          {{kQ, const_cast<void*>(d.q)},
           {kK, const_cast<void*>(d.k)},
           {kV, const_cast<void*>(d.v)},
           {kO, const_cast<void*>(d.o)},
           {kGradO, const_cast<void*>(d.grad_o)},
           {kStats, const_cast<float*>(d.stats)},
           {kSeqQ, const_cast<int32_t*>(d.seq_len_q)},
           {kSeqKv, const_cast<int32_t*>(d.seq_len_kv)},
           {kGradQ, d.grad_q},
           {kGradK, d.grad_k},
           {kGradV, d.grad_v},
           {kSoftmaxSum, softmax_sum.get()},
           {kGradQAccum, accum.get()}},
          device, stream);
}

int sdpa_graph_operations(const SdpaGeometry& geometry, bool backward) {
  GraphBuilder g;
  build(g, geometry, backward);
  return g.operation_count();
}

}  // namespace roformer::cuda
