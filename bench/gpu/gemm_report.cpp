#include "bench/gpu/gemm_report.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "core/cuda/backend.h"
#include "core/error.h"
#include "core/stream.h"
#include "core/tensor.h"

namespace roformer::bench {

namespace {

// Bytes past a 256-byte boundary: the alignment cuBLASLt's heuristic sees.
int64_t offset_of(const void* p) {
  return int64_t(reinterpret_cast<uintptr_t>(p) % 256);
}

// A fresh random buffer of `elements` (at least one) on the device, from the
// caching allocator (which holds the step's freed memory by now), and the
// address `offset` bytes past a 256-byte boundary inside it: the recorded
// operand's alignment, so the heuristic answers the step's own problem.
struct Buffer {
  Tensor storage;
  void* at = nullptr;
};
Buffer random_buffer(int64_t elements, DType dtype, Device device, uint64_t seed, int64_t offset) {
  Generator gen{seed, 0};
  const int64_t extra = 512 / int64_t(dtype_size(dtype));
  Buffer b;
  b.storage = Tensor::randn({std::max<int64_t>(elements, 1) + extra}, gen, dtype, device);
  const auto base = reinterpret_cast<uintptr_t>(b.storage.data());
  b.at = reinterpret_cast<void*>((base + 255) / 256 * 256 + uintptr_t(offset));
  return b;
}

nlohmann::json measure(const cuda::RecordedGemm& recorded, Device device, int candidates,
                       int repeats) {
  const cuda::GemmArgs& was = recorded.args;
  cuda::GemmArgs g = was;
  const Buffer a =
      random_buffer(cuda::gemm_matrix_span(g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.lda,
                                           g.batch, g.stride_a),
                    g.input_dtype, device, 1, offset_of(was.a));
  const Buffer b =
      random_buffer(cuda::gemm_matrix_span(g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.ldb,
                                           g.batch, g.stride_b),
                    g.input_dtype, device, 2, offset_of(was.b));
  const Buffer c = random_buffer(cuda::gemm_matrix_span(g.m, g.n, g.ldc, g.batch, g.stride_c),
                                 g.output_dtype, device, 3, offset_of(was.c));
  const int64_t bias_elements = g.epilogue == cuda::GemmEpilogue::kRowSumsOfA ? g.m : g.n;
  const Buffer bias =
      g.bias ? random_buffer(bias_elements, g.bias_dtype, device, 4, offset_of(was.bias))
             : Buffer{};
  const Buffer aux = g.aux ? random_buffer(cuda::gemm_matrix_span(g.m, g.n, g.ld_aux, 1, 0),
                                           g.output_dtype, device, 5, offset_of(was.aux))
                           : Buffer{};
  g.a = a.at;
  g.b = b.at;
  g.c = c.at;
  g.bias = bias.at;
  g.aux = aux.at;
  const std::vector<cuda::GemmCandidate> timed = cuda::time_gemm_candidates(
      g, device.index, cuda::native(current_stream(device)), candidates, repeats);
  return gemm_report_row(was, recorded.calls, timed);
}

}  // namespace

nlohmann::json gemm_report_row(const cuda::GemmArgs& g, int64_t calls,
                               const std::vector<cuda::GemmCandidate>& timed) {
  const double flop = 2.0 * double(g.m) * double(g.n) * double(g.k) * double(g.batch);
  nlohmann::json row = {{"m", g.m},
                        {"n", g.n},
                        {"k", g.k},
                        {"batch", g.batch},
                        {"trans_a", g.trans_a},
                        {"trans_b", g.trans_b},
                        {"lda", g.lda},
                        {"ldb", g.ldb},
                        {"ldc", g.ldc},
                        {"stride_a", g.stride_a},
                        {"stride_b", g.stride_b},
                        {"stride_c", g.stride_c},
                        {"offset_a", offset_of(g.a)},
                        {"offset_b", offset_of(g.b)},
                        {"offset_c", offset_of(g.c)},
                        {"beta", g.beta},
                        {"bias", g.bias != nullptr},
                        {"epilogue", cuda::gemm_epilogue_name(g.epilogue)},
                        {"input", dtype_name(g.input_dtype)},
                        {"output", dtype_name(g.output_dtype)},
                        {"calls", calls},
                        {"flop", flop}};
  nlohmann::json list = nlohmann::json::array();
  for (const cuda::GemmCandidate& t : timed)
    list.push_back(
        {{"rank", t.rank}, {"ms", t.ms}, {"workspace", t.workspace}, {"waves", t.waves}});
  row["candidates"] = list;
  if (timed.empty()) {
    row["error"] = "cuBLASLt offered no algorithm that ran";
    return row;
  }
  const auto best = std::min_element(timed.begin(), timed.end(),
                                     [](const auto& x, const auto& y) { return x.ms < y.ms; });
  row["best_rank"] = best->rank;
  row["best_ms"] = best->ms;
  row["tflops_best"] = flop / best->ms * 1e-9;
  // Rank 0 is what gemm runs, unless the library refused it when timed.
  if (timed.front().rank == 0) {
    row["heuristic_ms"] = timed.front().ms;
    row["tflops_heuristic"] = flop / timed.front().ms * 1e-9;
  }
  return row;
}

nlohmann::json gemm_report(const std::function<void()>& step, Device device, int candidates,
                           int repeats) {
  RF_CHECK(!device.is_cpu(), "--gemm-report measures cuBLASLt's products: it needs a GPU");
  std::vector<cuda::RecordedGemm> problems;
  {
    const cuda::GemmRecording recording;
    step();
    synchronize(current_stream(device));
    problems = recording.problems();
  }
  // The step's heaviest problems first: calls x FLOPs.
  const auto work = [](const cuda::RecordedGemm& r) {
    return double(r.calls) * double(r.args.m) * double(r.args.n) * double(r.args.k) *
           double(r.args.batch);
  };
  std::sort(problems.begin(), problems.end(),
            [&](const auto& x, const auto& y) { return work(x) > work(y); });
  nlohmann::json report = nlohmann::json::array();
  for (const cuda::RecordedGemm& p : problems) {
    // A problem that fails (its buffers not fitting, say) loses its own row only.
    try {
      report.push_back(measure(p, device, candidates, repeats));
    } catch (const std::exception& e) {
      nlohmann::json row = gemm_report_row(p.args, p.calls, {});
      row["error"] = e.what();
      report.push_back(row);
    }
  }
  return report;
}

void print_gemm_report(const nlohmann::json& report) {
  std::printf(
      "gemm report: each product of one step, re-run with the algorithm gemm runs (rank 0) and "
      "the others cuBLASLt offers\n"
      "%-40s %5s %9s %9s %4s %6s %7s %7s\n",
      "problem (m x k * k x n)", "calls", "ours ms", "best ms", "rank", "best/", "ours", "best");
  std::printf("%-40s %5s %9s %9s %4s %6s %7s %7s\n", "", "", "", "", "", "ours", "TFLOP/s",
              "TFLOP/s");
  double ours_total = 0.0, best_total = 0.0;
  bool every_heuristic = true;
  for (const nlohmann::json& r : report) {
    std::string epilogue;
    if (r["epilogue"] != "none") {
      epilogue = " ";
      epilogue += r["epilogue"].get<std::string>();
    }
    char shape[96];
    std::snprintf(shape, sizeof(shape), "%lldx[%lldx%lld]%s*[%lldx%lld]%s%s%s%s",
                  (long long)r["batch"].get<int64_t>(), (long long)r["m"].get<int64_t>(),
                  (long long)r["k"].get<int64_t>(), r["trans_a"].get<bool>() ? "T" : "",
                  (long long)r["k"].get<int64_t>(), (long long)r["n"].get<int64_t>(),
                  r["trans_b"].get<bool>() ? "T" : "", r["beta"].get<double>() != 0 ? " +=" : "",
                  r["bias"].get<bool>() ? " bias" : "", epilogue.c_str());
    const int64_t calls = r["calls"].get<int64_t>();
    if (!r.contains("best_ms")) {
      std::printf("%-40s %5lld %s\n", shape, (long long)calls, r.value("error", "").c_str());
      every_heuristic = false;
      continue;
    }
    const double best = r["best_ms"].get<double>();
    best_total += double(calls) * best;
    if (!r.contains("heuristic_ms")) {
      every_heuristic = false;
      std::printf("%-40s %5lld %9s %9.3f %4d %6s %7s %7.1f\n", shape, (long long)calls, "-", best,
                  r["best_rank"].get<int>(), "-", "-", r["tflops_best"].get<double>());
      continue;
    }
    const double ours = r["heuristic_ms"].get<double>();
    ours_total += double(calls) * ours;
    std::printf("%-40s %5lld %9.3f %9.3f %4d %6.3f %7.1f %7.1f\n", shape, (long long)calls, ours,
                best, r["best_rank"].get<int>(), best / ours, r["tflops_heuristic"].get<double>(),
                r["tflops_best"].get<double>());
  }
  if (every_heuristic && ours_total > 0)
    std::printf(
        "gemm report: the step's products %.1f ms with the heuristic's picks, %.1f ms with the "
        "best candidates (%.3fx)\n",
        ours_total, best_total, best_total / ours_total);
  std::fflush(stdout);
}

}  // namespace roformer::bench
