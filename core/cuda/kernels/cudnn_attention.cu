// The list's padded attention through cuDNN SDPA: the key mask becomes the
// per-sequence lengths cuDNN's padding mask takes (checked to be a prefix),
// operands and results that are not bf16 go through bf16 scratch, and the
// geometry (sizes, strides) goes to core/cuda/cudnn_sdpa.
#include <memory>

#include "core/cuda/cudnn_sdpa.h"
#include "core/cuda/kernels/common.cuh"
#include "core/cuda/kernels/cudnn_attention.h"

namespace roformer::kernels::cuda {

namespace {

// One block per sequence b: seq_q[b] = Sq; seq_kv[b] = the kept keys of
// mask row b (all Sk without a mask); the first kept key at or past that
// count (a kept key after a masked one) goes to `first` as b * Sk + j.
template <class M>
__global__ void mask_lengths_kernel(const M* mask, int64_t mask_stride_b, int64_t mask_stride_k,
                                    int64_t sq, int64_t sk, int32_t* seq_q, int32_t* seq_kv,
                                    unsigned long long* first) {
  __shared__ int64_t shared[32];
  const int64_t b = blockIdx.x;
  if (!mask) {
    if (threadIdx.x == 0) seq_q[b] = int32_t(sq), seq_kv[b] = int32_t(sk);
    return;
  }
  auto kept = [&](int64_t j) {
    return convert<float>(mask[b * mask_stride_b + j * mask_stride_k]) != 0.0f;
  };
  int64_t count = 0;
  for (int64_t j = threadIdx.x; j < sk; j += blockDim.x) count += kept(j) ? 1 : 0;
  count = block_sum(count, shared);
  if (threadIdx.x == 0) seq_q[b] = int32_t(sq), seq_kv[b] = int32_t(count);
  for (int64_t j = count + threadIdx.x; j < sk; j += blockDim.x)
    if (kept(j)) atomicMin(first, static_cast<unsigned long long>(b * sk + j));
}

// seq_q and seq_kv [B] i32 in scratch, for a mask [B, Sk] or none.
struct Lengths {
  std::unique_ptr<Scratch> memory;
  int32_t* seq_q = nullptr;
  int32_t* seq_kv = nullptr;

  Lengths(Stream stream, const AttentionParams& params, const KernelTensor& key_mask, int64_t B,
          int64_t Sq, int64_t Sk) {
    memory = std::make_unique<Scratch>(stream, size_t(2 * B) * sizeof(int32_t) + 8);
    seq_q = memory->as<int32_t>();
    seq_kv = seq_q + B;
    Scratch first(stream, sizeof(unsigned long long));
    RF_CUDA_CHECK(
        cudaMemsetAsync(first.as<void>(), 0xff, sizeof(unsigned long long), native(stream)));
    if (!key_mask.defined()) {
      RF_LAUNCH((mask_lengths_kernel<int32_t>), unsigned(B), 32, 0, native(stream), nullptr, 0, 0,
                Sq, Sk, seq_q, seq_kv, first.as<unsigned long long>());
      return;
    }
    on_any_dtype(key_mask.dtype, [&](auto tag) {
      using M = decltype(tag);
      RF_LAUNCH((mask_lengths_kernel<M>), unsigned(B), kThreads, 0, native(stream),
                key_mask.as<const M>(), key_mask.strides[0], key_mask.strides[1], Sq, Sk, seq_q,
                seq_kv, first.as<unsigned long long>());
    });
    // The report's value: the row's count (a [B, Sk] view of seq_kv that
    // repeats it along the keys).
    KernelTensor counts;
    counts.data = seq_kv;
    counts.dtype = DType::i32;
    counts.ndim = 2;
    counts.sizes[0] = B, counts.sizes[1] = Sk;
    counts.strides[0] = 1, counts.strides[1] = 0;
    report_first_bad(stream, params.mask_site, first.as<const unsigned long long>(), counts);
  }
};

// A bf16 tensor for cuDNN: `t` itself when bf16, else a bf16 scratch copy
// (inputs: filled now; outputs: written back by store()).
struct Bf16View {
  std::unique_ptr<Scratch> memory;
  KernelTensor tensor;
  KernelTensor target;

  Bf16View(Stream stream, const KernelTensor& t, bool input) : tensor(t), target(t) {
    if (t.dtype == DType::bf16) return;
    memory = std::make_unique<Scratch>(stream, size_t(t.numel() > 0 ? t.numel() : 1) * 2);
    tensor = contiguous_like(t, memory->as<void>(), DType::bf16);
    if (input) copy(stream, t, tensor);
  }
  void store(Stream stream) const {
    if (memory) copy(stream, tensor, target);
  }
};

std::array<int64_t, 4> strides_of(const KernelTensor& t, const char* name) {
  RF_CHECK(t.ndim == 4 && t.strides[3] == 1, "cuDNN attention: ", name,
           " must be [B, H, S, D] with a unit last stride");
  return {t.strides[0], t.strides[1], t.strides[2], t.strides[3]};
}

::roformer::cuda::SdpaGeometry geometry_of(const KernelTensor& q, const KernelTensor& k,
                                           const KernelTensor& v) {
  RF_CHECK(q.dtype == DType::bf16 && k.dtype == DType::bf16 && v.dtype == DType::bf16,
           "cuDNN attention: q, k and v must be bf16");
  RF_CHECK(v.sizes[3] == q.sizes[3], "cuDNN attention: v's head dim must be q's");
  ::roformer::cuda::SdpaGeometry g;
  g.batch = q.sizes[0], g.heads = q.sizes[1], g.seq_q = q.sizes[2], g.seq_kv = k.sizes[2];
  g.head_dim = q.sizes[3];
  using ::roformer::cuda::SdpaTensor;
  g.stride(SdpaTensor::q) = strides_of(q, "q");
  g.stride(SdpaTensor::k) = strides_of(k, "k");
  g.stride(SdpaTensor::v) = strides_of(v, "v");
  return g;
}

void check_stats(const AttentionParams& params, const KernelTensor& lse) {
  RF_CHECK(params.dropout_p == 0.0, "cuDNN attention: dropout is not supported");
  RF_CHECK(lse.dtype == DType::f32 && lse.is_contiguous(),
           "cuDNN attention: lse must be contiguous f32 [B, H, Sq]");
}

}  // namespace

void cudnn_attention_forward(Stream stream, const AttentionParams& params, const KernelTensor& q,
                             const KernelTensor& k, const KernelTensor& v,
                             const KernelTensor& key_mask, const KernelTensor& out,
                             const KernelTensor& lse) {
  check_stats(params, lse);
  using ::roformer::cuda::SdpaTensor;
  ::roformer::cuda::SdpaGeometry g = geometry_of(q, k, v);
  if (g.batch * g.heads * g.seq_q == 0) return;
  const Lengths lengths(stream, params, key_mask, g.batch, g.seq_q, g.seq_kv);
  const Bf16View o(stream, out, /*input=*/false);
  g.stride(SdpaTensor::o) = strides_of(o.tensor, "out");
  ::roformer::cuda::SdpaForwardData d;
  d.q = q.data, d.k = k.data, d.v = v.data, d.o = o.tensor.data;
  d.stats = lse.as<float>();
  d.seq_len_q = lengths.seq_q, d.seq_len_kv = lengths.seq_kv;
  ::roformer::cuda::sdpa_forward(g, float(params.scale), d, stream.device_index, native(stream));
  o.store(stream);
}

void cudnn_attention_backward(Stream stream, const AttentionParams& params, const KernelTensor& q,
                              const KernelTensor& k, const KernelTensor& v,
                              const KernelTensor& key_mask, const KernelTensor& out,
                              const KernelTensor& lse, const KernelTensor& grad_out,
                              const KernelTensor& grad_q, const KernelTensor& grad_k,
                              const KernelTensor& grad_v) {
  check_stats(params, lse);
  using ::roformer::cuda::SdpaTensor;
  ::roformer::cuda::SdpaGeometry g = geometry_of(q, k, v);
  if (g.batch * g.heads * g.seq_q == 0) return;
  const Lengths lengths(stream, params, key_mask, g.batch, g.seq_q, g.seq_kv);
  const Bf16View o(stream, out, true), grad_o(stream, grad_out, true);
  const Bf16View dq(stream, grad_q, false), dk(stream, grad_k, false), dv(stream, grad_v, false);
  g.stride(SdpaTensor::o) = strides_of(o.tensor, "out");
  g.stride(SdpaTensor::grad_o) = strides_of(grad_o.tensor, "grad_out");
  g.stride(SdpaTensor::grad_q) = strides_of(dq.tensor, "grad_q");
  g.stride(SdpaTensor::grad_k) = strides_of(dk.tensor, "grad_k");
  g.stride(SdpaTensor::grad_v) = strides_of(dv.tensor, "grad_v");
  ::roformer::cuda::SdpaBackwardData d;
  d.q = q.data, d.k = k.data, d.v = v.data, d.o = o.tensor.data, d.grad_o = grad_o.tensor.data;
  d.stats = lse.as<const float>();
  d.seq_len_q = lengths.seq_q, d.seq_len_kv = lengths.seq_kv;
  d.grad_q = dq.tensor.data, d.grad_k = dk.tensor.data, d.grad_v = dv.tensor.data;
  ::roformer::cuda::sdpa_backward(g, float(params.scale), d, stream.device_index, native(stream));
  dq.store(stream);
  dk.store(stream);
  dv.store(stream);
}

}  // namespace roformer::kernels::cuda
