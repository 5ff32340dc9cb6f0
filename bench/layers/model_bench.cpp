// Model step on the CPU: forward + backward (no optimizer) of RoFormer MLM at
// two sizes, side by side with the same model in PyTorch
// (bench/layers/model_bench_torch.py, run with /usr/bin/python3), same
// threads and batch, in f32 and in bf16 mixed precision (ours: a bf16
// MatmulPrecisionScope; PyTorch: torch.autocast bf16). PyTorch's head runs
// only at the masked rows (the optimised peer, as ours); --torch-full adds the
// f32 peer with logits at every position (as Hugging Face does).
//
//   model_bench [--size small|large|both] [--precision f32|bf16|both] [--steps N]
//               [--warmup N] [--no-torch] [--torch-full] [--profile] [--threads N]
// ROFORMER_PROFILE=1 (or --profile) prints our per-op time breakdown.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/layers/synthetic_mlm_batch.h"
#include "core/precision.h"
#include "core/profile.h"
#include "layers/roformer.h"

namespace {

using roformer::Tensor;

struct Size {
  const char* name;
  int64_t layers, hidden, heads, seq, batch;
};
constexpr Size kSizes[] = {{"small", 4, 256, 4, 128, 32}, {"large", 6, 512, 8, 512, 8}};
constexpr int64_t kVocab = 30522;
constexpr double kMaskProb = 0.15;

struct Options {
  std::string size = "both", precision = "both";
  int steps = 3, warmup = 1, threads = 0;
  bool torch = true, torch_full = false, profile = false;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Our step: returns the median step time in seconds.
double run_ours(const Size& s, const Options& opt, roformer::DType matmul, std::string& profile) {
  const roformer::MatmulPrecisionScope precision(matmul);
  roformer::ModelConfig c;
  c.vocab_size = kVocab;
  c.hidden_size = s.hidden;
  c.num_hidden_layers = s.layers;
  c.num_attention_heads = s.heads;
  c.intermediate_size = 4 * s.hidden;
  c.max_position_embeddings = std::max<int64_t>(512, s.seq);
  roformer::RoFormerForMaskedLM model(c, 1);

  const roformer::bench::MlmBatch batch =
      roformer::bench::synthetic_mlm_batch(s.batch, s.seq, kVocab, kMaskProb);
  const Tensor &t_ids = batch.ids, &t_types = batch.types, &t_mask = batch.mask,
               &t_labels = batch.labels;

  std::vector<double> times;
  for (int step = 0; step < opt.warmup + opt.steps; ++step) {
    const bool timed = step >= opt.warmup;
    if (timed && opt.profile) roformer::set_profiling(true);
    // Training casts the weights once per optimizer step: so does each step here.
    roformer::clear_bf16_weights();
    const auto start = std::chrono::steady_clock::now();
    {
      roformer::DropoutContext dropout{7, uint64_t(step), 0};
      const roformer::MlmOutput out =
          model.forward_mlm(t_ids, t_types, t_mask, t_labels, true, dropout);
      out.loss.backward();
    }
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    roformer::set_profiling(false);
    model.zero_grad();
    if (timed) times.push_back(elapsed);
  }
  if (opt.profile) {
    profile = roformer::profile_report();
    roformer::profile_reset();
  }
  return median(times);
}

// Runs the PyTorch peer; returns its median step time (0 on failure).
double run_torch(const Size& s, const Options& opt, const char* mode, const char* precision) {
  const std::string cmd =
      std::string("/usr/bin/python3 ") + ROFORMER_SOURCE_DIR +
      "/bench/layers/model_bench_torch.py --layers " + std::to_string(s.layers) + " --hidden " +
      std::to_string(s.hidden) + " --heads " + std::to_string(s.heads) + " --seq " +
      std::to_string(s.seq) + " --batch " + std::to_string(s.batch) + " --vocab " +
      std::to_string(kVocab) + " --steps " + std::to_string(opt.steps) + " --warmup " +
      std::to_string(opt.warmup) + " --threads " + std::to_string(opt.threads) + " --mode " + mode +
      " --precision " + precision + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return 0.0;
  std::string output;
  char buf[4096];
  while (fgets(buf, sizeof buf, pipe)) output += buf;
  const int status = pclose(pipe);
  const size_t at = output.rfind("\"step_s\": ");
  if (status != 0 || at == std::string::npos) {
    std::fprintf(stderr, "PyTorch peer (%s, %s) failed:\n%s\n", mode, precision, output.c_str());
    return 0.0;
  }
  return std::atof(output.c_str() + at + 10);
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  opt.profile = roformer::profiling_enabled();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--size") {
      opt.size = value();
    } else if (a == "--steps") {
      opt.steps = std::atoi(value().c_str());
    } else if (a == "--warmup") {
      opt.warmup = std::atoi(value().c_str());
    } else if (a == "--threads") {
      opt.threads = std::atoi(value().c_str());
    } else if (a == "--precision") {
      opt.precision = value();
    } else if (a == "--torch-full") {
      opt.torch_full = true;
    } else if (a == "--no-torch") {
      opt.torch = false;
    } else if (a == "--profile") {
      opt.profile = true;
    } else {
      std::fprintf(stderr,
                   "usage: model_bench [--size small|large|both] [--precision f32|bf16|both] "
                   "[--steps N] [--warmup N] [--threads N] [--no-torch] [--torch-full] "
                   "[--profile]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  if (opt.threads > 0) omp_set_num_threads(opt.threads);
  opt.threads = omp_get_max_threads();
  std::printf(
      "RoFormer MLM step (forward + backward, no optimizer), vocab %lld, %.0f%% rows "
      "masked, dropout 0.1, %d threads, median of %d steps\n",
      (long long)kVocab, kMaskProb * 100, opt.threads, opt.steps);
  const bool f32 = opt.precision != "bf16", bf16 = opt.precision != "f32";
  if (bf16 && !roformer::cpu_has_native_bf16())
    std::printf("note: this CPU has no AVX512-BF16/AMX-BF16; oneDNN emulates bf16 (slow)\n");
  std::printf("%-6s %-18s %9s %9s %9s %9s %9s %9s %9s\n", "size", "shape", "ours f32", "ours bf16",
              "torch f32", "torch bf16", "torch full", "f32 ratio", "bf16 ratio");
  for (const Size& s : kSizes) {
    if (opt.size != "both" && opt.size != s.name) continue;
    const double tokens = double(s.batch * s.seq);
    auto rate = [&](double t) { return t > 0 ? tokens / t : 0.0; };
    std::string profile_f32, profile_bf16;
    // Interleaved, so drifts in machine load hit both frameworks alike.
    const double ours_f32 = f32 ? rate(run_ours(s, opt, roformer::DType::f32, profile_f32)) : 0.0;
    const double torch_f32 = f32 && opt.torch ? rate(run_torch(s, opt, "masked", "f32")) : 0.0;
    const double ours_bf16 =
        bf16 ? rate(run_ours(s, opt, roformer::DType::bf16, profile_bf16)) : 0.0;
    const double torch_bf16 = bf16 && opt.torch ? rate(run_torch(s, opt, "masked", "bf16")) : 0.0;
    const double torch_full = opt.torch_full ? rate(run_torch(s, opt, "full", "f32")) : 0.0;
    char shape[64];
    std::snprintf(shape, sizeof shape, "%lldx%lld s%lld b%lld", (long long)s.layers,
                  (long long)s.hidden, (long long)s.seq, (long long)s.batch);
    auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
    std::printf("%-6s %-18s %9.0f %9.0f %9.0f %9.0f %9.0f %8.2fx %8.2fx\n", s.name, shape, ours_f32,
                ours_bf16, torch_f32, torch_bf16, torch_full, ratio(ours_f32, torch_f32),
                ratio(ours_bf16, torch_bf16));
    std::fflush(stdout);
    if (!profile_f32.empty())
      std::printf("\nper-op time of our f32 step (%s):\n%s\n", s.name, profile_f32.c_str());
    if (!profile_bf16.empty())
      std::printf("\nper-op time of our bf16 step (%s):\n%s\n", s.name, profile_bf16.c_str());
  }
  return 0;
}
