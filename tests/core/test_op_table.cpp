// The op table: one entry per public op of core/ops.h and per differentiable
// Tensor view, run uniformly (tests/core/op_table.h says how). The per-op
// tests in this folder check each op's own semantics; this table checks that
// every op, in every dtype and on every device, computes the same function
// and the same gradient as its float64 CPU version:
//   - float64: central finite differences against the analytic gradient;
//   - float32 and bfloat16: forward and backward against float64, at
//     per-dtype tolerances (max error over the largest reference value);
//     a dtype an op does not support must fail with its clear error;
//   - float32 under bf16 autocast (core/precision.h: linear, matmul and
//     attention multiply in bf16 with f32 accumulation) against float64 at
//     the bfloat16 tolerances;
//   - every accelerator (CUDA when built and present) against the CPU, with
//     fresh device memory poisoned (NaN) so unwritten elements show, and
//     under bf16 autocast against float64 as on the CPU.
// An op declared in core/ops.h or a view in core/tensor.h without an entry
// fails EveryPublicOpHasAnEntry. The binary prints an op x device x dtype
// coverage table when it ends (run build/tests/core/op_table_tests).
#include <gtest/gtest.h>

#include <fstream>
#include <numeric>
#include <regex>
#include <set>
#include <sstream>

#include "core/cpu/onednn.h"
#include "core/precision.h"
#include "tests/core/op_table.h"

namespace roformer::testing::op_table {
namespace {

using enum Layout;
using X = std::vector<Tensor>;

Tensor i64(std::vector<int64_t> values, Shape shape) {
  return Tensor::from_vector<int64_t>(values, shape);
}
Tensor i32(std::vector<int32_t> values, Shape shape) {
  return Tensor::from_vector<int32_t>(values, shape);
}

std::vector<OpCase> make_table() {
  std::vector<OpCase> t;
  // --- elementwise, broadcasting ---------------------------------------------------------
  t.push_back({.op = "add",
               .name = "add_transposed_plus_row",
               .inputs = {in({3, 4}, transposed), in({4})},
               .build = [](const X& x) { return add(x[0], x[1]); }});
  t.push_back({.op = "add",
               .name = "add_expanded_plus_column",
               .inputs = {in({2, 3, 4}, broadcast), in({3, 1})},
               .build = [](const X& x) { return add(x[0], x[1]); }});
  t.push_back({.op = "sub",
               .name = "sub_strided_minus_column",
               .inputs = {in({3, 4}, strided), in({3, 1})},
               .build = [](const X& x) { return sub(x[0], x[1]); }});
  t.push_back({.op = "mul",
               .name = "mul_transposed_times_contiguous",
               .inputs = {in({2, 3, 4}, transposed), in({2, 3, 4})},
               .build = [](const X& x) { return mul(x[0], x[1]); }});
  t.push_back({.op = "div",
               .name = "div_by_broadcast_row",
               .inputs = {in({3, 4}), in({1, 4}, contiguous, 0.5, 2.0)},
               .build = [](const X& x) { return div(x[0], x[1]); }});
  t.push_back(
      {.op = "add", .name = "add_scalar", .inputs = {in({3, 4}, strided)}, .build = [](const X& x) {
         return add(x[0], 0.75);
       }});
  t.push_back({.op = "sub",
               .name = "sub_scalar",
               .inputs = {in({3, 4}, transposed)},
               .build = [](const X& x) { return sub(x[0], 0.5); }});
  t.push_back({.op = "rsub",
               .name = "rsub_scalar",
               .inputs = {in({3, 4}, transposed)},
               .build = [](const X& x) { return rsub(x[0], 2.0); }});
  t.push_back(
      {.op = "mul", .name = "mul_scalar", .inputs = {in({2, 5}, strided)}, .build = [](const X& x) {
         return mul(x[0], -1.5);
       }});
  t.push_back({.op = "div", .name = "div_scalar", .inputs = {in({2, 5})}, .build = [](const X& x) {
                 return div(x[0], 4.0);
               }});

  // --- elementwise unary -------------------------------------------------------------------
  t.push_back(
      {.op = "neg", .name = "neg", .inputs = {in({3, 4}, strided)}, .build = [](const X& x) {
         return neg(x[0]);
       }});
  t.push_back({.op = "exp",
               .name = "exp",
               .inputs = {in({3, 4}, transposed, -2.0, 2.0)},
               .build = [](const X& x) { return exp(x[0]); }});
  t.push_back({.op = "log",
               .name = "log",
               .inputs = {in({3, 4}, strided, 0.5, 2.0)},
               .build = [](const X& x) { return log(x[0]); }});
  t.push_back({.op = "sqrt",
               .name = "sqrt",
               .inputs = {in({3, 4}, transposed, 0.5, 2.0)},
               .build = [](const X& x) { return sqrt(x[0]); }});
  t.push_back({.op = "rsqrt",
               .name = "rsqrt",
               .inputs = {in({3, 4}, contiguous, 0.5, 2.0)},
               .build = [](const X& x) { return rsqrt(x[0]); }});
  t.push_back({.op = "tanh",
               .name = "tanh",
               .inputs = {in({3, 4}, transposed, -2.0, 2.0)},
               .build = [](const X& x) { return tanh(x[0]); }});
  t.push_back(
      {.op = "pow", .name = "pow_cube", .inputs = {in({3, 4}, strided)}, .build = [](const X& x) {
         return pow(x[0], 3.0);
       }});
  t.push_back({.op = "pow",
               .name = "pow_half",
               .inputs = {in({3, 4}, contiguous, 0.5, 2.0)},
               .build = [](const X& x) { return pow(x[0], 0.5); }});
  t.push_back({.op = "gelu",
               .name = "gelu",
               .inputs = {in({4, 6}, strided, -3.0, 3.0)},
               .build = [](const X& x) { return gelu(x[0]); }});
  t.push_back({.op = "elu_plus_one",
               .name = "elu_plus_one",
               .inputs = {in({4, 6}, transposed, -2.0, 2.0)},
               .build = [](const X& x) { return elu_plus_one(x[0]); }});

  // --- reductions --------------------------------------------------------------------------
  t.push_back({.op = "sum",
               .name = "sum_middle_dim_of_transposed",
               .inputs = {in({2, 3, 4}, transposed)},
               .build = [](const X& x) { return sum(x[0], {1}); }});
  t.push_back({.op = "sum",
               .name = "sum_keepdim_two_dims",
               .inputs = {in({2, 3, 4})},
               .build = [](const X& x) {
                 return sum(x[0], {0, 2}, true);
               }});
  t.push_back({.op = "sum",
               .name = "sum_all_strided",
               .inputs = {in({3, 5}, strided)},
               .build = [](const X& x) { return sum(x[0]); }});
  t.push_back({.op = "mean",
               .name = "mean_last_dim",
               .inputs = {in({3, 4}, transposed)},
               .build = [](const X& x) { return mean(x[0], {-1}); }});
  t.push_back({.op = "mean",
               .name = "mean_all",
               .inputs = {in({2, 3}, broadcast)},
               .build = [](const X& x) { return mean(x[0]); }});
  t.push_back({.op = "max",
               .name = "max_values",
               .inputs = {in({3, 5}, transposed)},
               .build = [](const X& x) { return max(x[0], 1).first; }});
  t.push_back({.op = "argmax",
               .name = "argmax",
               .inputs = {in({4, 6}, strided)},
               .build = [](const X& x) { return argmax(x[0], -1); },
               .grad = false,
               .fd = false,
               .no_fd_reason = "integer output"});
  t.push_back({.op = "sum_to",
               .name = "sum_to",
               .inputs = {in({2, 3, 4}, transposed)},
               .build = [](const X& x) {
                 return sum_to(x[0], {3, 1});
               }});

  // --- matrix products ---------------------------------------------------------------------
  t.push_back({.op = "matmul",
               .name = "matmul_transposed_times_shared",
               .inputs = {in({2, 3, 4}, transposed), in({4, 5})},
               .build = [](const X& x) { return matmul(x[0], x[1]); }});
  t.push_back({.op = "matmul",
               .name = "matmul_broadcast_batch_transposed_b",
               .inputs = {in({2, 2, 3, 4}), in({2, 1, 4, 5}, transposed)},
               .build = [](const X& x) { return matmul(x[0], x[1]); }});
  t.push_back({.op = "linear",
               .name = "linear_with_bias",
               .inputs = {in({2, 3, 4}), in({5, 4}), in({5})},
               .build = [](const X& x) { return linear(x[0], x[1], x[2]); }});
  t.push_back({.op = "linear",
               .name = "linear_strided_input_transposed_weight",
               .inputs = {in({6, 4}, strided), in({5, 4}, transposed)},
               .build = [](const X& x) { return linear(x[0], x[1]); }});
  t.push_back({.op = "stacked_linear",
               .name = "stacked_linear_three_parts",
               .inputs = {in({2, 3, 4}), in({5, 4}), in({3, 4}, transposed), in({5, 4}), in({5}),
                          in({3}), in({5})},
               .build = [](const X& x) {
                 return stacked_linear(x[0], {x[1], x[2], x[3]}, {x[4], x[5], x[6]}, x[0].dtype());
               }});
  t.push_back({.op = "stacked_linear",
               .name = "stacked_linear_no_bias_strided_input",
               .inputs = {in({6, 4}, strided), in({2, 4}), in({3, 4})},
               .build = [](const X& x) {
                 return stacked_linear(x[0], {x[1], x[2]}, {Tensor(), Tensor()}, x[0].dtype());
               }});
  t.push_back(
      {.op = "gelu_tanh_ffn",
       .name = "gelu_tanh_ffn",
       .inputs = {in({2, 3, 4}, contiguous, -2.0, 2.0), in({6, 4}), in({6}), in({5, 6}), in({5})},
       .build = [](const X& x) { return gelu_tanh_ffn(x[0], x[1], x[2], x[3], x[4]); }});
  // 16 inner features: on CUDA the cuBLASLt epilogue path (a multiple of 8),
  // with a strided input and a transposed weight.
  t.push_back({.op = "gelu_tanh_ffn",
               .name = "gelu_tanh_ffn_epilogue_width",
               .inputs = {in({5, 4}, strided, -2.0, 2.0), in({16, 4}, transposed), in({16}),
                          in({3, 16}), in({3})},
               .build = [](const X& x) { return gelu_tanh_ffn(x[0], x[1], x[2], x[3], x[4]); }});
  // bf16 activations (core/precision.h): in the autocast columns the first
  // product writes bf16 (its bias in bf16) and the second reads it as it is;
  // elsewhere activation_dtype is the input's dtype.
  t.push_back({.op = "linear",
               .name = "linear_of_bf16_activations",
               .inputs = {in({2, 3, 8}), in({16, 8}), in({16}), in({5, 16}), in({5})},
               .build = [](const X& x) {
                 const Tensor h = linear(x[0], x[1], x[2], activation_dtype(x[0]));
                 return linear(h, x[3], x[4], x[0].dtype());
               }});
  t.push_back({.op = "gelu_tanh_ffn",
               .name = "gelu_tanh_ffn_bf16_activations_epilogue_width",
               .inputs = {in({5, 4}, strided, -2.0, 2.0), in({16, 4}, transposed), in({16}),
                          in({8, 16}), in({8})},
               .build = [](const X& x) {
                 return gelu_tanh_ffn(x[0], x[1], x[2], x[3], x[4], activation_dtype(x[0]));
               }});

  // --- normalisation and probabilities -----------------------------------------------------
  t.push_back({.op = "softmax",
               .name = "softmax",
               .inputs = {in({3, 5}, transposed, -3.0, 3.0)},
               .build = [](const X& x) { return softmax(x[0]); }});
  t.push_back({.op = "log_softmax",
               .name = "log_softmax",
               .inputs = {in({2, 3, 5}, strided, -3.0, 3.0)},
               .build = [](const X& x) { return log_softmax(x[0]); }});
  t.push_back(
      {.op = "layer_norm",
       .name = "layer_norm",
       .inputs = {in({2, 3, 8}, contiguous, -2.0, 2.0), in({8}, contiguous, 0.5, 1.5), in({8})},
       .build = [](const X& x) { return layer_norm(x[0], x[1], x[2], 1e-5); }});
  t.push_back({.op = "layer_norm",
               .name = "layer_norm_transposed_no_bias",
               .inputs = {in({4, 6}, transposed, -2.0, 2.0), in({6}, strided, 0.5, 1.5)},
               .build = [](const X& x) { return layer_norm(x[0], x[1], Tensor(), 1e-5); }});
  t.push_back({.op = "layer_norm",
               .name = "layer_norm_no_affine",
               .inputs = {in({3, 8}, strided, -2.0, 2.0)},
               .build = [](const X& x) { return layer_norm(x[0], Tensor(), Tensor(), 1e-5); }});
  t.push_back(
      {.op = "add_layer_norm",
       .name = "add_layer_norm",
       .inputs = {in({2, 3, 8}, contiguous, -2.0, 2.0), in({2, 3, 8}, transposed, -1.0, 1.0),
                  in({8}, contiguous, 0.5, 1.5), in({8})},
       .build = [](const X& x) { return add_layer_norm(x[0], x[1], x[2], x[3], 1e-5); }});
  t.push_back(
      {.op = "add_layer_norm",
       .name = "add_layer_norm_strided_no_affine",
       .inputs = {in({4, 6}, strided, -2.0, 2.0), in({4, 6}, contiguous, -2.0, 2.0)},
       .build = [](const X& x) { return add_layer_norm(x[0], x[1], Tensor(), Tensor(), 1e-5); }});

  // The residual dropout inside the layer-norm kernels (padded rows and a
  // token stream), against f64 finite differences with the mask fixed.
  t.push_back(
      {.op = "dropout_add_layer_norm",
       .name = "dropout_add_layer_norm",
       .inputs = {in({2, 3, 8}, contiguous, -2.0, 2.0), in({2, 3, 8}, transposed, -1.0, 1.0),
                  in({8}, contiguous, 0.5, 1.5), in({8})},
       .build = [](const X& x) {
         DropoutContext ctx{7, 1, 2};  // the same mask in every run
         return dropout_add_layer_norm(x[0], x[1], x[2], x[3], 1e-5, 0.3, true, ctx);
       }});
  t.push_back({.op = "dropout_add_layer_norm",
               .name = "dropout_add_layer_norm_token_stream",
               .inputs = {in({5, 16}, strided, -2.0, 2.0), in({5, 16}, contiguous, -1.0, 1.0),
                          fixed(i64({0, 0, 0, 1, 0, 2, 1, 0, 1, 1}, {5, 2}))},
               .build = [](const X& x) {
                 DropoutContext ctx{7, 2, 3};
                 return dropout_add_layer_norm(x[0], x[1], Tensor(), Tensor(), 1e-5, 0.3, true, ctx,
                                               x[2]);
               }});

  // --- training-specific -------------------------------------------------------------------
  t.push_back({.op = "dropout",
               .name = "dropout",
               .inputs = {in({4, 8}, strided)},
               .build = [](const X& x) {
                 DropoutContext ctx{7, 0, 0};  // the same mask in every run
                 return dropout(x[0], 0.3, /*training=*/true, ctx);
               }});
  t.push_back(
      {.op = "dropout",
       .name = "dropout_token_stream",
       .inputs = {in({5, 8}, contiguous), fixed(i64({0, 0, 0, 1, 0, 2, 1, 0, 1, 1}, {5, 2}))},
       .build = [](const X& x) {
         DropoutContext ctx{7, 2, 3};  // the same mask in every run
         return dropout(x[0], 0.3, /*training=*/true, ctx, x[1]);
       }});
  t.push_back({.op = "embedding",
               .name = "embedding_repeated_ids",
               .inputs = {in({7, 4}, strided), fixed(i64({1, 3, 3, 0, 6, 1}, {2, 3}))},
               .build = [](const X& x) { return embedding(x[0], x[1]); }});
  t.push_back(
      {.op = "cross_entropy",
       .name = "cross_entropy_with_ignored_row",
       .inputs = {in({6, 5}, transposed, -2.0, 2.0), fixed(i64({0, 4, -100, 2, 2, 1}, {6}))},
       .build = [](const X& x) { return cross_entropy(x[0], x[1]); }});
  // The loss with its count: the loss is the differentiable output, and the
  // count (4 rows not ignored) must match what the loss was divided by.
  t.push_back(
      {.op = "cross_entropy_with_counts",
       .name = "cross_entropy_with_counts",
       .inputs = {in({6, 5}, strided, -2.0, 2.0), fixed(i64({0, 4, -100, 2, -100, 1}, {6}))},
       .build = [](const X& x) {
         auto [loss, count, correct] = cross_entropy_with_counts(x[0], x[1]);
         if (count.item() != 4.0) throw Error("cross_entropy_with_counts: count is not 4");
         // The rows whose argmax is the target, against argmax itself.
         const auto best = argmax(x[0].detach(), 1).to_vector<int64_t>();
         const auto t = x[1].to_vector<int64_t>();
         int64_t hits = 0;
         for (size_t r = 0; r < t.size(); ++r) hits += t[r] != -100 && best[r] == t[r];
         if (correct.item() != double(hits))
           throw Error(detail::concat("cross_entropy_with_counts: correct is ", correct.item(),
                                      ", argmax says ", hits));
         return loss;
       }});
  t.push_back({.op = "rope",
               .name = "rope_interleaved_heads_layout",
               .inputs = {in({2, 3, 6, 4}, heads), fixed(i64({0, 1, 2, 3, 4, 5}, {6}))},
               .build = [](const X& x) { return rope(x[0], x[1], 100.0); }});
  t.push_back({.op = "rope",
               .name = "rope_half_offset_positions",
               .inputs = {in({2, 5, 8}, strided), fixed(i32({3, 4, 5, 6, 7}, {5}))},
               .build = [](const X& x) { return rope(x[0], x[1], 100.0, RopeLayout::half); }});
  t.push_back({
      .op = "attention",
      .name = "attention_padding_mask",
      .inputs = {in({2, 2, 5, 4}, heads, -2.0, 2.0), in({2, 2, 5, 4}, heads, -2.0, 2.0),
                 in({2, 2, 5, 4}, heads), fixed(i32({1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, {2, 5}))},
      .build =
          [](const X& x) {
            DropoutContext ctx{0, 0, 0};
            return attention(x[0], x[1], x[2], x[3], 0.0, false, ctx, 0.5);
          },
  });
  t.push_back({
      .op = "attention",
      .name = "attention_dropout_cross_lengths",
      .inputs = {in({2, 2, 3, 4}, contiguous, -2.0, 2.0), in({2, 2, 5, 4}, heads, -2.0, 2.0),
                 in({2, 2, 5, 6}, transposed)},
      .build =
          [](const X& x) {
            DropoutContext ctx{11, 0, 0};  // the same dropout mask in every run
            return attention(x[0], x[1], x[2], Tensor(), 0.25, true, ctx, 0.5);
          },
  });

  // cuDNN's fused attention where it takes the call (CUDA under bf16
  // autocast: the "cuda autocast" cell), attention()'s kernels elsewhere.
  // Head dim 16: cuDNN takes multiples of 8, and the f64 finite differences stay quick.
  t.push_back({
      .op = "cudnn_attention",
      .name = "cudnn_attention_padding_mask",
      .inputs = {in({2, 2, 5, 16}, heads, -1.0, 1.0), in({2, 2, 5, 16}, heads, -1.0, 1.0),
                 in({2, 2, 5, 16}, heads), fixed(i32({1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, {2, 5}))},
      .build =
          [](const X& x) {
            DropoutContext ctx{0, 0, 0};
            return cudnn_attention(x[0], x[1], x[2], x[3], 0.0, false, ctx, 0.25);
          },
  });

  // Three segments of a 9-token stream (tokens 5 and 8 in none): rows 0, 0, 1.
  t.push_back({
      .op = "varlen_attention",
      .name = "varlen_attention_segments",
      .inputs = {in({9, 2, 4}, contiguous, -2.0, 2.0), in({9, 2, 4}, strided, -2.0, 2.0),
                 in({9, 2, 3}, transposed),
                 fixed(i64({0, 3, 0, 0, 3, 2, 0, 3, 6, 2, 1, 0}, {3, 4}))},
      .build =
          [](const X& x) {
            DropoutContext ctx{0, 0, 0};
            return varlen_attention(x[0], x[1], x[2], x[3], 0.0, false, ctx, 0.5);
          },
  });
  t.push_back({
      .op = "varlen_attention",
      .name = "varlen_attention_dropout",
      .inputs = {in({40, 2, 4}, contiguous, -2.0, 2.0), in({40, 2, 4}, contiguous, -2.0, 2.0),
                 in({40, 2, 4}), fixed(i64({0, 35, 0, 0, 35, 5, 1, 0}, {2, 4}))},
      .build =
          [](const X& x) {
            DropoutContext ctx{7, 3, 2};  // the same dropout mask in every run
            return varlen_attention(x[0], x[1], x[2], x[3], 0.2, true, ctx, 0.5);
          },
  });

  // RoPE inside attention: rotary positions [S] (padded) or per token [T].
  t.push_back({
      .op = "rope_attention",
      .name = "rope_attention_interleaved_padding_mask",
      .inputs = {in({2, 2, 5, 4}, heads, -2.0, 2.0), in({2, 2, 5, 4}, strided, -2.0, 2.0),
                 in({2, 2, 5, 4}, heads), fixed(i32({1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, {2, 5})),
                 fixed(i64({0, 1, 2, 3, 4}, {5}))},
      .build =
          [](const X& x) {
            DropoutContext ctx{0, 0, 0};
            return rope_attention(x[0], x[1], x[2], x[3], {x[4], 100.0}, 0.0, false, ctx, 0.5);
          },
  });
  t.push_back({
      .op = "rope_attention",
      .name = "rope_attention_half_dropout",
      .inputs = {in({2, 2, 6, 4}, contiguous, -2.0, 2.0), in({2, 2, 6, 4}, heads, -2.0, 2.0),
                 in({2, 2, 6, 6}, transposed), fixed(i64({3, 4, 5, 6, 7, 8}, {6}))},
      .build =
          [](const X& x) {
            DropoutContext ctx{11, 0, 0};  // the same dropout mask in every run
            return rope_attention(x[0], x[1], x[2], Tensor(), {x[3], 100.0, RopeLayout::half}, 0.25,
                                  true, ctx, 0.5);
          },
  });
  t.push_back({
      .op = "varlen_rope_attention",
      .name = "varlen_rope_attention_segments",
      .inputs = {in({9, 2, 4}, contiguous, -2.0, 2.0), in({9, 2, 4}, strided, -2.0, 2.0),
                 in({9, 2, 3}, transposed),
                 fixed(i64({0, 3, 0, 0, 3, 2, 0, 3, 6, 2, 1, 0}, {3, 4})),
                 fixed(i64({0, 1, 2, 3, 4, 0, 0, 1, 0}, {9}))},
      .build =
          [](const X& x) {
            const RotateOnceScope inside(false);  // RoPE inside the kernels
            DropoutContext ctx{0, 0, 0};
            return varlen_rope_attention(x[0], x[1], x[2], x[3], {x[4], 100.0}, 0.0, false, ctx,
                                         0.5);
          },
  });
  t.push_back({
      .op = "varlen_rope_attention",
      .name = "varlen_rope_attention_half_dropout",
      .inputs = {in({40, 2, 4}, contiguous, -2.0, 2.0), in({40, 2, 4}, contiguous, -2.0, 2.0),
                 in({40, 2, 4}), fixed(i64({0, 35, 0, 0, 35, 5, 1, 0}, {2, 4})),
                 fixed(i64({0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13,
                            14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27,
                            28, 29, 30, 31, 32, 33, 34, 0,  1,  2,  3,  4},
                           {40}))},
      .build =
          [](const X& x) {
            const RotateOnceScope inside(false);  // RoPE inside the kernels
            DropoutContext ctx{7, 3, 2};          // the same dropout mask in every run
            return varlen_rope_attention(x[0], x[1], x[2], x[3], {x[4], 100.0, RopeLayout::half},
                                         0.2, true, ctx, 0.5);
          },
  });

  // 24 tokens in two segments (17 and 7 long) that cover them all: the
  // head-dim-64 cases below, whose outputs are then not zero-filled.
  std::vector<int64_t> positions(17);
  std::iota(positions.begin(), positions.end(), 0);
  for (int64_t p = 0; p < 7; ++p) positions.push_back(p);
  const Tensor covering_segments = i64({0, 17, 0, 0, 17, 7, 1, 0}, {2, 4});
  const Tensor covering_positions = i64(positions, {24});

  // q, k and v packed side by side [T, 3 * H * D] (a layer's stacked
  // projections): one gradient, written part by part.
  t.push_back({
      .op = "varlen_attention_packed",
      .name = "varlen_attention_packed_rope_segments",
      .inputs = {in({9, 24}, contiguous, -2.0, 2.0),
                 fixed(i64({0, 3, 0, 0, 3, 2, 0, 3, 6, 2, 1, 0}, {3, 4})),
                 fixed(i64({0, 1, 2, 3, 4, 0, 0, 1, 0}, {9}))},
      .build =
          [](const X& x) {
            const RotateOnceScope inside(false);  // RoPE inside the kernels
            DropoutContext ctx{0, 0, 0};
            return varlen_attention_packed(x[0], 2, x[1], RotaryEmbedding{x[2], 100.0}, 0.0, false,
                                           ctx, 0.5);
          },
  });
  t.push_back({
      .op = "varlen_attention_packed",
      .name = "varlen_attention_packed_no_rope_dropout_strided",
      .inputs = {in({12, 12}, strided, -2.0, 2.0), fixed(i64({0, 7, 0, 0, 7, 5, 1, 0}, {2, 4}))},
      .build =
          [](const X& x) {
            DropoutContext ctx{7, 3, 2};  // the same dropout mask in every run
            return varlen_attention_packed(x[0], 1, x[1], std::nullopt, 0.2, true, ctx, 0.5);
          },
  });
  t.push_back({
      .op = "varlen_attention_packed",
      .name = "varlen_attention_packed_head_dim_64_every_token",
      .inputs = {in({24, 384}, contiguous, -1.0, 1.0), fixed(covering_segments),
                 fixed(covering_positions)},
      .build =
          [](const X& x) {
            const RotateOnceScope inside(false);  // RoPE inside the kernels
            DropoutContext ctx{5, 2, 1};          // the same dropout mask in every run
            return varlen_attention_packed(x[0], 2, x[1], RotaryEmbedding{x[2], 100.0}, 0.1, true,
                                           ctx, 0.125);
          },
      .fd = false,
      .no_fd_reason = "the op's finite differences run on its head-dim-4 cases; this one is for "
                      "the device kernels of head dim 64 with q, k, v and their gradients strided",
  });

  // RoPE by rotated copies (set_rotate_once): the plain forward on them, the
  // backward kernel reading them and rotating dq and dk back into qkv's
  // parts; the same function, with a token in no segment, half pairs and
  // dropout, and at head dim 64 for the device kernels.
  t.push_back({
      .op = "varlen_attention_packed",
      .name = "varlen_attention_packed_rope_rotated_once",
      .inputs = {in({9, 24}, contiguous, -2.0, 2.0),
                 fixed(i64({0, 3, 0, 0, 3, 2, 0, 3, 6, 2, 1, 0}, {3, 4})),
                 fixed(i64({0, 1, 2, 3, 4, 0, 0, 1, 0}, {9}))},
      .build =
          [](const X& x) {
            const RotateOnceScope once(true);
            DropoutContext ctx{3, 1, 0};  // the same dropout mask in every run
            return varlen_attention_packed(
                x[0], 2, x[1], RotaryEmbedding{x[2], 100.0, RopeLayout::half}, 0.1, true, ctx, 0.5);
          },
  });
  t.push_back({
      .op = "varlen_attention_packed",
      .name = "varlen_attention_packed_head_dim_64_rotated_once",
      .inputs = {in({24, 384}, contiguous, -1.0, 1.0), fixed(covering_segments),
                 fixed(covering_positions)},
      .build =
          [](const X& x) {
            const RotateOnceScope once(true);
            DropoutContext ctx{5, 2, 1};  // the same dropout mask in every run
            return varlen_attention_packed(x[0], 2, x[1], RotaryEmbedding{x[2], 100.0}, 0.1, true,
                                           ctx, 0.125);
          },
      .fd = false,
      .no_fd_reason = "the rotated-once path's finite differences run on its head-dim-4 case; "
                      "this one is for the device kernels of head dim 64",
  });

  // Head dim 64 (the flash kernels under autocast on CUDA), every token in a
  // segment: the op then allocates its outputs and gradients without a zero
  // fill, so the poisoned CUDA allocations show any element the kernels skip.
  t.push_back({
      .op = "varlen_rope_attention",
      .name = "varlen_rope_attention_head_dim_64_every_token",
      .inputs = {in({24, 2, 64}, contiguous, -1.0, 1.0), in({24, 2, 64}, contiguous, -1.0, 1.0),
                 in({24, 2, 64}), fixed(covering_segments), fixed(covering_positions)},
      .build =
          [](const X& x) {
            const RotateOnceScope inside(false);  // RoPE inside the kernels
            DropoutContext ctx{5, 2, 1};          // the same dropout mask in every run
            return varlen_rope_attention(x[0], x[1], x[2], x[3], {x[4], 100.0}, 0.1, true, ctx,
                                         0.125);
          },
      .fd = false,
      .no_fd_reason = "the op's finite differences run on its head-dim-4 cases; this one is for "
                      "the device kernels of head dim 64 (35 s of f64 differences on the CPU)",
  });

  // --- structure -----------------------------------------------------------------------------
  t.push_back({.op = "concat",
               .name = "concat_transposed_and_contiguous",
               .inputs = {in({2, 3}, transposed), in({2, 2})},
               .build = [](const X& x) {
                 return concat({x[0], x[1]}, 1);
               }});
  t.push_back({.op = "stack",
               .name = "stack",
               .inputs = {in({3, 4}), in({3, 4}, strided)},
               .build = [](const X& x) {
                 return stack({x[0], x[1]}, 0);
               }});
  t.push_back({.op = "split",
               .name = "split_then_swap",
               .inputs = {in({2, 5}, transposed)},
               .build = [](const X& x) {
                 const auto parts = split(x[0], {2, 3}, 1);
                 return concat({parts[1], parts[0]}, 1);
               }});
  t.push_back(
      {.op = "where",
       .name = "where_broadcast_b",
       .inputs = {fixed(i32({1, 0, 0, 1, 1, 1, 0, 0, 0, 1, 0, 1}, {3, 4})), in({3, 4}), in({4})},
       .build = [](const X& x) { return where(x[0], x[1], x[2]); }});
  t.push_back({.op = "masked_fill",
               .name = "masked_fill_row_mask",
               .inputs = {in({3, 4}, transposed), fixed(i32({0, 1, 1, 0}, {1, 4}))},
               .build = [](const X& x) { return masked_fill(x[0], x[1], -1.5); }});
  t.push_back({.op = "cast",
               .name = "cast_to_f64",
               .inputs = {in({3, 4}, strided)},
               .build = [](const X& x) { return cast(x[0], DType::f64); }});
  t.push_back({.op = "cast",
               .name = "cast_to_bf16",
               .inputs = {in({3, 4}, transposed)},
               .build = [](const X& x) { return cast(x[0], DType::bf16); },
               .fd = false,
               .no_fd_reason = "bfloat16 output: differences of rounded values mean nothing"});
  t.push_back({.op = "index_select",
               .name = "index_select_repeated",
               .inputs = {in({5, 3}, strided), fixed(i64({4, 0, 4, 2}, {4}))},
               .build = [](const X& x) { return index_select(x[0], x[1]); }});

  // --- larger shapes: vector tails, chunked rows, parallel loops ---------------------------
  t.push_back({.op = "softmax",
               .name = "softmax_wide_rows",
               .inputs = {in({7, 300}, strided, -4.0, 4.0)},
               .build = [](const X& x) { return softmax(x[0]); }});
  t.push_back(
      {.op = "layer_norm",
       .name = "layer_norm_wide_rows",
       .inputs = {in({5, 200}, contiguous, -2.0, 2.0), in({200}, contiguous, 0.5, 1.5), in({200})},
       .build = [](const X& x) { return layer_norm(x[0], x[1], x[2], 1e-12); }});
  t.push_back({.op = "matmul",
               .name = "matmul_odd_sizes",
               .inputs = {in({2, 37, 9}, transposed), in({9, 23})},
               .build = [](const X& x) { return matmul(x[0], x[1]); },
               .tol_bf16 = 2e-2});
  // Segments of sorted ids longer than the CUDA kernel's 256-row chunks
  // (gather.cu): id 0 ends exactly at a chunk end, id 1 spans three chunks
  // and ends inside one; the ids come in a scrambled order.
  t.push_back({.op = "embedding",
               .name = "embedding_long_segments",
               .inputs = {in({3, 40}), fixed(i64(
                                           [] {
                                             std::vector<int64_t> ids(1536);
                                             for (int64_t i = 0; i < 1536; ++i) {
                                               const int64_t r = i * 7 % 1536;
                                               ids[size_t(i)] = r < 768 ? 0 : r < 1368 ? 1 : 2;
                                             }
                                             return ids;
                                           }(),
                                           {1536}))},
               .build = [](const X& x) { return embedding(x[0], x[1]); }});
  t.push_back({.op = "embedding",
               .name = "embedding_wide_rows",
               .inputs = {in({50, 80}), fixed(i64(
                                            [] {
                                              std::vector<int64_t> ids;
                                              for (int i = 0; i < 51; ++i)
                                                ids.push_back(i * 7 % 50);
                                              return ids;
                                            }(),
                                            {3, 17}))},
               .build = [](const X& x) { return embedding(x[0], x[1]); }});
  t.push_back({.op = "rope",
               .name = "rope_long_sequence",
               .inputs = {in({2, 2, 33, 32}, heads), fixed(Tensor::arange(0, 33))},
               .build = [](const X& x) { return rope(x[0], x[1]); }});
  t.push_back({
      .op = "attention",
      .name = "attention_long_masked_dropout",
      .inputs = {in({1, 1, 37, 8}, heads, -2.0, 2.0), in({1, 1, 37, 8}, heads, -2.0, 2.0),
                 in({1, 1, 37, 8}, heads), fixed([] {
                   std::vector<int32_t> m(37, 1);
                   for (int i = 30; i < 37; ++i) m[size_t(i)] = 0;
                   return i32(m, {1, 37});
                 }())},
      .build =
          [](const X& x) {
            DropoutContext ctx{5, 0, 0};
            return attention(x[0], x[1], x[2], x[3], 0.1, true, ctx, 0.25);
          },
  });
  t.push_back(
      {.op = "cross_entropy",
       .name = "cross_entropy_many_classes",
       .inputs = {in({9, 2500}, contiguous, -3.0, 3.0),
                  fixed(i64({0, 2499, 1024, -100, 1023, 7, 2048, 3, 999}, {9}))},
       .build = [](const X& x) { return cross_entropy(x[0], x[1]); },
       .fd = false,
       .no_fd_reason = "22,500 logits; cross_entropy_with_ignored_row checks the gradient"});
  t.push_back({.op = "gelu",
               .name = "gelu_large",
               .inputs = {in({300, 257}, contiguous, -4.0, 4.0)},
               .build = [](const X& x) { return gelu(x[0]); },
               .fd = false,
               .no_fd_reason = "77,100 elements; gelu checks the gradient"});
  t.push_back({.op = "dropout",
               .name = "dropout_large",
               .inputs = {in({300, 257})},
               .build =
                   [](const X& x) {
                     DropoutContext ctx{3, 5, 0};
                     return dropout(x[0], 0.1, /*training=*/true, ctx);
                   },
               .fd = false,
               .no_fd_reason = "77,100 elements; dropout checks the gradient"});
  t.push_back({.op = "sum",
               .name = "sum_large_rows",
               .inputs = {in({64, 1100}, transposed)},
               .build = [](const X& x) { return sum(x[0], {0}); },
               .fd = false,
               .no_fd_reason = "70,400 elements; the small sum entries check the gradient"});

  // --- edge shapes and index layouts ------------------------------------------------------
  t.push_back({.op = "add",
               .name = "add_zero_dim_plus_matrix",
               .inputs = {in({}), in({3, 4}, transposed)},
               .build = [](const X& x) { return add(x[0], x[1]); }});
  t.push_back({.op = "mul",
               .name = "mul_zero_size_rows",
               .inputs = {in({0, 4}), in({4})},
               .build = [](const X& x) { return mul(x[0], x[1]); }});
  t.push_back({.op = "sum", .name = "sum_of_zero_dim", .inputs = {in({})}, .build = [](const X& x) {
                 return sum(x[0]);
               }});
  t.push_back({.op = "max",
               .name = "max_keepdim_negative_dim",
               .inputs = {in({2, 3, 4}, strided)},
               .build = [](const X& x) { return max(x[0], -2, true).first; }});
  t.push_back({.op = "softmax",
               .name = "softmax_single_column",
               .inputs = {in({4, 1})},
               .build = [](const X& x) { return softmax(x[0]); }});
  t.push_back({.op = "layer_norm",
               .name = "layer_norm_single_column",
               .inputs = {in({4, 1}), in({1}), in({1})},
               .build = [](const X& x) { return layer_norm(x[0], x[1], x[2], 1e-5); }});
  t.push_back({.op = "cross_entropy",
               .name = "cross_entropy_every_row_ignored",
               .inputs = {in({3, 4}), fixed(i64({-100, -100, -100}, {3}))},
               .build = [](const X& x) { return cross_entropy(x[0], x[1]); }});
  t.push_back({.op = "embedding",
               .name = "embedding_transposed_i32_ids",
               .inputs = {in({6, 3}), fixed(i32({0, 5, 2, 2, 4, 1}, {3, 2}).transpose(0, 1))},
               .build = [](const X& x) { return embedding(x[0], x[1]); }});
  t.push_back({.op = "index_select",
               .name = "index_select_strided_indices",
               .inputs = {in({5, 2, 3}), fixed(i64({4, 9, 1, 9, 1, 9}, {3, 2}).select(1, 0))},
               .build = [](const X& x) { return index_select(x[0], x[1]); }});
  t.push_back({.op = "rope",
               .name = "rope_strided_positions",
               .inputs = {in({3, 4}), fixed(i64({5, 0, 6, 0, 7, 0}, {3, 2}).select(1, 0))},
               .build = [](const X& x) { return rope(x[0], x[1], 100.0); }});
  t.push_back({.op = "where",
               .name = "where_float_transposed_condition",
               .inputs = {fixed(Tensor::from_vector<float>({0.f, 1.f, 2.f, 0.f, -1.f, 0.f}, {2, 3})
                                    .transpose(0, 1)),
                          in({3, 2}), in({3, 2}, strided)},
               .build = [](const X& x) { return where(x[0], x[1], x[2]); }});
  t.push_back({.op = "split",
               .name = "split_with_empty_part",
               .inputs = {in({2, 5})},
               .build = [](const X& x) {
                 const auto parts = split(x[0], {0, 5}, 1);
                 return concat({parts[1], parts[0]}, 1);
               }});
  t.push_back({.op = "concat",
               .name = "concat_negative_dim",
               .inputs = {in({2, 3}, strided), in({2, 1})},
               .build = [](const X& x) {
                 return concat({x[0], x[1]}, -1);
               }});
  t.push_back({.op = "matmul",
               .name = "matmul_vector_like",
               .inputs = {in({1, 4}), in({4, 1}, transposed)},
               .build = [](const X& x) { return matmul(x[0], x[1]); }});
  t.push_back({.op = "linear",
               .name = "linear_expanded_input",
               .inputs = {in({3, 4}, broadcast), in({2, 4}), in({2})},
               .build = [](const X& x) { return linear(x[0], x[1], x[2]); }});

  // --- only some inputs take a gradient (the nodes save less) ------------------------------
  t.push_back({.op = "mul",
               .name = "mul_gradient_to_a_only",
               .inputs = {in({3, 4}, strided), no_grad(in({4}))},
               .build = [](const X& x) { return mul(x[0], x[1]); }});
  t.push_back({.op = "div",
               .name = "div_gradient_to_denominator_only",
               .inputs = {no_grad(in({3, 4})), in({3, 1}, contiguous, 0.5, 2.0)},
               .build = [](const X& x) { return div(x[0], x[1]); }});
  t.push_back({.op = "matmul",
               .name = "matmul_gradient_to_b_only",
               .inputs = {no_grad(in({2, 3, 4})), in({4, 5}, transposed)},
               .build = [](const X& x) { return matmul(x[0], x[1]); }});
  t.push_back({.op = "linear",
               .name = "linear_gradient_to_parameters_only",
               .inputs = {no_grad(in({2, 3, 4}, transposed)), in({5, 4}), in({5})},
               .build = [](const X& x) { return linear(x[0], x[1], x[2]); }});
  t.push_back(
      {.op = "stacked_linear",
       .name = "stacked_linear_gradient_to_some_parts_only",
       .inputs = {in({2, 3, 4}), no_grad(in({5, 4})), in({3, 4}), in({5}), no_grad(in({3}))},
       .build = [](const X& x) {
         return stacked_linear(x[0], {x[1], x[2]}, {x[3], x[4]}, x[0].dtype());
       }});
  t.push_back({.op = "layer_norm",
               .name = "layer_norm_gradient_to_input_only",
               .inputs = {in({3, 8}, contiguous, -2.0, 2.0), no_grad(in({8}, contiguous, 0.5, 1.5)),
                          no_grad(in({8}))},
               .build = [](const X& x) { return layer_norm(x[0], x[1], x[2], 1e-5); }});
  t.push_back({
      .op = "attention",
      .name = "attention_gradient_to_v_only",
      .inputs = {no_grad(in({1, 2, 4, 4}, heads, -2.0, 2.0)),
                 no_grad(in({1, 2, 4, 4}, heads, -2.0, 2.0)), in({1, 2, 4, 4}, heads)},
      .build =
          [](const X& x) {
            DropoutContext ctx{0, 0, 0};
            return attention(x[0], x[1], x[2], Tensor(), 0.0, false, ctx, 0.5);
          },
  });
  t.push_back({.op = "where",
               .name = "where_gradient_to_b_only",
               .inputs = {fixed(i32({1, 0, 0, 1}, {4})), no_grad(in({3, 4})), in({3, 1})},
               .build = [](const X& x) { return where(x[0], x[1], x[2]); }});

  // --- differentiable Tensor views and copies ----------------------------------------------
  t.push_back({.op = "view", .name = "view", .inputs = {in({2, 6})}, .build = [](const X& x) {
                 return x[0].view({3, 4});
               }});
  t.push_back({.op = "reshape",
               .name = "reshape_of_transposed_copies",
               .inputs = {in({3, 4}, transposed)},
               .build = [](const X& x) {
                 return x[0].reshape({2, 6});
               }});
  t.push_back(
      {.op = "transpose", .name = "transpose", .inputs = {in({2, 3, 4})}, .build = [](const X& x) {
         return x[0].transpose(0, 2);
       }});
  t.push_back({.op = "permute",
               .name = "permute",
               .inputs = {in({2, 3, 4}, strided)},
               .build = [](const X& x) {
                 return x[0].permute({2, 0, 1});
               }});
  t.push_back({.op = "narrow",
               .name = "narrow",
               .inputs = {in({4, 5}, transposed)},
               .build = [](const X& x) { return x[0].narrow(1, 1, 3); }});
  t.push_back(
      {.op = "select", .name = "select", .inputs = {in({3, 4, 2})}, .build = [](const X& x) {
         return x[0].select(1, 2);
       }});
  t.push_back({.op = "unsqueeze",
               .name = "unsqueeze",
               .inputs = {in({3, 4}, strided)},
               .build = [](const X& x) { return x[0].unsqueeze(1); }});
  t.push_back(
      {.op = "squeeze", .name = "squeeze", .inputs = {in({3, 1, 4})}, .build = [](const X& x) {
         return x[0].squeeze(1);
       }});
  t.push_back({.op = "expand", .name = "expand", .inputs = {in({3, 1})}, .build = [](const X& x) {
                 return x[0].expand({2, 3, 4});
               }});
  t.push_back({.op = "flatten",
               .name = "flatten_of_transposed",
               .inputs = {in({2, 3, 4}, transposed)},
               .build = [](const X& x) { return x[0].flatten(1); }});
  t.push_back({.op = "contiguous",
               .name = "contiguous",
               .inputs = {in({3, 4}, transposed)},
               .build = [](const X& x) { return x[0].contiguous(); }});
  t.push_back(
      {.op = "clone", .name = "clone", .inputs = {in({3, 4}, strided)}, .build = [](const X& x) {
         return x[0].clone();
       }});
  t.push_back(
      {.op = "to", .name = "to_f64", .inputs = {in({3, 4}, transposed)}, .build = [](const X& x) {
         return x[0].to(DType::f64);
       }});
  return t;
}

const std::vector<OpCase>& table() {
  static const std::vector<OpCase> t = make_table();
  return t;
}

const std::vector<DType> kFloating{DType::f64, DType::f32, DType::bf16};

std::string column(Device device, DType dtype) {
  return std::string(device.is_cpu() ? "cpu" : "cuda") + " " + dtype_name(dtype);
}

std::string fmt(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1e", x);
  return buf;
}

// The largest forward / backward errors of `got` against `ref`, for the table.
std::string errors_cell(const Result& got, const Result& ref) {
  double g = 0;
  for (size_t i = 0; i < ref.grads.size() && i < got.grads.size(); ++i)
    if (ref.grads[i].defined() && got.grads[i].defined())
      g = std::max(g, scaled_error(got.grads[i], ref.grads[i]));
  std::string cell = "ok " + fmt(scaled_error(got.out, ref.out));
  if (!ref.grads.empty()) cell += "/" + fmt(g);
  return cell;
}

class OpTable : public ::testing::TestWithParam<const OpCase*> {};

TEST_P(OpTable, CpuDtypesAgainstFloat64) {
  const OpCase& c = *GetParam();
  Coverage& cov = Coverage::get();
  const std::vector<Tensor> bases = make_bases(c);
  ASSERT_TRUE(c.supports(DType::f64)) << c.name << ": float64 is the reference";
  const Result ref = run(c, bases, DType::f64, Device::cpu(), c.grad);
  EXPECT_EQ(first_non_finite(ref), "") << c.name << " in f64";
  if (c.grad && c.fd) {
    const auto fd = finite_difference(c, bases, ref);
    EXPECT_TRUE(fd);
    cov.set(c.name, column(Device::cpu(), DType::f64), fd ? "fd ok" : "FAIL");
  } else {
    cov.set(c.name, column(Device::cpu(), DType::f64), c.grad ? "ref (no fd)" : "ref (no grad)");
  }
  for (DType dtype : {DType::f32, DType::bf16}) {
    const std::string col = column(Device::cpu(), dtype);
    if (const auto it = c.unsupported.find(dtype); it != c.unsupported.end()) {
      const std::string err =
          error_text([&] { run(c, bases, dtype, Device::cpu(), /*backward=*/false); });
      EXPECT_NE(err.find(it->second), std::string::npos)
          << c.name << " in " << dtype_name(dtype) << ": expected an error containing '"
          << it->second << "', got: " << err;
      cov.set(c.name, col, "unsupported");
      continue;
    }
    ASSERT_TRUE(c.supports(dtype))
        << c.name << " lists " << dtype_name(dtype) << " neither as supported nor as unsupported";
    Result got;
    const std::string err = error_text([&] { got = run(c, bases, dtype, Device::cpu(), c.grad); });
    if (err != "no error") {
      ADD_FAILURE() << c.name << " in " << dtype_name(dtype) << " threw: " << err;
      cov.set(c.name, col, "FAIL (throws)");
      continue;
    }
    const std::string diff =
        compare(c, got, ref, c.tolerance(dtype, false), c.tolerance(dtype, true));
    EXPECT_EQ(diff, "") << c.name << " in " << dtype_name(dtype) << " vs f64";
    cov.set(c.name, col, diff.empty() ? errors_cell(got, ref) : "FAIL");
  }
}

// Mixed precision: f32 tensors under a bf16 MatmulPrecisionScope. The matrix
// ops multiply in bf16 and must stay within the bf16 tolerances of f64 while
// returning f32; every other op must give exactly its f32 result.
// The table's inputs are bf16-representable, which would hide the casts:
// nudge them off the bf16 grid (f32 keeps the nudge, bf16 rounds it away).
std::vector<Tensor> nudged_bases(const OpCase& c) {
  std::vector<Tensor> bases = make_bases(c);
  for (size_t i = 0; i < bases.size(); ++i) {
    if (c.inputs[i].fixed.defined() || !is_floating(bases[i].dtype())) continue;
    NoGradGuard no_grad;
    bases[i] = mul(bases[i], 1.0 + 1.0 / 3000.0);
  }
  return bases;
}

// One autocast cell: `got` (f32 under bf16 products on some device) against
// the f64 reference at the bf16 tolerances for a matrix op, against `plain`
// (f32 on that device) exactly for every other op.
bool is_matrix_op(const OpCase& c) {
  return c.op == "linear" || c.op == "stacked_linear" || c.op == "matmul" || c.op == "attention" ||
         c.op == "cudnn_attention" || c.op == "rope_attention" || c.op == "varlen_attention" ||
         c.op == "varlen_rope_attention" || c.op == "varlen_attention_packed" ||
         c.op == "gelu_tanh_ffn";
}

void check_autocast(const OpCase& c, const Result& got, const Result& plain, const Result& ref,
                    const std::string& column) {
  if (!is_matrix_op(c)) {
    // Not a product: the same function, so exactly the plain f32 numbers.
    const std::string same = compare(c, got, plain, 0.0, 0.0);
    EXPECT_EQ(same, "") << c.name << ": autocast changed a non-matrix op (" << column << ")";
    Coverage::get().set(c.name, column, same.empty() ? "= f32" : "FAIL");
    return;
  }
  const std::string diff =
      compare(c, got, ref, c.tolerance(DType::bf16, false), c.tolerance(DType::bf16, true));
  EXPECT_EQ(diff, "") << c.name << " under bf16 autocast vs f64 (" << column << ")";
  // bf16 products must actually have run: the result differs from f32.
  EXPECT_NE(compare(c, got, plain, 0.0, 0.0), "")
      << c.name << ": autocast had no effect (" << column << ")";
  Coverage::get().set(c.name, column, diff.empty() ? errors_cell(got, ref) : "FAIL");
}

// The CPU autocast cell of c: f32 under bf16 products against f64 and f32.
void check_cpu_autocast(const OpCase& c, const std::string& column) {
  const std::vector<Tensor> bases = nudged_bases(c);
  const Result ref = run(c, bases, DType::f64, Device::cpu(), c.grad);
  const Result plain = run(c, bases, DType::f32, Device::cpu(), c.grad);
  Result got;
  {
    MatmulPrecisionScope bf16_products(DType::bf16);
    got = run(c, bases, DType::f32, Device::cpu(), c.grad);
  }
  check_autocast(c, got, plain, ref, column);
}

TEST_P(OpTable, CpuBf16AutocastAgainstFloat64) {
  const OpCase& c = *GetParam();
  if (!c.supports(DType::f32)) GTEST_SKIP() << c.name << " has no f32 path";
  check_cpu_autocast(c, "cpu autocast");
}

// A CPU whose oneDNN has no bf16 matmul (below AVX-512) multiplies f32
// copies of the bf16 operands (onednn_has_bf16_matmul): forced here, so the
// path runs on every machine. bf16 tensors and bf16 autocast stay within
// bf16's tolerances of f64, and autocast still rounds the operands (its
// cells in a column of their own, which the table does not print).
TEST_P(OpTable, CpuBf16ProductsWithoutOneDnnBf16AgainstFloat64) {
  const OpCase& c = *GetParam();
  if (!is_matrix_op(c)) GTEST_SKIP() << c.name << " multiplies no matrices";
  const kernels::cpu::Bf16MatmulDisabled f32_products;
  ASSERT_FALSE(kernels::cpu::onednn_has_bf16_matmul());
  const std::vector<Tensor> bases = make_bases(c);
  const Result ref = run(c, bases, DType::f64, Device::cpu(), c.grad);
  if (c.supports(DType::bf16)) {
    const Result got = run(c, bases, DType::bf16, Device::cpu(), c.grad);
    EXPECT_EQ(compare(c, got, ref, c.tolerance(DType::bf16, false), c.tolerance(DType::bf16, true)),
              "")
        << c.name << " in bf16, f32 products, vs f64";
  }
  if (c.supports(DType::f32)) check_cpu_autocast(c, "cpu autocast, f32 products");
}

// The same rules on each accelerator (fresh memory poisoned).
TEST_P(OpTable, DeviceBf16AutocastAgainstFloat64) {
  const OpCase& c = *GetParam();
  std::string why;
  const std::vector<Device> devices = accelerators(&why);
  if (devices.empty()) {
    Coverage::get().set(c.name, "cuda autocast", "no GPU");
    GTEST_SKIP() << why;
  }
  if (!c.supports(DType::f32)) GTEST_SKIP() << c.name << " has no f32 path";
  const std::vector<Tensor> bases = nudged_bases(c);
  const Result ref = run(c, bases, DType::f64, Device::cpu(), c.grad);
  for (const Device device : devices) {
    Result plain, got;
#ifdef ROFORMER_CUDA
    const PoisonedCudaAllocations poison;
#endif
    plain = run(c, bases, DType::f32, device, c.grad);
    {
      MatmulPrecisionScope bf16_products(DType::bf16);
      got = run(c, bases, DType::f32, device, c.grad);
    }
    check_autocast(c, got, plain, ref, "cuda autocast");
  }
}

TEST_P(OpTable, DevicesAgainstCpu) {
  const OpCase& c = *GetParam();
  Coverage& cov = Coverage::get();
  std::string why;
  const std::vector<Device> devices = accelerators(&why);
  if (devices.empty()) {
    for (DType dtype : kFloating) cov.set(c.name, column(Device::cuda(), dtype), "no GPU");
    GTEST_SKIP() << why;
  }
  const std::vector<Tensor> bases = make_bases(c);
  for (const Device device : devices) {
    for (DType dtype : kFloating) {
      const std::string col = column(device, dtype);
      if (const auto it = c.unsupported.find(dtype); it != c.unsupported.end()) {
        const std::string err = error_text([&] { run(c, bases, dtype, device, false); });
        EXPECT_NE(err.find(it->second), std::string::npos)
            << c.name << " on " << device.str() << ": " << err;
        cov.set(c.name, col, "unsupported");
        continue;
      }
      const Result ref = run(c, bases, dtype, Device::cpu(), c.grad);
      Result got;
      std::string err;
#ifdef ROFORMER_CUDA
      {
        const PoisonedCudaAllocations poison;
        err = error_text([&] { got = run(c, bases, dtype, device, c.grad); });
      }
#else
      err = error_text([&] { got = run(c, bases, dtype, device, c.grad); });
#endif
      if (err != "no error") {
        ADD_FAILURE() << c.name << " in " << dtype_name(dtype) << " on " << device.str()
                      << " threw: " << err;
        cov.set(c.name, col, "FAIL (throws)");
        continue;
      }
      // Float64 differs from the CPU only by summation order.
      const double fwd = dtype == DType::f64 ? 1e-10 : c.tolerance(dtype, false);
      const double bwd = dtype == DType::f64 ? 1e-10 : c.tolerance(dtype, true);
      const std::string diff = compare(c, got, ref, fwd, bwd);
      EXPECT_EQ(diff, "") << c.name << " in " << dtype_name(dtype) << " on " << device.str();
      cov.set(c.name, col, diff.empty() ? errors_cell(got, ref) : "FAIL");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, OpTable, ::testing::ValuesIn([] {
                           std::vector<const OpCase*> cases;
                           for (const OpCase& c : table()) cases.push_back(&c);
                           return cases;
                         }()),
                         [](const ::testing::TestParamInfo<const OpCase*>& info) {
                           return info.param->name;
                         });

// --- the table covers the API ---------------------------------------------------------------

std::string read_source(const std::string& path) {
  std::ifstream f(std::string(ROFORMER_SOURCE_DIR) + "/" + path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(OpTableCoverage, EveryPublicOpHasAnEntry) {
  std::set<std::string> covered;
  for (const OpCase& c : table()) covered.insert(c.op);
  // Free functions of core/ops.h returning tensors: the ops.
  const std::string ops = read_source("core/ops.h");
  ASSERT_FALSE(ops.empty()) << "cannot read core/ops.h";
  const std::regex op_decl(
      R"(\n(?:Tensor|std::pair<Tensor, Tensor>|std::vector<Tensor>|CrossEntropyOutputs) (\w+)\()");
  std::set<std::string> declared;
  for (auto it = std::sregex_iterator(ops.begin(), ops.end(), op_decl);
       it != std::sregex_iterator(); ++it)
    declared.insert((*it)[1]);
  // Methods of Tensor returning a new tensor: the views and copies.
  const std::string tensor = read_source("core/tensor.h");
  ASSERT_FALSE(tensor.empty()) << "cannot read core/tensor.h";
  const std::regex method_decl(R"(\n  Tensor (\w+)\([^;]*\) const;)");
  for (auto it = std::sregex_iterator(tensor.begin(), tensor.end(), method_decl);
       it != std::sregex_iterator(); ++it)
    declared.insert((*it)[1]);
  // Not ops: an accessor and the history cut (both in test_autograd.cpp).
  const std::set<std::string> not_ops{"grad", "detach"};
  EXPECT_GT(declared.size(), 40u) << "the declaration patterns no longer match the headers";
  for (const std::string& name : declared)
    if (!not_ops.count(name)) {
      EXPECT_TRUE(covered.count(name)) << name << " is public but has no op-table entry";
    }
  for (const std::string& name : covered)
    EXPECT_TRUE(declared.count(name)) << "op-table entry for " << name << ", which is not declared";
}

TEST(OpTableCoverage, EntriesAreWellFormed) {
  std::set<std::string> names;
  for (const OpCase& c : table()) {
    EXPECT_TRUE(names.insert(c.name).second) << "duplicate entry name " << c.name;
    EXPECT_EQ(c.inputs.size() > 0, true) << c.name;
    for (DType d : kFloating)
      EXPECT_NE(c.supports(d), c.unsupported.count(d) > 0)
          << c.name << ": " << dtype_name(d) << " must be either supported or unsupported";
    if (c.grad && !c.fd) {
      EXPECT_FALSE(c.no_fd_reason.empty()) << c.name;
    }
  }
}

// --- the table itself can fail ----------------------------------------------------------------

TEST(OpTableMachinery, FiniteDifferencesCatchAWrongGradient) {
  const OpCase c{.op = "wrong", .name = "wrong", .inputs = {in({2, 3})}, .build = [](const X& x) {
                   Tensor out;
                   {
                     NoGradGuard no_grad;
                     out = mul(x[0], 2.0);
                   }
                   return record("wrong", out, {&x[0]},
                                 [](const Tensor& g) { return std::vector<Tensor>{mul(g, 2.01)}; });
                 }};
  const std::vector<Tensor> bases = make_bases(c);
  EXPECT_FALSE(finite_difference(c, bases, run(c, bases, DType::f64, Device::cpu(), true)));
}

TEST(OpTableMachinery, PoisonShowsAnUnwrittenElement) {
  // An "op" that forgets the last element of its fresh output.
  const OpCase c{.op = "forgetful",
                 .name = "forgetful",
                 .inputs = {in({64})},
                 .build =
                     [](const X& x) {
                       Tensor out = Tensor::empty(x[0].shape(), x[0].dtype());
                       out.narrow(0, 0, 63).copy_(x[0].narrow(0, 0, 63));
                       return out;
                     },
                 .grad = false};
  const std::vector<Tensor> bases = make_bases(c);
  for (DType dtype : kFloating) {
    const std::vector<double> out =
        run(c, bases, dtype, Device::cpu(), false).out.to_vector<double>();
    EXPECT_FALSE(std::isnan(out[62])) << dtype_name(dtype);
    EXPECT_TRUE(std::isnan(out[63]))
        << dtype_name(dtype) << ": the unwritten element reads " << out[63] << ", not the poison";
  }
}

// Prints the coverage table of whatever ran in this process.
class PrintCoverage : public ::testing::Environment {
 public:
  void TearDown() override {
    std::vector<std::string> columns;
    for (const char* dev : {"cpu", "cuda"})
      for (DType d : kFloating) columns.push_back(std::string(dev) + " " + dtype_name(d));
    columns.insert(columns.begin() + 3, "cpu autocast");
    columns.push_back("cuda autocast");
    const std::string t = Coverage::get().table(columns);
    if (t.empty()) return;
    std::printf(
        "\nop table coverage (cpu f64: finite-difference gradient check; other cells: max "
        "forward/backward error over the largest reference value, against cpu f64 or, for "
        "cuda, against the cpu in the same dtype; autocast: f32 with bf16 products):\n%s",
        t.c_str());
  }
};
[[maybe_unused]] const auto* const kPrintCoverage =
    ::testing::AddGlobalTestEnvironment(new PrintCoverage);

}  // namespace
}  // namespace roformer::testing::op_table
