// cuDNN's fused scaled-dot-product attention (its flash-attention engine),
// built through the backend graph API (cudnn_frontend is not available):
// the operation graphs the engine recognises for the forward (with the
// softmax statistics) and the backward, with a key padding mask given as
// per-sequence lengths. bf16 q, k, v, o and gradients, f32 statistics.
//
// Plans are built once per (device, direction, geometry) and kept.
// Every cuDNN call is checked: a failure throws naming the call (and the
// graph's shape when no engine takes it) with cuDNN's own message.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <string>

namespace roformer::cuda {

// The tensors of one attention problem, each [B, H, S, D] in element
// strides (last stride 1): q, o, grad_o, grad_q [B, H, Sq, D]; k, v,
// grad_k, grad_v [B, H, Skv, D].
enum class SdpaTensor : uint8_t { q, k, v, o, grad_o, grad_q, grad_k, grad_v, count };

struct SdpaGeometry {
  int64_t batch = 0, heads = 0, seq_q = 0, seq_kv = 0, head_dim = 0;
  std::array<std::array<int64_t, 4>, size_t(SdpaTensor::count)> strides{};

  std::array<int64_t, 4>& stride(SdpaTensor t) { return strides[size_t(t)]; }
  const std::array<int64_t, 4>& stride(SdpaTensor t) const { return strides[size_t(t)]; }
  // "B=2 H=12 Sq=512 Skv=512 D=64", for errors.
  std::string desc() const;
};

// Device pointers of the forward. stats [B, H, Sq] f32 (contiguous): the
// log-sum-exp of each query row's scaled, masked scores. seq_len_q and
// seq_len_kv [B] i32: the rows of q and the keys taken (a prefix) per sequence.
struct SdpaForwardData {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* stats = nullptr;
  const int32_t* seq_len_q = nullptr;
  const int32_t* seq_len_kv = nullptr;
};

struct SdpaBackwardData {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* o = nullptr;
  const void* grad_o = nullptr;
  const float* stats = nullptr;
  const int32_t* seq_len_q = nullptr;
  const int32_t* seq_len_kv = nullptr;
  void* grad_q = nullptr;
  void* grad_k = nullptr;
  void* grad_v = nullptr;
};

// Queues the attention on `stream` of `device` (workspace and scratch from
// the device's caching allocator, freed for later work on that stream).
void sdpa_forward(const SdpaGeometry& geometry, float scale, const SdpaForwardData& data,
                  int device, cudaStream_t stream);
void sdpa_backward(const SdpaGeometry& geometry, float scale, const SdpaBackwardData& data,
                   int device, cudaStream_t stream);

// Builds and finalizes every tensor and operation descriptor of the forward
// or backward graph (what cuDNN checks without a GPU: no handle, no engine)
// and returns the number of operations. Throws like the calls above.
int sdpa_graph_operations(const SdpaGeometry& geometry, bool backward);

}  // namespace roformer::cuda
