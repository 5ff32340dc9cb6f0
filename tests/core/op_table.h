// The machinery of the op table (tests/core/test_op_table.cpp), in the style of
// ggml's test-backend-ops: each entry names a public op, builds it from its
// inputs, and says which dtypes it supports and at what tolerance. The same
// entry then drives a float64 finite-difference gradient check, float32 and
// bfloat16 forward and backward against float64, and, where a GPU is present,
// every device against the CPU with freshly allocated memory poisoned.
//
// Inputs are drawn once in float64 and rounded to bfloat16-representable
// values, so every dtype starts from exactly the same numbers and the
// comparisons measure the op's own arithmetic, not the rounding of its inputs.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/device_backend.h"
#include "core/ops.h"

namespace roformer::testing::op_table {

// How an input reaches the op: the layouts that make kernels take their
// strided, offset and broadcast paths.
enum class Layout {
  contiguous,
  transposed,  // stored with the last two dims swapped, seen through transpose(-2, -1)
  strided,     // the last dim narrowed out of one twice as long (row stride 2n, offset 1)
  broadcast,   // dim 0 stored as 1 and expanded: the gradient sums over it
  heads,       // stored [B, S, H, D], seen as [B, H, S, D] (attention's layout)
};

struct Input {
  Shape shape;  // what the op sees
  Layout layout = Layout::contiguous;
  double lo = -1.0, hi = 1.0;  // value range of a floating input
  bool grad = true;            // a floating input that gets a gradient
  Tensor fixed;                // an index or mask input: passed as is, never differentiated
};

inline Input in(Shape shape, Layout layout = Layout::contiguous, double lo = -1.0,
                double hi = 1.0) {
  return Input{std::move(shape), layout, lo, hi, true, Tensor()};
}
inline Input no_grad(Input input) {
  input.grad = false;
  return input;
}
inline Input fixed(Tensor t) {
  Input input;
  input.grad = false;
  input.fixed = std::move(t);
  return input;
}

using Builder = std::function<Tensor(const std::vector<Tensor>&)>;

struct OpCase {
  std::string op{};    // the public name: an ops.h function or a Tensor method
  std::string name{};  // unique per entry (the test's name)
  std::vector<Input> inputs{};
  Builder build{};
  std::vector<DType> dtypes{DType::f64, DType::f32, DType::bf16};  // supported
  std::map<DType, std::string> unsupported{};        // dtype -> text its clear error must contain
  bool grad = true;                                  // backward checked in every supported dtype
  bool fd = true;                                    // finite-difference check in f64
  std::string no_fd_reason{};                        // why not, when fd is false
  double fd_tol = 1e-6;                              // |numeric - analytic| <= tol (1 + |analytic|)
  double tol_f32 = 1e-5, tol_bf16 = 1e-2;            // forward vs f64, max error / max |ref|
  double grad_tol_f32 = 1e-5, grad_tol_bf16 = 2e-2;  // backward, the same measure

  double tolerance(DType t, bool backward) const {
    if (t == DType::f64) return 1e-12;
    if (t == DType::f32) return backward ? grad_tol_f32 : tol_f32;
    return backward ? grad_tol_bf16 : tol_bf16;
  }
  bool supports(DType t) const {
    for (DType d : dtypes)
      if (d == t) return true;
    return false;
  }
};

// Test names and CTest names show the entry's name, not its address.
inline void PrintTo(const OpCase* c, std::ostream* os) {
  *os << c->name;
}

// --- inputs -----------------------------------------------------------------------------

inline Tensor round_to_bf16(const Tensor& x) {
  return x.to(DType::bf16).to(DType::f64);
}

// The f64 leaf an input is drawn into (its storage shape, before the layout view).
inline Tensor make_base(const Input& input, uint64_t seed) {
  if (input.fixed.defined()) return input.fixed;
  Shape s = input.shape;
  const size_t n = s.size();
  switch (input.layout) {
    case Layout::contiguous:
      break;
    case Layout::transposed:
      std::swap(s[n - 2], s[n - 1]);
      break;
    case Layout::strided:
      s[n - 1] *= 2;
      break;
    case Layout::broadcast:
      s[0] = 1;
      break;
    case Layout::heads:
      std::swap(s[1], s[2]);
      break;
  }
  Generator gen{seed, 0};
  NoGradGuard no_grad;
  const Tensor u = Tensor::rand(s, gen, DType::f64);
  return round_to_bf16(add(mul(u, input.hi - input.lo), input.lo)).contiguous();
}

inline Tensor apply_layout(const Tensor& base, const Input& input) {
  if (input.fixed.defined()) return base;
  const int64_t n = int64_t(input.shape.size());
  switch (input.layout) {
    case Layout::contiguous:
      return base;
    case Layout::transposed:
      return base.transpose(-2, -1);
    case Layout::strided:
      return base.narrow(n - 1, 1, input.shape.back());
    case Layout::broadcast:
      return base.expand(input.shape);
    case Layout::heads:
      return base.transpose(1, 2);
  }
  return base;
}

inline std::vector<Tensor> make_bases(const OpCase& c) {
  std::vector<Tensor> bases;
  for (size_t i = 0; i < c.inputs.size(); ++i) bases.push_back(make_base(c.inputs[i], 1000 + i));
  return bases;
}

// The fixed random projection r: every run reduces sum(out * r) to a scalar.
inline Tensor projection(const Shape& shape) {
  Generator gen{99, 0};
  NoGradGuard no_grad;
  return round_to_bf16(add(Tensor::rand(shape, gen, DType::f64), 0.5));
}

// --- poisoned memory ---------------------------------------------------------------------------

// The CPU allocator caches freed blocks by size bin and hands the last freed
// one out first. Filling a stack of free blocks of every bin up to 512 KiB
// with 0xFF bytes (NaN in every floating dtype, -1 in integers) makes the
// next allocations of a run come back poisoned, so an output element a kernel
// never writes shows as NaN. Best effort: a buffer that reuses a block freed
// during the same run (a backward's temporaries, typically) is not poisoned;
// an allocator hook in core would close that gap. CUDA allocations are all
// poisoned (PoisonedCudaAllocations). PoisonShowsAnUnwrittenElement checks
// that the forward case still works.
inline void poison_cpu_allocations() {
  Allocator& a = allocator_for(Device::cpu());
  std::vector<std::pair<void*, size_t>> blocks;
  for (size_t n = 64; n <= (size_t(512) << 10);) {
    const size_t bin = CpuCachingAllocator::bin_size(n);
    for (int k = 0; k < (bin <= 4096 ? 12 : 3); ++k) {
      void* p = a.allocate(bin);
      std::memset(p, 0xFF, bin);
      blocks.emplace_back(p, bin);
    }
    n = bin + 1;
  }
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) a.deallocate(it->first, it->second);
}

// --- running an entry -----------------------------------------------------------------------

struct Result {
  Tensor out;                 // on the CPU, the op's dtype
  std::vector<Tensor> grads;  // per input (undefined for inputs without a gradient), f64
};

// Runs the entry in `dtype` on `device` from the f64 bases; with `backward`,
// also the gradients of sum(out * r) with respect to every grad input.
inline Result run(const OpCase& c, const std::vector<Tensor>& bases, DType dtype, Device device,
                  bool backward) {
  std::vector<Tensor> leaves, views;
  for (size_t i = 0; i < bases.size(); ++i) {
    const Input& input = c.inputs[i];
    Tensor leaf;
    {
      NoGradGuard no_grad;
      leaf = input.fixed.defined() ? bases[i].to(device) : bases[i].to(dtype).clone().to(device);
    }
    if (backward && input.grad && !input.fixed.defined()) leaf.set_requires_grad(true);
    leaves.push_back(leaf);
    views.push_back(apply_layout(leaf, input));
  }
  Result r;
  if (device.is_cpu()) poison_cpu_allocations();
  const Tensor out = c.build(views);
  if (backward) {
    const Tensor p = projection(out.shape()).to(out.dtype()).to(device);
    const Tensor loss = sum(mul(out, p));
    if (device.is_cpu()) poison_cpu_allocations();  // the gradients' first buffers too
    loss.backward();
    for (size_t i = 0; i < leaves.size(); ++i) {
      const bool wanted = c.inputs[i].grad && !c.inputs[i].fixed.defined();
      r.grads.push_back(wanted && leaves[i].grad().defined()
                            ? leaves[i].grad().to(Device::cpu()).to(DType::f64)
                            : Tensor());
      if (wanted && !leaves[i].grad().defined())
        ADD_FAILURE() << c.name << ": input " << i << " got no gradient in " << dtype_name(dtype)
                      << " on " << device.str();
    }
  }
  r.out = out.detach().to(Device::cpu());
  return r;
}

// max |a - ref| / max |ref| (absolute when ref is all zeros); NaN anywhere is infinite.
inline double scaled_error(const Tensor& a, const Tensor& ref) {
  if (a.shape() != ref.shape()) return INFINITY;
  const auto va = a.to_vector<double>(), vr = ref.to_vector<double>();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    if (std::isnan(va[i]) != std::isnan(vr[i])) return INFINITY;
    if (std::isnan(va[i])) continue;
    diff = std::max(diff, std::abs(va[i] - vr[i]));
    scale = std::max(scale, std::abs(vr[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

// The first non-finite value in the output or a gradient, or "" (the table's
// inputs keep every op in its finite range, so NaN or inf is a bug).
inline std::string first_non_finite(const Result& r) {
  auto check = [](const Tensor& t, const std::string& what) -> std::string {
    if (!t.defined() || !is_floating(t.dtype())) return "";
    const auto v = t.to_vector<double>();
    for (size_t i = 0; i < v.size(); ++i)
      if (!std::isfinite(v[i]))
        return what + " element " + std::to_string(i) + " is " + std::to_string(v[i]);
    return "";
  };
  std::string bad = check(r.out, "output");
  for (size_t i = 0; bad.empty() && i < r.grads.size(); ++i)
    bad = check(r.grads[i], "gradient of input " + std::to_string(i));
  return bad;
}

// Compares a run with a reference run: forward, then each gradient. Returns
// a description of the first mismatch, or "" when everything is within tol.
inline std::string compare(const OpCase& c, const Result& got, const Result& ref, double fwd_tol,
                           double bwd_tol) {
  char buf[256];
  if (got.out.shape() != ref.out.shape())
    return "output " + got.out.desc() + " vs reference " + ref.out.desc();
  const bool exact = !is_floating(ref.out.dtype());
  const double e = scaled_error(got.out, ref.out);
  if (exact ? e != 0.0 : !(e <= fwd_tol)) {
    std::snprintf(buf, sizeof buf, "forward error %.3g > %.3g", e, exact ? 0.0 : fwd_tol);
    return buf;
  }
  for (size_t i = 0; i < ref.grads.size() && i < got.grads.size(); ++i) {
    if (!ref.grads[i].defined() || !got.grads[i].defined()) continue;
    const double g = scaled_error(got.grads[i], ref.grads[i]);
    if (!(g <= bwd_tol)) {
      std::snprintf(buf, sizeof buf, "gradient of input %zu: error %.3g > %.3g", i, g, bwd_tol);
      return buf;
    }
  }
  (void)c;
  return "";
}

// Central finite differences in f64 on every element of every grad input's
// storage, against the analytic gradient of `ref` (a backward run in f64).
inline ::testing::AssertionResult finite_difference(const OpCase& c,
                                                    const std::vector<Tensor>& bases,
                                                    const Result& ref, double h = 1e-6) {
  NoGradGuard no_grad;
  const Tensor p = projection(ref.out.shape());
  std::vector<Tensor> leaves;
  for (const Tensor& b : bases) leaves.push_back(b.clone());
  auto loss = [&] {
    std::vector<Tensor> views;
    for (size_t i = 0; i < leaves.size(); ++i)
      views.push_back(c.inputs[i].fixed.defined() ? bases[i]
                                                  : apply_layout(leaves[i], c.inputs[i]));
    return sum(mul(c.build(views), p)).item();
  };
  for (size_t k = 0; k < leaves.size(); ++k) {
    if (!ref.grads[k].defined()) continue;
    const std::vector<double> analytic = ref.grads[k].to_vector<double>();
    double* x = leaves[k].data_as<double>();
    for (int64_t i = 0; i < leaves[k].numel(); ++i) {
      const double saved = x[i];
      x[i] = saved + h;
      const double up = loss();
      x[i] = saved - h;
      const double down = loss();
      x[i] = saved;
      const double numeric = (up - down) / (2 * h);
      if (!(std::abs(numeric - analytic[size_t(i)]) <=
            c.fd_tol * (1.0 + std::abs(analytic[size_t(i)]))))
        return ::testing::AssertionFailure()
               << c.name << ": input " << k << " element " << i << ": analytic "
               << analytic[size_t(i)] << " vs numeric " << numeric;
    }
  }
  return ::testing::AssertionSuccess();
}

// The message of the error `fn` throws ("no error" if none).
inline std::string error_text(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

// --- devices --------------------------------------------------------------------------------

// The accelerators this build and machine can run the table on; `why` says
// why there are none.
inline std::vector<Device> accelerators(std::string* why) {
#ifdef ROFORMER_CUDA
  if (device_count(DeviceType::cuda) == 0) {
    *why = "no GPU on this machine";
    return {};
  }
  return {Device::cuda(0)};
#else
  *why = "this build has no CUDA backend (ROFORMER_CUDA off)";
  return {};
#endif
}

#ifdef ROFORMER_CUDA
// While alive, every CUDA allocation comes back filled with 0xFF bytes (NaN
// for every floating dtype, -1 for integers), so an output element a kernel
// never writes shows up in the comparison (the allocator's poison mode).
class PoisonedCudaAllocations {
 public:
  PoisonedCudaAllocations() { allocator_for(Device::cuda(0)).set_poison(true); }
  ~PoisonedCudaAllocations() { allocator_for(Device::cuda(0)).set_poison(false); }
  PoisonedCudaAllocations(const PoisonedCudaAllocations&) = delete;
  PoisonedCudaAllocations& operator=(const PoisonedCudaAllocations&) = delete;
};
#endif

// --- the coverage table ------------------------------------------------------------------------

// op x device x dtype: what each run showed. Printed when the binary ends.
class Coverage {
 public:
  static Coverage& get() {
    static Coverage c;
    return c;
  }
  void set(const std::string& row, const std::string& column, const std::string& cell) {
    if (!cells_.count(row)) rows_.push_back(row);
    cells_[row][column] = cell;
  }
  std::string table(const std::vector<std::string>& columns) const {
    if (rows_.empty()) return "";
    size_t w0 = 4;
    for (const auto& r : rows_) w0 = std::max(w0, r.size());
    std::vector<size_t> widths;
    for (const auto& col : columns) {
      size_t w = col.size();
      for (const auto& r : rows_) {
        const auto it = cells_.at(r).find(col);
        if (it != cells_.at(r).end()) w = std::max(w, it->second.size());
      }
      widths.push_back(w);
    }
    auto pad = [](std::string s, size_t w) {
      return s + std::string(w - std::min(w, s.size()), ' ');
    };
    std::string out = pad("op", w0);
    for (size_t j = 0; j < columns.size(); ++j) out += " | " + pad(columns[j], widths[j]);
    out += "\n" + std::string(out.size(), '-') + "\n";
    for (const auto& r : rows_) {
      out += pad(r, w0);
      for (size_t j = 0; j < columns.size(); ++j) {
        const auto it = cells_.at(r).find(columns[j]);
        out += " | " + pad(it == cells_.at(r).end() ? "" : it->second, widths[j]);
      }
      out += "\n";
    }
    return out;
  }

 private:
  std::vector<std::string> rows_;
  std::map<std::string, std::map<std::string, std::string>> cells_;
};

}  // namespace roformer::testing::op_table
