// Every op on CUDA against the CPU, forward and backward, on fresh random data
// with strided inputs; fresh CUDA memory is poisoned (NaN), so an element a
// kernel never writes fails the comparison. Skips without a GPU.
#include <functional>
#include <optional>
#include <tuple>

#include "core/ops.h"
#include "core/ops/dispatch.h"
#include "core/precision.h"
#include "tests/cuda/gpu_test.h"
#include "tests/test_support.h"

namespace roformer {
namespace {

using testing::kGpu;
using testing::relative_error;

// While alive, fresh CUDA allocations come back filled with NaN bytes.
struct PoisonGpu {
  PoisonGpu() { allocator_for(kGpu).set_poison(true); }
  ~PoisonGpu() { allocator_for(kGpu).set_poison(false); }
};

struct OpCheck {
  std::string name;
  std::vector<Tensor> inputs;  // CPU leaves (floating ones get gradients)
  std::function<Tensor(const std::vector<Tensor>&)> build;
  double tol = 1e-5;
  // The GPU side runs under bf16 autocast (core/precision.h) and must differ
  // from the CPU's f32 by more than f32 rounding: the products took bf16.
  bool autocast = false;
};

std::vector<double> host(const Tensor& t) {
  return t.to(Device::cpu()).to(DType::f64).contiguous().to_vector<double>();
}

// Runs `c` on the CPU and on the GPU: the output, then the gradient of
// sum(out * r) for a fixed random r with respect to each floating input.
void check(const OpCheck& c) {
  SCOPED_TRACE(c.name);
  struct Run {
    std::vector<double> out;
    std::vector<std::vector<double>> grads;
  };
  auto run = [&](Device device) {
    std::optional<MatmulPrecisionScope> products;
    if (c.autocast && device.is_cuda()) products.emplace(DType::bf16);
    std::vector<Tensor> leaves;
    for (const Tensor& t : c.inputs) {
      Tensor leaf = t.to(device);
      if (is_floating(t.dtype())) leaf = leaf.detach().set_requires_grad(true);
      leaves.push_back(leaf);
    }
    const Tensor out = c.build(leaves);
    Run r;
    r.out = host(out);
    if (is_floating(out.dtype()) && out.requires_grad()) {
      Generator gen{77, 0};
      const Tensor weights = Tensor::randn(out.shape(), gen, out.dtype()).to(device);
      sum(mul(out, weights)).backward();
      for (const Tensor& leaf : leaves)
        if (leaf.requires_grad() && leaf.grad().defined()) r.grads.push_back(host(leaf.grad()));
    }
    return r;
  };
  const Run cpu = run(Device::cpu());
  PoisonGpu poison;
  const Run gpu = run(kGpu);
  const double forward = relative_error(gpu.out, cpu.out);
  EXPECT_LT(forward, c.tol) << "forward";
  if (c.autocast) {
    EXPECT_GT(forward, 1e-5) << "forward: no sign of bf16 products";
  }
  ASSERT_EQ(gpu.grads.size(), cpu.grads.size());
  for (size_t i = 0; i < cpu.grads.size(); ++i)
    EXPECT_LT(relative_error(gpu.grads[i], cpu.grads[i]), c.tol) << "gradient of input " << i;
}

Tensor randn(Shape shape, uint64_t seed, DType dtype = DType::f32) {
  Generator gen{seed, 0};
  return Tensor::randn(shape, gen, dtype);
}

Tensor rand01(Shape shape, uint64_t seed) {
  Generator gen{seed, 0};
  return Tensor::rand(shape, gen);
}

// The op table: every op with strided, broadcast and masked inputs.
std::vector<OpCheck> op_checks() {
  const Tensor ids = Tensor::from_vector<int64_t>({3, 0, 7, 3, 3, 9, 1, 0}, {2, 4});
  const Tensor targets = Tensor::from_vector<int32_t>({4, -100, 0, 9, 2, 2}, {6});
  const Tensor positions = Tensor::arange(0, 6, DType::i64);
  const Tensor mask = Tensor::from_vector<int32_t>({1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 0, 0}, {2, 6});
  std::vector<OpCheck> checks = {
      {"add broadcast, transposed",
       {randn({5, 3}, 1), randn({3}, 2)},
       [](auto& x) { return add(x[0].transpose(0, 1).transpose(0, 1), x[1]); }},
      {"mul strided",
       {randn({4, 6}, 3), randn({4, 3}, 4)},
       [](auto& x) { return mul(x[0].narrow(1, 1, 3), x[1]); }},
      {"div, sub",
       {randn({7}, 5), add(rand01({7}, 6), 0.5)},
       [](auto& x) { return sub(div(x[0], x[1]), x[1]); }},
      {"unary chain",
       {randn({3, 4}, 7)},
       [](auto& x) { return tanh(add(exp(mul(x[0], 0.5)), pow(neg(x[0]), 2.0))); }},
      {"elu_plus_one, sqrt, log",
       {randn({9}, 8)},
       [](auto& x) { return log(sqrt(add(elu_plus_one(x[0]), 1.0))); }},
      {"gelu", {randn({4, 33}, 9)}, [](auto& x) { return gelu(x[0]); }},
      {"sum over dims",
       {randn({3, 4, 5}, 10)},
       [](auto& x) {
         return sum(x[0].transpose(0, 2), {0, 2});
       }},
      {"max", {randn({3, 7}, 11)}, [](auto& x) { return max(x[0], 1).first; }},
      {"softmax", {randn({4, 37}, 12)}, [](auto& x) { return softmax(x[0]); }},
      {"log_softmax", {randn({4, 37}, 13)}, [](auto& x) { return log_softmax(x[0]); }},
      {"layer_norm",
       {randn({6, 40}, 14), randn({40}, 15), randn({40}, 16)},
       [](auto& x) { return layer_norm(x[0], x[1], x[2], 1e-5); }},
      {"matmul batched, transposed",
       {randn({2, 5, 3}, 17), randn({2, 4, 3}, 18)},
       [](auto& x) { return matmul(x[0], x[1].transpose(1, 2)); }},
      {"matmul broadcast batch",
       {randn({3, 2, 5, 6}, 19), randn({6, 4}, 20)},
       [](auto& x) { return matmul(x[0], x[1]); }},
      {"linear",
       {randn({2, 3, 8}, 21), randn({5, 8}, 22), randn({5}, 23)},
       [](auto& x) { return linear(x[0], x[1], x[2]); }},
      {"gelu_tanh_ffn, unfused width",
       {randn({2, 3, 8}, 38), randn({6, 8}, 39), randn({6}, 44), randn({5, 6}, 45), randn({5}, 46)},
       [](auto& x) { return gelu_tanh_ffn(x[0], x[1], x[2], x[3], x[4]); }},
      {"gelu_tanh_ffn, epilogue width",
       {randn({7, 16}, 47), randn({32, 16}, 48), randn({32}, 49), randn({16, 32}, 50),
        randn({16}, 51)},
       [](auto& x) { return gelu_tanh_ffn(x[0], x[1], x[2], x[3], x[4]); }},
      {"embedding",
       {randn({10, 6}, 24)},
       [ids](auto& x) { return embedding(x[0], ids.to(x[0].device())); }},
      {"index_select",
       {randn({10, 3}, 25)},
       [ids](auto& x) { return index_select(x[0], ids.to(x[0].device()).flatten()); }},
      {"cross_entropy",
       {randn({6, 10}, 26)},
       [targets](auto& x) { return cross_entropy(x[0], targets.to(x[0].device())); }},
      {"rope interleaved",
       {randn({2, 3, 6, 8}, 27)},
       [positions](auto& x) { return rope(x[0], positions.to(x[0].device())); }},
      {"rope half, strided",
       {randn({2, 6, 3, 8}, 28)},
       [positions](auto& x) {
         return rope(x[0].transpose(1, 2), positions.to(x[0].device()), 10000.0, RopeLayout::half);
       }},
      {"attention with a key mask",
       {randn({2, 6, 3, 8}, 29), randn({2, 6, 3, 8}, 30), randn({2, 6, 3, 8}, 31)},
       [mask](auto& x) {
         DropoutContext ctx{1, 0, 0, 0};
         return attention(x[0].transpose(1, 2), x[1].transpose(1, 2), x[2].transpose(1, 2),
                          mask.to(x[0].device()), 0.0, false, ctx, 0.35);
       }},
      {"attention with dropout",
       {randn({2, 2, 5, 4}, 32), randn({2, 2, 6, 4}, 33), randn({2, 2, 6, 4}, 34)},
       [mask](auto& x) {
         DropoutContext ctx{5, 3, 17, 2};  // seed, step, first sequence, site
         return attention(x[0], x[1], x[2], mask.to(x[0].device()), 0.3, true, ctx, 0.5);
       }},
      {"dropout",
       {randn({4, 50}, 35)},
       [](auto& x) {
         DropoutContext ctx{9, 1, 4, 0};
         return dropout(x[0].view({2, 4, 25}), 0.4, true, ctx);
       }},
      {"where, masked_fill, concat",
       {randn({3, 4}, 36), randn({3, 4}, 37)},
       [](auto& x) {
         const Tensor picked = where(x[0], x[0], x[1]);
         return concat({masked_fill(picked, x[1], 2.0), x[1]}, 0);
       }},
  };
  return checks;
}

TEST(CudaOps, EveryOpMatchesTheCpu) {
  RF_REQUIRE_GPU();
  for (const OpCheck& c : op_checks()) check(c);
}

// The table's bf16 column: the ops whose products autocast takes to bf16
// (linear, matmul, attention, the tanh-GELU block), on the GPU under bf16
// against the CPU in f32.
TEST(CudaOps, AutocastOpsMatchTheCpuAtBf16Precision) {
  RF_REQUIRE_GPU();
  int checked = 0;
  for (OpCheck c : op_checks()) {
    if (c.name.rfind("linear", 0) && c.name.rfind("matmul", 0) && c.name.rfind("attention", 0) &&
        c.name.rfind("gelu_tanh_ffn", 0))
      continue;
    c.name += " (bf16 autocast)";
    c.tol = 1e-2;
    c.autocast = true;
    check(c);
    ++checked;
  }
  EXPECT_EQ(checked, 7);
}

TEST(CudaOps, Bf16MatchesTheCpuAtItsPrecision) {
  RF_REQUIRE_GPU();
  check({"linear bf16",
         {randn({4, 16}, 40, DType::bf16), randn({8, 16}, 41, DType::bf16),
          randn({8}, 42, DType::bf16)},
         [](auto& x) { return linear(x[0], x[1], x[2]); },
         1e-2});
  check({"layer_norm + gelu bf16",
         {randn({4, 64}, 43, DType::bf16)},
         [](auto& x) { return gelu(layer_norm(x[0], Tensor(), Tensor(), 1e-5)); },
         1e-2});
}

// The kernel itself (the op table's add_layer_norm takes one dtype): bf16
// activations on an f32 residual stream, the sum formed in f32.
TEST(CudaOps, LayerNormKernelTakesABf16InputOnAnF32Residual) {
  RF_REQUIRE_GPU();
  const int64_t rows = 70, cols = 300;
  const Tensor x = randn({rows, cols}, 52, DType::bf16), residual = randn({rows, cols}, 53);
  const Tensor w = randn({cols}, 54), b = randn({cols}, 55);
  auto run = [&](Device d) {  // y, sum, mean, var
    std::vector<Tensor> o{
        Tensor::empty({rows, cols}, DType::f32, d), Tensor::empty({rows, cols}, DType::f32, d),
        Tensor::empty({rows}, DType::f32, d), Tensor::empty({rows}, DType::f32, d)};
    launch::layer_norm_forward(d, x.to(d), residual.to(d), w.to(d), b.to(d), 1e-5,
                               kernels::ResidualDropout{}, Tensor(), o[0], Tensor(), o[1], o[2],
                               o[3]);
    return o;
  };
  const std::vector<Tensor> cpu = run(Device::cpu());
  PoisonGpu poison;
  const std::vector<Tensor> gpu = run(kGpu);
  EXPECT_EQ(host(gpu[1]), host(cpu[1])) << "sum: one f32 rounding on each device";
  EXPECT_LT(relative_error(host(gpu[0]), host(cpu[0])), 1e-5) << "y";
  EXPECT_LT(relative_error(host(gpu[2]), host(cpu[2])), 1e-5) << "mean";
  EXPECT_LT(relative_error(host(gpu[3]), host(cpu[3])), 1e-5) << "var";
}

// dropout_add_layer_norm on the GPU against dropout then add_layer_norm on the
// GPU, bit for bit, forward and every gradient: what the emulator (built
// without FMA contraction) cannot show, that nvcc does not fuse the dropout's
// scaling into the residual add. The warp kernels (768 columns: RoFormer-
// base's) and the block ones (300), f32, f64, bf16 x on an f32 residual, a
// token stream.
TEST(CudaOps, DropoutAddLayerNormIsThePairBitForBit) {
  RF_REQUIRE_GPU();
  struct Case {
    const char* what;
    Shape shape;
    DType x_dtype, dtype;
    bool stream;
  };
  const Case cases[] = {{"f32, 768", {4, 6, 768}, DType::f32, DType::f32, false},
                        {"f32, 300 (block kernels)", {3, 5, 300}, DType::f32, DType::f32, false},
                        {"f64, 768", {2, 3, 768}, DType::f64, DType::f64, false},
                        {"bf16 x on f32, stream", {20, 768}, DType::bf16, DType::f32, true},
                        {"bf16 x on f32, 300", {20, 300}, DType::bf16, DType::f32, true}};
  std::vector<int64_t> ids;
  for (int64_t t = 0; t < 20; ++t) ids.insert(ids.end(), {t % 3, (t * 7) % 11});
  const Tensor tokens = Tensor::from_vector(ids, {20, 2}).to(kGpu);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const int64_t cols = c.shape.back();
    const Tensor x = randn(c.shape, 60).to(c.x_dtype).to(kGpu).set_requires_grad(true);
    const Tensor r = randn(c.shape, 61).to(c.dtype).to(kGpu).set_requires_grad(true);
    const Tensor w = randn({cols}, 62).to(c.dtype).to(kGpu).set_requires_grad(true);
    const Tensor b = randn({cols}, 63).to(c.dtype).to(kGpu).set_requires_grad(true);
    const Tensor g = randn(c.shape, 64).to(c.dtype).to(kGpu);
    const auto run = [&](bool fused) {
      const FusedResidualDropoutScope scope(fused);
      DropoutContext ctx{3, 9, 2, 1};
      const Tensor y = c.stream ? dropout_add_layer_norm(x, r, w, b, 1e-5, 0.1, true, ctx, tokens)
                                : dropout_add_layer_norm(x, r, w, b, 1e-5, 0.1, true, ctx);
      sum(mul(y, g)).backward();
      std::vector<std::vector<double>> v{host(y)};
      for (const Tensor* t : {&x, &r, &w, &b}) {
        v.push_back(host(t->grad()));
        t->zero_grad();
      }
      return v;
    };
    EXPECT_EQ(run(true), run(false));
  }
}

TEST(CudaOps, EmbeddingGradientIsDeterministic) {
  RF_REQUIRE_GPU();
  Generator gen{3, 0};
  const Tensor ids = Tensor::rand({4096}, gen, DType::f64);
  std::vector<int64_t> v;
  for (double x : ids.to_vector<double>()) v.push_back(int64_t(x * 50));  // many repeats
  const Tensor dev_ids = Tensor::from_vector(v, {4096}, kGpu);
  const Tensor grad = randn({4096, 32}, 4).to(kGpu);
  auto once = [&] {
    Tensor w = Tensor::zeros({50, 32}).to(kGpu).set_requires_grad(true);
    sum(mul(embedding(w, dev_ids), grad)).backward();
    return w.grad().to_vector<float>();
  };
  EXPECT_EQ(once(), once());  // bit for bit
}

// The MLM head's shapes, which the op table's small ones do not reach: rows
// of a whole vocabulary, read in 16-byte packs (bf16 and f32), and the
// accuracy count from the same pass, against the CPU. Every third row is
// aimed at its argmax, so the count is far from zero.
TEST(CudaOps, CrossEntropyOverAVocabularyMatchesTheCpu) {
  RF_REQUIRE_GPU();
  for (const auto& [dtype, rows, cols] :
       {std::tuple{DType::bf16, int64_t(96), int64_t(50000)},
        std::tuple{DType::f32, int64_t(40), int64_t(30522)},
        std::tuple{DType::bf16, int64_t(33), int64_t(21131)}}) {  // rows not in packs
    SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + std::to_string(cols));
    const Tensor logits = mul(randn({rows, cols}, 60), 3.0).to(dtype);
    const std::vector<int64_t> best = argmax(logits, 1).to_vector<int64_t>();
    std::vector<int64_t> t(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r)
      t[size_t(r)] = r % 7 == 3 ? -100 : r % 3 == 0 ? best[size_t(r)] : (r * 389) % cols;
    const Tensor targets = Tensor::from_vector(t, {rows});
    auto run = [&](Device device) {
      const Tensor x = logits.to(device).detach().set_requires_grad(true);
      const CrossEntropyOutputs out = cross_entropy_with_counts(x, targets.to(device));
      out.loss.backward();
      return std::tuple{out.loss.item(), out.count.item(), out.correct.item(), host(x.grad())};
    };
    const auto [loss_cpu, count_cpu, correct_cpu, grad_cpu] = run(Device::cpu());
    PoisonGpu poison;
    const auto [loss_gpu, count_gpu, correct_gpu, grad_gpu] = run(kGpu);
    EXPECT_NEAR(loss_gpu, loss_cpu, 1e-5 * loss_cpu);
    EXPECT_EQ(count_gpu, count_cpu);
    EXPECT_EQ(correct_gpu, correct_cpu);
    EXPECT_GE(correct_cpu, double(rows / 3 - rows / 7 - 1));
    EXPECT_LT(relative_error(grad_gpu, grad_cpu), dtype == DType::bf16 ? 1e-2 : 1e-5);
  }
}

// The embeddings' shapes: rows of 768 f32 gathered in 16-byte words (bit
// for bit: a copy), and the token-type table's two segments of most of the
// batch summed over chunks, against the CPU.
TEST(CudaOps, EmbeddingOfABatchMatchesTheCpu) {
  RF_REQUIRE_GPU();
  const int64_t tokens = 8192, hidden = 768;
  for (const int64_t vocab : {int64_t(2), int64_t(30522)}) {
    SCOPED_TRACE(vocab);
    std::vector<int64_t> v(static_cast<size_t>(tokens));
    for (int64_t n = 0; n < tokens; ++n) v[size_t(n)] = (n * n + 7 * n) % vocab;
    const Tensor ids = Tensor::from_vector(v, {tokens});
    const Tensor table = randn({vocab, hidden}, 61), grad = randn({tokens, hidden}, 62);
    auto run = [&](Device device) {
      const Tensor w = table.to(device).detach().set_requires_grad(true);
      const Tensor out = embedding(w, ids.to(device));
      sum(mul(out, grad.to(device))).backward();
      return std::pair{host(out), host(w.grad())};
    };
    const auto [out_cpu, grad_cpu] = run(Device::cpu());
    PoisonGpu poison;
    const auto [out_gpu, grad_gpu] = run(kGpu);
    EXPECT_EQ(out_gpu, out_cpu);
    EXPECT_LT(relative_error(grad_gpu, grad_cpu), 1e-5);
  }
}

TEST(CudaOps, BadIdsAreReportedAtTheSyncPointWithTheirPosition) {
  RF_REQUIRE_GPU();
  const Tensor w = randn({5, 3}, 1).to(kGpu);
  const Tensor ids = Tensor::from_vector<int64_t>({1, 2, 7, 9}, {4}, kGpu);
  const std::string message = testing::error_of([&] { embedding(w, ids).to_vector<float>(); });
  EXPECT_NE(message.find("7"), std::string::npos) << message;
  EXPECT_NE(message.find("2"), std::string::npos) << message;
}

}  // namespace
}  // namespace roformer
