#include "optim/device_passes.h"

#include <cstring>

#include "core/error.h"
#include "core/stream.h"

#if ROFORMER_CUDA
#include "core/cuda/backend.h"
#include "core/cuda/optimizer.h"
#include "core/cuda/raii.h"
#endif

namespace roformer::optim::device_passes {

Segments segments_of(const std::vector<Run>& runs, int64_t n) {
  constexpr uint8_t kNoDecay = 0, kDecay = 1, kSkip = 2;  // cuda::SegmentMode
  Segments s;
  int64_t at = 0;
  auto add = [&](int64_t begin, uint8_t mode) {
    // Merge with the previous segment when the mode is the same.
    if (!s.modes.empty() && s.modes.back() == mode) return;
    s.starts.push_back(begin);
    s.modes.push_back(mode);
  };
  for (const Run& r : runs) {
    if (r.begin < at || r.end < r.begin || r.end > n)
      throw Error(detail::concat("AdamW: update run [", r.begin, ", ", r.end,
                                 ") is not sorted, disjoint and inside [0, ", n, ")"));
    if (r.begin == r.end) continue;
    if (r.begin > at) add(at, kSkip);
    add(r.begin, r.decay ? kDecay : kNoDecay);
    at = r.end;
  }
  if (at < n || s.modes.empty()) add(at, kSkip);
  s.starts.push_back(n);
  return s;
}

#if ROFORMER_CUDA

namespace {
void check_flat(const Tensor& t, int64_t n, const char* what) {
  if (!t.device().is_cuda() || t.dtype() != DType::f32 || !t.is_contiguous() || t.numel() != n)
    throw Error(detail::concat("optimizer: ", what, " must be a contiguous f32 GPU tensor of ", n,
                               " elements, got ", t.desc(), " on ", t.device().str()));
}
}  // namespace

GradSummary grad_summary(const Tensor& flat_grad, const char* what) {
  const int64_t n = flat_grad.numel();
  check_flat(flat_grad, n, what);
  const Device device = flat_grad.device();
  cuda::DeviceGuard guard(device.index);
  const cudaStream_t stream = cuda::native(current_stream(device));
  // Scratch, then the 16-byte result, in one block of doubles.
  const int64_t scratch = int64_t((cuda::grad_norm_scratch_bytes() + 7) / 8);
  const Tensor work = Tensor::empty({scratch + 2}, DType::f64, device);
  double* base = work.data_as<double>();
  cuda::grad_norm_stats(flat_grad.data_as<float>(), n,
                        reinterpret_cast<cuda::GradStats*>(base + scratch), base, stream);
  const std::vector<double> result = work.narrow(0, scratch, 2).to_vector<double>();
  GradSummary out;
  out.sum_squares = result[0];
  std::memcpy(&out.non_finite, &result[1], sizeof out.non_finite);
  return out;
}

void adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
           const std::vector<Run>& runs, const AdamWStep& step, const Tensor& working_bf16,
           double* update_sum_squares) {
  const int64_t n = param.numel();
  check_flat(param, n, "the parameters");
  check_flat(grad, n, "the gradient");
  check_flat(m, n, "exp_avg");
  check_flat(v, n, "exp_avg_sq");
  const Device device = param.device();
  if (grad.device() != device || m.device() != device || v.device() != device)
    throw Error("optimizer: the flat buffers are on different devices");
  if (working_bf16.defined() &&
      (working_bf16.device() != device || working_bf16.dtype() != DType::bf16 ||
       !working_bf16.is_contiguous() || working_bf16.numel() != n))
    throw Error(
        detail::concat("optimizer: the bf16 working copy must be a contiguous bf16 tensor "
                       "of ",
                       n, " elements on ", device.str(), ", got ", working_bf16.desc(), " on ",
                       working_bf16.device().str()));
  const Segments seg = segments_of(runs, n);
  const int64_t count = int64_t(seg.modes.size());
  // Starts and modes in one upload: count + 1 int64 starts, then the bytes.
  std::vector<int64_t> packed(size_t(count + 1 + (count + 7) / 8), 0);
  std::memcpy(packed.data(), seg.starts.data(), seg.starts.size() * sizeof(int64_t));
  std::memcpy(packed.data() + count + 1, seg.modes.data(), seg.modes.size());
  const Tensor table = Tensor::from_vector(packed, {int64_t(packed.size())}, device);
  cuda::DeviceGuard guard(device.index);
  cuda::AdamWArgs a;
  a.beta1 = step.beta1;
  a.beta2 = step.beta2;
  a.eps = step.eps;
  a.step_size = step.step_size;
  a.bc2_sqrt = step.bc2_sqrt;
  a.grad_scale = step.grad_scale;
  a.decay = step.decay;
  const int64_t* starts = table.data_as<int64_t>();
  // With a measured update: the partial sums, then the result, in one block
  // of doubles.
  Tensor work;
  double* scratch = nullptr;
  const int64_t partials = int64_t((cuda::adamw_update_scratch_bytes() + 7) / 8);
  if (update_sum_squares) {
    work = Tensor::empty({partials + 1}, DType::f64, device);
    scratch = work.data_as<double>();
  }
  cuda::adamw_step(param.data_as<float>(), grad.data_as<float>(), m.data_as<float>(),
                   v.data_as<float>(),
                   working_bf16.defined() ? static_cast<uint16_t*>(working_bf16.data()) : nullptr,
                   n, starts, reinterpret_cast<const uint8_t*>(starts + count + 1), int(count), a,
                   cuda::native(current_stream(device)),
                   update_sum_squares ? scratch + partials : nullptr, scratch);
  if (update_sum_squares) *update_sum_squares = work.narrow(0, partials, 1).to_vector<double>()[0];
  param.bump_version();
  if (working_bf16.defined()) working_bf16.bump_version();
}

#else

namespace {
[[noreturn]] void no_cuda(const Tensor& t) {
  throw Error("optimizer: no update kernels for " + t.device().str() + " in this build");
}
}  // namespace

GradSummary grad_summary(const Tensor& flat_grad, const char*) {
  no_cuda(flat_grad);
}

void adamw(const Tensor& param, const Tensor&, const Tensor&, const Tensor&,
           const std::vector<Run>&, const AdamWStep&, const Tensor&, double*) {
  no_cuda(param);
}

#endif

}  // namespace roformer::optim::device_passes
