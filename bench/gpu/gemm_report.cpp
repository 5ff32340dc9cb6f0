#include "bench/gpu/gemm_report.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "core/cuda/backend.h"
#include "core/cuda/gemm.h"
#include "core/error.h"
#include "core/stream.h"
#include "core/tensor.h"

namespace roformer::bench {

namespace {

const char* epilogue_name(cuda::GemmEpilogue e) {
  switch (e) {
    case cuda::GemmEpilogue::kGeluAux:
      return "gelu_aux";
    case cuda::GemmEpilogue::kDGeluBiasGrad:
      return "dgelu_bias_grad";
    case cuda::GemmEpilogue::kRowSumsOfA:
      return "row_sums_of_a";
    case cuda::GemmEpilogue::kNone:
      break;
  }
  return "none";
}

// Elements a stored matrix of `rows` x `cols` (row stride ld) spans over
// `batch` entries `stride` apart (0: one matrix for all).
int64_t span(int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
  if (rows == 0 || cols == 0) return 0;
  return stride * (batch - 1) + (rows - 1) * ld + cols;
}

// A fresh random buffer of `elements` (at least one) on the device, from the
// caching allocator (which holds the step's freed memory by now).
Tensor random_buffer(int64_t elements, DType dtype, Device device, uint64_t seed) {
  Generator gen{seed, 0};
  return Tensor::randn({std::max<int64_t>(elements, 1)}, gen, dtype, device);
}

nlohmann::json measure(const cuda::RecordedGemm& recorded, Device device, int candidates,
                       int repeats) {
  cuda::GemmArgs g = recorded.args;
  const Tensor a =
      random_buffer(span(g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.lda, g.batch, g.stride_a),
                    g.input_dtype, device, 1);
  const Tensor b =
      random_buffer(span(g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.ldb, g.batch, g.stride_b),
                    g.input_dtype, device, 2);
  const Tensor c =
      random_buffer(span(g.m, g.n, g.ldc, g.batch, g.stride_c), g.output_dtype, device, 3);
  const int64_t bias_elements = g.epilogue == cuda::GemmEpilogue::kRowSumsOfA ? g.m : g.n;
  const Tensor bias = g.bias ? random_buffer(bias_elements, g.bias_dtype, device, 4) : Tensor();
  const Tensor aux =
      g.aux ? random_buffer(span(g.m, g.n, g.ld_aux, 1, 0), g.output_dtype, device, 5) : Tensor();
  g.a = a.data();
  g.b = b.data();
  g.c = c.data();
  g.bias = bias.defined() ? bias.data() : nullptr;
  g.aux = aux.defined() ? aux.data() : nullptr;
  const std::vector<cuda::GemmCandidate> timed = cuda::time_gemm_candidates(
      g, device.index, cuda::native(current_stream(device)), candidates, repeats);

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
                        {"beta", g.beta},
                        {"bias", g.bias != nullptr},
                        {"epilogue", epilogue_name(g.epilogue)},
                        {"input", dtype_name(g.input_dtype)},
                        {"output", dtype_name(g.output_dtype)},
                        {"calls", recorded.calls},
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
  // Rank 0 is what gemm runs, unless the library refused it when timed.
  const bool ran_first = timed.front().rank == 0;
  const auto best = std::min_element(timed.begin(), timed.end(),
                                     [](const auto& x, const auto& y) { return x.ms < y.ms; });
  row["best_rank"] = best->rank;
  row["best_ms"] = best->ms;
  row["tflops_best"] = flop / best->ms * 1e-9;
  if (ran_first) {
    row["heuristic_ms"] = timed.front().ms;
    row["tflops_heuristic"] = flop / timed.front().ms * 1e-9;
  }
  return row;
}

}  // namespace

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
  std::sort(problems.begin(), problems.end(), [](const auto& x, const auto& y) {
    const auto work = [](const cuda::RecordedGemm& r) {
      return double(r.calls) * double(r.args.m) * double(r.args.n) * double(r.args.k) *
             double(r.args.batch);
    };
    return work(x) > work(y);
  });
  nlohmann::json report = nlohmann::json::array();
  for (const cuda::RecordedGemm& p : problems)
    report.push_back(measure(p, device, candidates, repeats));
  return report;
}

void print_gemm_report(const nlohmann::json& report) {
  std::printf(
      "gemm report: each product of one step, re-run with every algorithm cuBLASLt offers\n"
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
