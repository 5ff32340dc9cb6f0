// Our matmul and linear ops against oneDNN's matmul primitive called directly
// (built once, memory allocated once): what the op layer costs on top of the
// kernel. Square sizes, forward only, no grad, same OpenMP threads; the four
// variants run interleaved, each repetition timed alone, and the median kept.
//
//   matmul_bench [--reps N] [--sizes 512,1024,2048]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <oneapi/dnnl/dnnl.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/cpu/onednn.h"
#include "core/ops.h"

using namespace roformer;

namespace {

double seconds(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string cpuinfo_field(const std::string& key) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return line.substr(line.find(':') + 2);
  return "";
}

bool cpu_has_avx512_bf16() {
  std::istringstream flags(cpuinfo_field("flags"));
  std::string f;
  while (flags >> f)
    if (f == "avx512_bf16") return true;
  return false;
}

// oneDNN's own matmul: dst = src x wei (+ bias), wei given as [K, N] with
// `wei_strides` (row-major or the transposed view that linear passes).
struct RawMatmul {
  dnnl::matmul prim;
  dnnl::memory src, wei, bias, dst;
  RawMatmul(const Tensor& a, const Tensor& w, const Tensor& b, dnnl::memory::dims wei_strides) {
    auto& eng = kernels::cpu::onednn_engine();
    const int64_t M = a.shape()[0], K = a.shape()[1], N = w.shape()[0];
    const auto dt = kernels::cpu::onednn_dtype(a.dtype());
    const dnnl::memory::desc src_d({M, K}, dt, dnnl::memory::dims{K, 1});
    const dnnl::memory::desc wei_d({K, N}, dt, wei_strides);
    const dnnl::memory::desc dst_d({M, N}, dt, dnnl::memory::dims{N, 1});
    src = dnnl::memory(src_d, eng, a.data());
    wei = dnnl::memory(wei_d, eng, w.data());
    dst = dnnl::memory(dst_d, eng);  // allocated once, by oneDNN
    if (b.defined()) {
      const dnnl::memory::desc bias_d({1, N}, kernels::cpu::onednn_dtype(b.dtype()),
                                      dnnl::memory::dims{N, 1});
      bias = dnnl::memory(bias_d, eng, b.data());
      prim = dnnl::matmul(
          dnnl::matmul::primitive_desc(dnnl::matmul::desc(src_d, wei_d, bias_d, dst_d), eng));
    } else {
      prim =
          dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(src_d, wei_d, dst_d), eng));
    }
  }
  void run() {
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}};
    if (bias) args.emplace(DNNL_ARG_BIAS, bias);
    prim.execute(kernels::cpu::onednn_stream(), args);
    kernels::cpu::onednn_stream().wait();
  }
};

}  // namespace

int main(int argc, char** argv) {
  int reps = 0;  // 0: by size
  std::vector<int64_t> sizes = {512, 1024, 2048};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--reps" && i + 1 < argc) {
      reps = std::stoi(argv[++i]);
    } else if (arg == "--sizes" && i + 1 < argc) {
      sizes.clear();
      std::stringstream ss(argv[++i]);
      std::string item;
      while (std::getline(ss, item, ',')) sizes.push_back(std::stoll(item));
    } else {
      std::fprintf(stderr, "usage: matmul_bench [--reps N] [--sizes 512,1024,2048]\n");
      return 2;
    }
  }

  const bool bf16 = cpu_has_avx512_bf16();
  std::printf("cpu: %s, %d OpenMP threads, avx512_bf16: %s\n", cpuinfo_field("model name").c_str(),
              omp_get_max_threads(), bf16 ? "yes" : "no (bf16 rows skipped)");
  std::printf(
      "median of N interleaved repetitions; overhead = raw time / op time - 1 as a "
      "GFLOP/s loss\n\n");
  std::printf(
      "| size | dtype | reps | oneDNN A*B | our matmul | overhead | oneDNN A*W^T+b | "
      "our linear | overhead |\n");
  std::printf("|---:|---|---:|---:|---:|---:|---:|---:|---:|\n");

  NoGradGuard no_grad;
  std::vector<DType> dtypes = {DType::f32};
  if (bf16) dtypes.push_back(DType::bf16);
  for (int64_t n : sizes) {
    for (DType dt : dtypes) {
      Generator gen{42, 0};
      const Tensor a = Tensor::rand({n, n}, gen, dt);
      const Tensor b = Tensor::rand({n, n}, gen, dt);  // [K, N] for matmul
      const Tensor w = Tensor::rand({n, n}, gen, dt);  // [out, in] for linear
      const Tensor bias = Tensor::rand({n}, gen, dt);
      RawMatmul raw_mm(a, b, Tensor(), {n, 1});
      RawMatmul raw_lin(a, w, bias, {1, n});  // W^T: [in, out] with strides (1, in)

      const int r = reps > 0 ? reps : (n <= 512 ? 51 : n <= 1024 ? 21 : 9);
      std::vector<double> t_raw, t_mm, t_raw_lin, t_lin;
      for (int i = -2; i < r; ++i) {  // two warm-up rounds build primitives, fill caches
        const double x0 = seconds([&] { raw_mm.run(); });
        const double x1 = seconds([&] { Tensor c = matmul(a, b); });
        const double x2 = seconds([&] { raw_lin.run(); });
        const double x3 = seconds([&] { Tensor c = linear(a, w, bias); });
        if (i < 0) continue;
        t_raw.push_back(x0);
        t_mm.push_back(x1);
        t_raw_lin.push_back(x2);
        t_lin.push_back(x3);
      }
      const double flop = 2.0 * double(n) * double(n) * double(n);
      auto gflops = [&](const std::vector<double>& t) { return flop / median(t) / 1e9; };
      const double g_raw = gflops(t_raw), g_mm = gflops(t_mm);
      const double g_raw_lin = gflops(t_raw_lin), g_lin = gflops(t_lin);
      std::printf("| %lld | %s | %d | %.1f | %.1f | %+.1f%% | %.1f | %.1f | %+.1f%% |\n",
                  static_cast<long long>(n), dtype_name(dt), r, g_raw, g_mm,
                  100.0 * (g_raw / g_mm - 1.0), g_raw_lin, g_lin,
                  100.0 * (g_raw_lin / g_lin - 1.0));
      std::fflush(stdout);
    }
  }
  // The op layer's fixed cost per call (key, cache lookup, output allocation,
  // views), measured where the kernel itself takes about a microsecond.
  {
    const int64_t n = 32;
    const Tensor a = Tensor::ones({n, n}), b = Tensor::ones({n, n}), bias = Tensor::ones({n});
    RawMatmul raw_mm(a, b, Tensor(), {n, 1});
    RawMatmul raw_lin(a, b, bias, {1, n});
    std::vector<double> t_raw, t_mm, t_raw_lin, t_lin;
    for (int i = -100; i < 5001; ++i) {
      const double x0 = seconds([&] { raw_mm.run(); });
      const double x1 = seconds([&] { Tensor c = matmul(a, b); });
      const double x2 = seconds([&] { raw_lin.run(); });
      const double x3 = seconds([&] { Tensor c = linear(a, b, bias); });
      if (i < 0) continue;
      t_raw.push_back(x0);
      t_mm.push_back(x1);
      t_raw_lin.push_back(x2);
      t_lin.push_back(x3);
    }
    std::printf(
        "\nfixed cost per call at %lldx%lld f32 (median of 5001): matmul %+.2f us, "
        "linear %+.2f us over the raw primitive (%.2f us, %.2f us)\n",
        static_cast<long long>(n), static_cast<long long>(n), 1e6 * (median(t_mm) - median(t_raw)),
        1e6 * (median(t_lin) - median(t_raw_lin)), 1e6 * median(t_raw), 1e6 * median(t_raw_lin));
  }
  return 0;
}
