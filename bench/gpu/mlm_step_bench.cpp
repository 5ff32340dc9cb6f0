// RoFormer MLM training step on one device (issue 14, the benchmark): forward,
// backward, global gradient norm, clipping and the AdamW update, as the
// trainer does them, at each sequence length with the largest micro-batch that
// fits. The peer is bench/gpu/hf_roformer_bench.py (transformers'
// RoFormerForMaskedLM); scripts/gpu_bench.sh runs both in one device call and
// docs/performance/gpu-step.md gives the method.
//
//   mlm_step_bench [--device cuda|cpu] [--size base|tiny] [--seq 128,512,1536]
//                  [--precision
//                  bf16,f32,bf16-f32act,bf16-bgrad,bf16-addgrad,bf16-mmasync,bf16-ropeinside,
//                  bf16-unfuseddrop,bf16-gemmtimed,bf16-bitsinside,bf16-alternating]
//                  [--batch N | --start-batch N]
//                  [--max-tokens N] [--max-step-s T] [--memory-cap-mb M]
//                  [--steps N] [--warmup N] [--peak-tflops T] [--threads N]
//                  [--json FILE] [--f32-if-refused] [--budget-s T] [--profile]
//                  [--kernel-calls] [--layout stream|padded] [--attention-kernel K]
//                  [--gemm-report]
//   mlm_step_bench --flops-for SEQ:BATCH:MASKED,... [--size S] [--device D]
//                  [--precision P] [--peak-tflops T]
//
// The batch search doubles the micro-batch from --start-batch (default: 8192
// tokens' worth) until a step runs out of device memory (the caching
// allocator's error), would pass --max-tokens, or takes longer than
// --max-step-s (throughput is flat by then, and the device call stays short),
// and keeps the last size that fitted, or --max-tokens' own batch where that
// cap alone stopped it and that batch fits; a start that does not fit halves
// instead. --memory-cap-mb counts a step whose peak reserved memory passes the
// cap as not fitting, so the search is tested on the CPU. --f32-if-refused
// measures f32 where the device refuses bf16 (run.precision's own check), so
// a device call still gets our figures. --budget-s T times fewer steps (down
// to 2) when the search and the steps would pass T seconds per length. Each
// result is one JSON object per line in --json (the fields
// hf_roformer_bench.py writes too) and one line of the table.
//
// --precision bf16-f32act: bf16 products with their results kept in f32 (the
// step before bf16 activations, core/precision.h), beside bf16 to compare.
// --precision bf16-bgrad: bf16 with each linear's bias gradient summed inside
// its weight-gradient product (set_bias_grad_in_product, core/ops.h; on CUDA
// cuBLASLt's BGRADB epilogue), beside bf16 to decide that setting's default.
// --precision bf16-addgrad: bf16 with every gradient sum added by autograd in
// a pass of its own (set_accumulate_in_backward(false), core/autograd.h): the
// step before the products added into the sums, beside bf16 to compare.
// --precision bf16-mmasync: bf16 with the attention forward and fused
// backward on mma.sync rather than Hopper's wgmma, the default where the
// device is compute capability 9.0 (set_flash_forward_uses_wgmma and
// set_flash_backward_uses_wgmma, core/cuda/kernels/flash_attention.h):
// what wgmma gains, side by side; elsewhere (and in a build without the
// CUDA kernels) the same step as bf16.
//
// --precision bf16-ropeinside: bf16 with RoPE inside the attention kernels
// (set_rotate_once(false), core/ops.h), beside bf16 (q and k rotated once by
// the rope kernel around the plain attention kernels, the default since an
// H200 timed it faster): what rotating once gains, side by side.
//
// --precision bf16-unfuseddrop: bf16 with the hidden dropout as a pass of its
// own before each residual layer norm (set_fused_residual_dropout(false),
// core/ops.h), beside bf16 (the dropout inside the layer-norm kernels): what
// that fusion gains; the same bits either way.
//
// --precision bf16-bitsinside: bf16 with the attention dropout's keep bits
// drawn inside each wgmma forward (set_flash_keep_bits_ahead(false),
// core/cuda/kernels/flash_attention.h), beside bf16 (a kernel of their own
// draws them ahead, the default since an H200 timed it faster): what drawing
// ahead gains; the same bits either way. Elsewhere the same step as bf16.
//
// --precision bf16-alternating: bf16 with the fused wgmma backward's sweeps
// of the query tiles alternating in direction
// (set_flash_backward_alternates_sweeps): whether that should be the
// default; dq the same bits, dk and dv to f32 rounding.
//
// --precision bf16-gemmtimed: bf16 with the products' cuBLASLt algorithms
// chosen by timing (run.gemm_algorithms: timed, core/cuda/gemm.h), from an
// empty table, so the warm-up steps time every product's candidates and the
// timed steps run the choices; beside bf16 (the heuristic's first answers):
// what the choice by timing gains. On the CPU the same step as bf16.
//
// --profile: after the timed steps, one more step with every op's scope
// synchronised (core/profile.h), printed as a table of device milliseconds
// per op, forward and backward: where the step's time goes.
//
// --layout: the micro-batch as the trainer runs it by default, one token
// stream of B rows of S tokens (data.unpadded: true; the varlen attention
// kernels), or as a padded [B, S] batch with its key mask (data.unpadded:
// false; the padded kernels, what session 7's H100 figures measured). Every
// row is S real tokens either way.
//
// --attention-kernel: model.attention_kernel (auto by default: on a token
// stream, q, k and v from one product read in place by the attention op, RoPE
// inside that op (q and k rotated once around the plain kernels by default,
// set_rotate_once); separate: three products and rope ops; fused_rope,
// cudnn_sdpa).
//
// --gemm-report (CUDA builds, on a GPU): after the timed steps, one more step
// with its cuBLASLt products recorded, then each distinct product re-run on
// fresh operands with the algorithm gemm runs and the others cuBLASLt's
// heuristic offers (8 at most; bench/gpu/gemm_report.h): the row's
// gemm_report, and a table of what ours take against the fastest.
//
// --kernel-calls: the last timed step's kernel calls per kernel of the list
// (printed, and in the row as kernel_calls_by_kernel): which passes a step
// makes, on any device.
//
// --flops-for runs nothing: it prints, one JSON object per line, the model
// FLOPs of one step of those shapes (train/telemetry's mlm_training_flops, the
// formula of the training log's MFU) and the device's peak, so the summary
// puts the peer's rows on the same scale (bench/gpu/bench_summary.py).
#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "bench/layers/synthetic_mlm_batch.h"
#if defined(ROFORMER_CUDA)
#include "bench/gpu/gemm_report.h"
#endif
#if defined(ROFORMER_BENCH_FLASH_KNOBS)
#include "core/cuda/kernels/flash_attention.h"
#endif
#include "core/error.h"
#include "core/gemm_table/gemm_table.h"
#include "core/ops/dispatch.h"
#include "core/profile.h"
#include "core/stream.h"
#include "layers/roformer.h"
#include "layers/token_layout.h"
#include "optim/adamw.h"
#include "optim/grad_norm.h"
#include "train/config.h"
#include "train/run_device.h"
#include "train/run_precision.h"
#include "train/telemetry.h"

namespace {

using namespace roformer;
using Clock = std::chrono::steady_clock;

constexpr double kMaskProb = 0.15;

// The --precision values (the header comment says what each one runs).
constexpr std::array<std::string_view, 11> kPrecisions{"bf16",
                                                       "f32",
                                                       "bf16-f32act",
                                                       "bf16-bgrad",
                                                       "bf16-addgrad",
                                                       "bf16-mmasync",
                                                       "bf16-ropeinside",
                                                       "bf16-unfuseddrop",
                                                       "bf16-gemmtimed",
                                                       "bf16-bitsinside",
                                                       "bf16-alternating"};

std::string precision_list() {
  std::string list;
  for (const std::string_view p : kPrecisions) list += (list.empty() ? "" : ",") + std::string(p);
  return list;
}

struct Options {
  std::string device = "cuda", size = "base";
  std::vector<int64_t> seqs = {128, 512, 1536};
  std::vector<std::string> precisions = {"bf16"};
  int64_t batch = 0;             // > 0: this batch only, no search
  int64_t start_batch = 0;       // 0: 8192 tokens' worth
  int64_t max_tokens = 1 << 17;  // the search stops here (throughput is flat beyond)
  double memory_cap_mb = 0;      // > 0: a step above this peak reserved memory "does not fit"
  double max_step_s = 3;         // the search stops doubling after a step this long
  double budget_s = 0;           // > 0: seconds per length; fewer timed steps to fit
  int steps = 5, warmup = 2, threads = 0;
  double peak_tflops = 0;  // 0: train/telemetry's default for the device and precision
  std::string json;
  std::string flops_for;        // SEQ:BATCH:MASKED,...: print the FLOPs of these steps, run nothing
  bool f32_if_refused = false;  // bf16 refused on this device: measure f32 instead
  bool profile = false;         // one more step, timed per op (synchronised)
  bool kernel_calls = false;    // the last step's kernel calls, per kernel of the list
  bool gemm_report = false;     // one more step's products, each timed by algorithm
  std::string layout = "stream";  // stream (the trainer's default) or padded
  AttentionKernel attention_kernel = AttentionKernel::kAuto;
};

// The model sizes: RoFormer-base as issue 14 sets it, and a tiny one for CPU dry runs.
ModelConfig model_config(const std::string& size, int64_t max_seq) {
  ModelConfig c;
  if (size == "base") {
    c.vocab_size = 50000;
    c.hidden_size = 768;
    c.num_hidden_layers = 12;
    c.num_attention_heads = 12;
    c.intermediate_size = 3072;
  } else if (size == "tiny") {
    c.vocab_size = 1000;
    c.hidden_size = 64;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 2;
    c.intermediate_size = 128;
  } else {
    throw InputError("--size: expected base or tiny, got '" + size + "'");
  }
  c.max_position_embeddings = max_seq;
  return c;
}

bool out_of_memory(const std::exception& e) {
  const std::string what = e.what();
  return what.find("out of memory") != std::string::npos ||
         what.find("ALLOC_FAILED") != std::string::npos;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// The model, its optimizer and one micro-batch on the device: the trainer's
// step without the data loader.
class Bench {
 public:
  Bench(const ModelConfig& config, Device device, bool stream)
      : device_(device), model_(config, 1), vocab_(config.vocab_size), stream_(stream) {
    model_.to(device);
    for (const NamedTensor& p : model_.named_parameters())
      params_.push_back({p.name, p.tensor, optim::decays_by_default(p.name)});
    const OptimConfig defaults;  // the trainer's defaults
    adamw_.emplace(params_, optim::AdamWOptions{defaults.betas[0], defaults.betas[1], defaults.eps,
                                                defaults.weight_decay});
  }

  void set_batch(int64_t B, int64_t S) {
    clear_batch();  // the previous batch's device memory first
    bench::MlmBatch host = bench::synthetic_mlm_batch(B, S, vocab_, kMaskProb);
    // Labels stay on the host: forward_mlm picks the masked rows there.
    if (stream_) {
      layout_ = TokenLayout::of_lengths(std::vector<int64_t>(size_t(B), S)).to(device_);
      batch_ = {host.ids.reshape({B * S}).to(device_), host.types.reshape({B * S}).to(device_),
                Tensor(), host.labels.reshape({B * S}), host.masked};
    } else {
      batch_ = {host.ids.to(device_), host.types.to(device_), host.mask.to(device_), host.labels,
                host.masked};
    }
  }
  void clear_batch() {
    batch_ = {};
    layout_ = {};
  }
  int64_t masked() const { return batch_.masked; }

  // One optimizer step; returns its loss (waits for the device).
  double step(uint64_t index) {
    std::vector<uint64_t> by_kernel(size_t(kernels::KernelId::count));
    for (size_t i = 0; i < by_kernel.size(); ++i) by_kernel[i] = kernels::kernel_calls_by_id[i];
    const auto start = Clock::now();
    DropoutContext dropout{7, index, 0};
    const MlmOutput out = stream_ ? model_.forward_mlm(batch_.ids, batch_.types, layout_,
                                                       batch_.labels, true, dropout)
                                  : model_.forward_mlm(batch_.ids, batch_.types, batch_.mask,
                                                       batch_.labels, true, dropout);
    out.loss.backward();
    // Nothing above waits for the device on purpose: this is the host's time
    // to queue forward and backward. Near the step time, the step is bound by
    // launches (or by a hidden wait); well under it, the GPU never starves.
    last_enqueue_s_ = std::chrono::duration<double>(Clock::now() - start).count();
    double gnorm = 0;
    {
      RF_PROFILE("grad_norm");
      gnorm = optim::global_grad_norm(params_);
    }
    {
      RF_PROFILE("adamw");
      adamw_->step(1e-4, optim::clip_scale(gnorm, 1.0));
      adamw_->zero_grad();
    }
    const double loss = out.loss.item();
    if (!device_.is_cpu()) synchronize(current_stream(device_));
    last_calls_ = 0;
    for (size_t i = 0; i < by_kernel.size(); ++i) {
      by_kernel[i] = kernels::kernel_calls_by_id[i] - by_kernel[i];
      last_calls_ += by_kernel[i];
    }
    last_calls_by_kernel_ = std::move(by_kernel);
    return loss;
  }
  // Of the last step: the host's seconds to queue forward and backward, and
  // the kernel calls of the whole step.
  double last_enqueue_s() const { return last_enqueue_s_; }
  uint64_t last_calls() const { return last_calls_; }
  // The same per kernel: {name: calls}, those called only.
  nlohmann::json last_calls_by_kernel() const {
    nlohmann::json out = nlohmann::json::object();
    for (size_t i = 0; i < last_calls_by_kernel_.size(); ++i)
      if (last_calls_by_kernel_[i] > 0)
        out[kernels::kernel_name(kernels::KernelId(i))] = last_calls_by_kernel_[i];
    return out;
  }

  // After an out-of-memory error: the gradients of the failed step dropped,
  // cached blocks given back.
  void recover() {
    adamw_->zero_grad();
    release_device_cache(device_);
  }

 private:
  Device device_;
  RoFormerForMaskedLM model_;
  int64_t vocab_;
  std::vector<optim::NamedParameter> params_;
  std::optional<optim::AdamW> adamw_;
  bench::MlmBatch batch_;
  bool stream_ = true;
  TokenLayout layout_;  // of the batch, when stream_
  double last_enqueue_s_ = 0;
  uint64_t last_calls_ = 0;
  std::vector<uint64_t> last_calls_by_kernel_;
};

struct Trial {
  int64_t batch = 0;
  bool fits = false;
  double peak_reserved_mb = 0;
  double step_s = 0;
};

// One step at batch B: does it fit (no out-of-memory error, under the cap)?
Trial try_batch(Bench& bench, Device device, int64_t B, int64_t S, const Options& opt) {
  Trial t{B, false, 0, 0};
  try {
    bench.set_batch(B, S);
    reset_device_peak(device);
    auto start = Clock::now();
    const uint64_t table = gemm_table_generation();
    bench.step(0);
    // bf16-gemmtimed: a step that timed products is timed again, so the
    // search stops where the default's would.
    if (gemm_table_generation() != table) {
      start = Clock::now();
      bench.step(0);
    }
    t.step_s = std::chrono::duration<double>(Clock::now() - start).count();
    t.peak_reserved_mb = device_memory(device).peak_reserved_mb;
    t.fits = opt.memory_cap_mb <= 0 || t.peak_reserved_mb <= opt.memory_cap_mb;
  } catch (const std::exception& e) {
    if (!out_of_memory(e)) throw;
    bench.clear_batch();
    bench.recover();
  }
  return t;
}

// The largest micro-batch that fits, by doubling (or halving from a start that does not fit).
int64_t search_batch(Bench& bench, Device device, int64_t S, const Options& opt,
                     std::vector<Trial>& trials) {
  const int64_t cap = std::max<int64_t>(1, opt.max_tokens / S);
  int64_t b = std::min(cap, opt.start_batch > 0 ? opt.start_batch : std::max<int64_t>(1, 8192 / S));
  trials.push_back(try_batch(bench, device, b, S, opt));
  if (!trials.back().fits) {
    while (b > 1 && !trials.back().fits) trials.push_back(try_batch(bench, device, b /= 2, S, opt));
    return trials.back().fits ? b : 0;
  }
  while (b * 2 <= cap && trials.back().step_s <= opt.max_step_s) {
    trials.push_back(try_batch(bench, device, b * 2, S, opt));
    if (!trials.back().fits) break;
    b *= 2;
  }
  // Stopped by --max-tokens alone, the last doubling can leave up to half of
  // it unused (seq 1536: 80 rows where 85 make the 131,072 tokens of 512 x
  // 256): the cap's own batch is tried too, so every length runs as many
  // tokens a step where memory allows.
  if (b < cap && trials.back().fits && trials.back().step_s <= opt.max_step_s) {
    trials.push_back(try_batch(bench, device, cap, S, opt));
    if (trials.back().fits) b = cap;
  }
  return b;
}

// The fields every row starts with (hf_roformer_bench.py writes the same).
// `label`: the --precision value (kPrecisions); an attention kernel other than auto is
// named in the set-up.
nlohmann::json row_head(const Config& run, int64_t S, const std::string& label,
                        const Options& opt) {
  const std::string kernel = opt.attention_kernel == AttentionKernel::kAuto
                                 ? ""
                                 : " " + std::string(enum_name(opt.attention_kernel));
  return {{"framework", "ours"},
          {"setup", "ours " + label + kernel},
          {"device", run.run.device.str()},
          {"precision", label},
          {"seq", S},
          {"head", "masked rows"},
          {"layout", opt.layout}};
}

// The kernel calls of one step by kernel, most called first.
void print_kernel_calls(const nlohmann::json& calls) {
  std::vector<std::pair<uint64_t, std::string>> rows;
  for (const auto& [name, n] : calls.items()) rows.push_back({n.get<uint64_t>(), name});
  std::sort(rows.rbegin(), rows.rend());
  std::printf("kernel calls of the last step, by kernel:\n");
  for (const auto& [n, name] : rows)
    std::printf("  %-28s %6llu\n", name.c_str(), (unsigned long long)n);
}

// One step with every op's scope synchronised: device milliseconds per op.
void profile_step(Bench& bench, Device device, int64_t S, int64_t B) {
  // Profiling with the sync on for its lifetime, whatever the step throws.
  struct Profiling {
    explicit Profiling(std::function<void()> sync) {
      set_profile_sync(std::move(sync));
      set_profiling(true);
    }
    ~Profiling() {
      set_profiling(false);
      set_profile_sync({});
    }
  };
  const auto sync = [device] {
    if (!device.is_cpu()) synchronize(current_stream(device));
  };
  sync();
  profile_reset();
  double ms = 0;
  {
    const Profiling on(sync);
    const auto start = Clock::now();
    bench.step(1000);
    ms = 1e3 * std::chrono::duration<double>(Clock::now() - start).count();
  }
  std::printf("profile seq %lld batch %lld: one step of %.1f ms with every op synchronised\n%s",
              (long long)S, (long long)B, ms, profile_report().c_str());
  std::fflush(stdout);
}

nlohmann::json measure(Bench& bench, const ModelConfig& mc, const Config& run, int64_t S,
                       const Options& opt, const std::string& label) {
  const Device device = run.run.device;
  const auto began = Clock::now();
  nlohmann::json r = row_head(run, S, label, opt);
  r["attention_kernel"] = std::string(enum_name(mc.attention_kernel));
  std::vector<Trial> trials;
  const int64_t B = opt.batch > 0 ? opt.batch : search_batch(bench, device, S, opt, trials);
  nlohmann::json search = nlohmann::json::array();
  for (const Trial& t : trials)
    search.push_back({{"batch", t.batch},
                      {"fits", t.fits},
                      {"peak_reserved_mb", t.peak_reserved_mb},
                      {"step_s", t.step_s}});
  r["search"] = search;
  if (B == 0) {
    r["status"] = "error";
    r["message"] = "not even a micro-batch of one sequence fits";
    return r;
  }
  bench.set_batch(B, S);
  // Within --budget-s, fewer timed steps (at least 2) when steps are slow.
  int steps = opt.steps;
  const auto fitted = std::find_if(trials.rbegin(), trials.rend(),
                                   [&](const Trial& t) { return t.fits && t.batch == B; });
  if (opt.budget_s > 0 && fitted != trials.rend() && fitted->step_s > 0) {
    const double left = opt.budget_s - std::chrono::duration<double>(Clock::now() - began).count();
    // At least 2 (unless --steps asks for fewer), at most --steps.
    steps = std::min(std::max(int(left / fitted->step_s) - opt.warmup, 2), opt.steps);
  }
  for (int i = 0; i < opt.warmup; ++i) bench.step(uint64_t(1 + i));
  reset_device_peak(device);
  std::vector<double> times, enqueue;
  double loss = 0;
  // bf16-gemmtimed: products timed inside the timed steps (a bucket the
  // warm-up did not reach) would count their timing in the figure.
  const uint64_t table_before = gemm_table_generation();
  for (int i = 0; i < steps; ++i) {
    const auto start = Clock::now();
    loss = bench.step(uint64_t(100 + i));
    times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    enqueue.push_back(bench.last_enqueue_s());
  }
  const DeviceMemory mem = device_memory(device);
  const double step_s = median(times), tokens = double(B * S);
  const double flops = mlm_training_flops(mc, S, B * S, bench.masked());
  const double peak = peak_tflops(run, omp_get_max_threads());
  r.update({{"status", std::isfinite(loss) ? "ok" : "error"},
            {"batch", B},
            {"tokens", B * S},
            {"masked", bench.masked()},
            {"loss", loss},
            {"step_ms", 1e3 * step_s},
            {"step_ms_min", 1e3 * *std::min_element(times.begin(), times.end())},
            {"step_ms_max", 1e3 * *std::max_element(times.begin(), times.end())},
            {"tokens_per_s", tokens / step_s},
            {"flops_per_step", flops},
            {"tflops", flops / step_s / 1e12},
            {"peak_tflops", peak},
            {"mfu", flops / step_s / (peak * 1e12)},
            {"peak_allocated_mb", mem.peak_allocated_mb},
            {"peak_reserved_mb", mem.peak_reserved_mb},
            {"kernel_calls_per_step", bench.last_calls()},
            {"enqueue_ms", 1e3 * median(enqueue)},
            {"steps", steps}});
  if (!std::isfinite(loss)) r["message"] = "non-finite loss";
  if (gemm_table_generation() != table_before) {
    r["status"] = "error";
    r["message"] = "products were timed during the timed steps (run.gemm_algorithms: timed)";
  }
  if (opt.kernel_calls) {
    r["kernel_calls_by_kernel"] = bench.last_calls_by_kernel();
    print_kernel_calls(r["kernel_calls_by_kernel"]);
  }
  if (opt.profile) profile_step(bench, device, S, B);
  if (opt.gemm_report) {
#if defined(ROFORMER_CUDA)  // parse() refuses it otherwise
    r["gemm_report"] =
        bench::gemm_report([&] { bench.step(2000); }, device, /*candidates=*/8, /*repeats=*/10);
    bench::print_gemm_report(r["gemm_report"]);
#endif
  }
  bench.clear_batch();
  release_device_cache(device);
  return r;
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

int64_t integer(const std::string& text, const std::string& key) {
  try {
    size_t used = 0;
    const long long v = std::stoll(text, &used);
    if (used == text.size() && v >= 0) return v;
  } catch (const std::exception&) {
  }
  throw InputError(key + ": expected a non-negative integer, got '" + text + "'");
}

Options parse(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw InputError(a + " needs a value");
      return argv[++i];
    };
    if (a == "--device") {
      opt.device = value();
    } else if (a == "--size") {
      opt.size = value();
    } else if (a == "--seq") {
      opt.seqs.clear();
      for (const std::string& s : split(value())) opt.seqs.push_back(integer(s, a));
    } else if (a == "--precision") {
      opt.precisions = split(value());
    } else if (a == "--batch") {
      opt.batch = integer(value(), a);
    } else if (a == "--start-batch") {
      opt.start_batch = integer(value(), a);
    } else if (a == "--max-tokens") {
      opt.max_tokens = integer(value(), a);
    } else if (a == "--budget-s") {
      opt.budget_s = std::stod(value());
    } else if (a == "--max-step-s") {
      opt.max_step_s = std::stod(value());
    } else if (a == "--memory-cap-mb") {
      opt.memory_cap_mb = double(integer(value(), a));
    } else if (a == "--steps") {
      opt.steps = int(integer(value(), a));
    } else if (a == "--warmup") {
      opt.warmup = int(integer(value(), a));
    } else if (a == "--threads") {
      opt.threads = int(integer(value(), a));
    } else if (a == "--peak-tflops") {
      opt.peak_tflops = std::stod(value());
    } else if (a == "--json") {
      opt.json = value();
    } else if (a == "--f32-if-refused") {
      opt.f32_if_refused = true;
    } else if (a == "--profile") {
      opt.profile = true;
    } else if (a == "--kernel-calls") {
      opt.kernel_calls = true;
    } else if (a == "--gemm-report") {
      opt.gemm_report = true;
    } else if (a == "--attention-kernel") {
      const std::string name = value();
      const auto kernel = enum_from_name<AttentionKernel>(name);
      if (!kernel)
        throw InputError("--attention-kernel: expected one of " + enum_choices<AttentionKernel>() +
                         ", got '" + name + "'");
      opt.attention_kernel = *kernel;
    } else if (a == "--layout") {
      opt.layout = value();
      if (opt.layout != "stream" && opt.layout != "padded")
        throw InputError("--layout: expected stream or padded, got '" + opt.layout + "'");
    } else if (a == "--flops-for") {
      opt.flops_for = value();
    } else {
      throw InputError(
          "usage: mlm_step_bench [--device cuda|cpu] [--size base|tiny] [--seq 128,512,1536] "
          "[--precision " +
          precision_list() +
          "] "
          "[--batch N | --start-batch "
          "N] "
          "[--max-tokens N] "
          "[--max-step-s T] "
          "[--memory-cap-mb M] [--steps N] [--warmup N] [--peak-tflops T] [--threads N] "
          "[--f32-if-refused] [--budget-s T] [--profile] [--kernel-calls] [--layout L] "
          "[--attention-kernel K] [--gemm-report] "
          "[--json FILE]\n       mlm_step_bench --flops-for SEQ:BATCH:MASKED,... [--size S] "
          "[--device D] [--precision P] [--peak-tflops T]" +
          (a == "--help" ? std::string() : "\nunknown option '" + a + "'"));
    }
  }
  if (opt.seqs.empty() || opt.steps < 1) throw InputError("--seq and --steps need at least one");
  for (const std::string& p : opt.precisions)
    if (std::find(kPrecisions.begin(), kPrecisions.end(), p) == kPrecisions.end())
      throw InputError("--precision: expected some of " + precision_list() + ", got '" + p + "'");
  if (opt.gemm_report) {
#if !defined(ROFORMER_CUDA)
    throw InputError("--gemm-report measures cuBLASLt's products: this build has no CUDA");
#endif
    if (opt.device != "cuda")
      throw InputError("--gemm-report measures cuBLASLt's products: it takes --device cuda, got '" +
                       opt.device + "'");
  }
  return opt;
}

void print_row(const nlohmann::json& r) {
  if (r.value("status", "") != "ok") {
    std::printf("%-10s %6lld  %s: %s\n", r.value("setup", "").c_str(),
                (long long)r.value("seq", int64_t(0)), r.value("status", "").c_str(),
                r.value("message", "").c_str());
  } else {
    std::printf("%-10s %6lld %6lld %12.0f %9.1f %7.1f%% %10.0f %10.0f %7lld %10.1f\n",
                r["setup"].get<std::string>().c_str(), (long long)r["seq"].get<int64_t>(),
                (long long)r["batch"].get<int64_t>(), r["tokens_per_s"].get<double>(),
                r["step_ms"].get<double>(), 100 * r["mfu"].get<double>(),
                r["peak_allocated_mb"].get<double>(), r["peak_reserved_mb"].get<double>(),
                (long long)r["kernel_calls_per_step"].get<int64_t>(),
                r["enqueue_ms"].get<double>());
  }
  std::fflush(stdout);
}

// The FLOPs of steps of given shapes and the peak they are measured against
// (the device need not be present).
void print_flops(const Options& opt) {
  Config run;
  run.run.device = parse_device(opt.device);
  run.run.precision = opt.precisions.front() == "f32" ? Precision::kF32 : Precision::kBf16;
  run.log.peak_tflops = opt.peak_tflops;
  for (const std::string& shape : split(opt.flops_for)) {
    std::vector<int64_t> v;
    std::stringstream in(shape);
    for (std::string part; std::getline(in, part, ':');) v.push_back(integer(part, "--flops-for"));
    if (v.size() != 3 || v[0] < 1 || v[1] < 1)
      throw InputError("--flops-for: expected SEQ:BATCH:MASKED, got '" + shape + "'");
    const ModelConfig mc = model_config(opt.size, v[0]);
    const nlohmann::json r = {{"seq", v[0]},
                              {"batch", v[1]},
                              {"masked", v[2]},
                              {"flops_per_step", mlm_training_flops(mc, v[0], v[0] * v[1], v[2])},
                              {"peak_tflops", peak_tflops(run, omp_get_max_threads())}};
    std::printf("%s\n", r.dump().c_str());
  }
}

int run(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  if (opt.threads > 0) omp_set_num_threads(opt.threads);
  if (!opt.flops_for.empty()) {
    print_flops(opt);
    return 0;
  }
  const Device device = device_option(opt.device, "--device");
  const int64_t max_seq = *std::max_element(opt.seqs.begin(), opt.seqs.end());
  ModelConfig mc = model_config(opt.size, max_seq);
  mc.attention_kernel = opt.attention_kernel;
  std::ofstream json;
  if (!opt.json.empty()) {
    json.open(opt.json, std::ios::app);
    if (!json) throw InputError("--json: cannot write " + opt.json);
  }
  std::printf(
      "RoFormer MLM training step (%s: %lld layers, hidden %lld, %lld heads, FFN %lld, vocab "
      "%lld) on %s, %s batches: forward, backward, grad norm, AdamW; %.0f%% rows masked, head on "
      "them only; median of %d steps after %d\n",
      opt.size.c_str(), (long long)mc.num_hidden_layers, (long long)mc.hidden_size,
      (long long)mc.num_attention_heads, (long long)mc.intermediate_size, (long long)mc.vocab_size,
      device.str().c_str(), opt.layout == "stream" ? "token-stream" : "padded", 100 * kMaskProb,
      opt.steps, opt.warmup);
  std::printf("%-10s %6s %6s %12s %9s %8s %10s %10s %7s %10s\n", "setup", "seq", "batch",
              "tokens/s", "step ms", "MFU", "peak MiB", "reserved", "kernels", "queue ms");
  std::vector<std::string> precisions = opt.precisions;
  for (size_t i = 0; i < precisions.size(); ++i) {
    const std::string precision = precisions[i];
    Config run;
    run.run.device = device;
    run.run.precision = precision == "f32" ? Precision::kF32 : Precision::kBf16;
    run.log.peak_tflops = opt.peak_tflops;
    run.source = "mlm_step_bench --precision " + precision;
    std::optional<RunPrecision> scope;
    std::optional<MatmulPrecisionScope> f32_activations;  // inside the run's bf16 scope
    std::optional<Bench> bench;
    std::string refused;
    try {
      scope.emplace(run);
      if (precision == "bf16-f32act") f32_activations.emplace(DType::bf16, false);
      set_bias_grad_in_product(precision == "bf16-bgrad");
      set_accumulate_in_backward(precision != "bf16-addgrad");
      set_rotate_once(precision != "bf16-ropeinside");
      set_fused_residual_dropout(precision != "bf16-unfuseddrop");
      clear_gemm_table();  // each setting times its own, in its warm-up steps
      set_gemm_algorithm_choice(precision == "bf16-gemmtimed" ? GemmAlgorithmChoice::kTimed
                                                              : GemmAlgorithmChoice::kHeuristic);
#if defined(ROFORMER_BENCH_FLASH_KNOBS)
      kernels::cuda::set_flash_forward_uses_wgmma(precision != "bf16-mmasync");
      kernels::cuda::set_flash_backward_uses_wgmma(precision != "bf16-mmasync");
      kernels::cuda::set_flash_keep_bits_ahead(precision != "bf16-bitsinside");
      kernels::cuda::set_flash_backward_alternates_sweeps(precision == "bf16-alternating");
#endif
      bench.emplace(mc, device, opt.layout == "stream");
    } catch (const InputError& e) {
      refused = e.what();  // bf16 not available on this device or CPU
      const bool listed =
          std::find(precisions.begin(), precisions.end(), "f32") != precisions.end();
      if (opt.f32_if_refused && !listed) precisions.push_back("f32");
    }
    for (const int64_t S : opt.seqs) {
      nlohmann::json r;
      if (!refused.empty()) {
        r = row_head(run, S, precision, opt);
        r.update({{"status", "skip"}, {"message", refused}});
      } else {
        try {
          r = measure(*bench, mc, run, S, opt, precision);
        } catch (const std::exception& e) {  // the other lengths may still run
          r = row_head(run, S, precision, opt);
          r.update({{"status", "error"}, {"message", e.what()}});
          bench->clear_batch();
          bench->recover();
        }
      }
      print_row(r);
      if (json.is_open()) json << r.dump() << "\n" << std::flush;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const roformer::InputError& e) {
    std::fprintf(stderr, "mlm_step_bench: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mlm_step_bench: %s\n", e.what());
    return 1;
  }
}
