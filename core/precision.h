// Mixed precision for the matrix products ("autocast"). While a
// MatmulPrecisionScope(DType::bf16) is alive, linear, matmul and softmax
// attention on the CPU and on CUDA devices cast their f32 operands to bf16,
// multiply with f32 accumulation and return f32; everything else
// (parameters, gradients, optimizer state, layer norm, softmax, loss) stays
// f32. The choice is taken when an op runs forward and kept by its backward.
//
// bf16 activations: a model may also ask linear() for a bf16 result
// (activation_dtype), which the next elementwise ops (GELU, dropout) keep,
// and which linear, attention and add_layer_norm then read without a cast.
// The residual stream (layer norm outputs) stays f32, as under torch's
// autocast; so do the scores, softmax, lse and the loss. The MLM head's
// logits are bf16 (autocast's linear writes them so too).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace roformer {

// The dtype matrix products use now: f32 (default) or bf16.
DType matmul_dtype();

// Sets matmul_dtype() for its lifetime (process-wide), restoring the previous
// value on destruction. `bf16_activations` false keeps every product's result
// in f32 (activation_dtype gives the input's dtype), as before bf16
// activations existed: for comparisons (mlm_step_bench --precision bf16-f32act).
class MatmulPrecisionScope {
 public:
  explicit MatmulPrecisionScope(DType dtype, bool bf16_activations = true);
  ~MatmulPrecisionScope();
  MatmulPrecisionScope(const MatmulPrecisionScope&) = delete;
  MatmulPrecisionScope& operator=(const MatmulPrecisionScope&) = delete;

 private:
  DType previous_;
  bool previous_activations_;
};

// True when an op on `device` with operands of `dtype` should run its products
// in bf16: the scope asks for bf16 and the operands are f32 (on the CPU or a
// CUDA device).
bool autocast_bf16(Device device, DType dtype);
// True while the scope asks for bf16 and `device` runs bf16 products (the CPU
// or a CUDA device): bf16 operands are taken as autocast's own casts.
bool autocast_active(Device device);
// The dtype a product whose result feeds only other products and elementwise
// ops (not the residual stream) should write for input `x`: bf16 while
// autocast is active for x (an f32 or bf16 x) with bf16 activations on, else
// x's dtype.
DType activation_dtype(const Tensor& x);

// --- CPU support ------------------------------------------------------------------
// Whether this CPU has native bf16 dot products (AVX512-BF16 or AMX-BF16).
// Without them oneDNN would emulate bf16 at a fraction of f32 speed, so the
// trainer refuses run.precision: bf16 there (see require_fast_bf16).
bool cpu_has_native_bf16();
// Tests pretend a CPU with (true) or without (false) the instructions;
// std::nullopt restores the real probe.
void set_cpu_bf16_probe_override(std::optional<bool> value);
// Throws InputError naming `key` and what the CPU lacks when it has no native bf16.
void require_native_bf16(const std::string& key);

// --- bf16 weight cache ---------------------------------------------------------------
// The bf16 copy of parameter `weight` (f32), cast once and reused until the
// weight's storage changes version (an optimizer step, a load, any in-place
// write). A micro-batch loop therefore casts each weight once per optimizer step.
Tensor bf16_weight(const Tensor& weight);
// Number of casts bf16_weight has made since start (for tests).
int64_t bf16_weight_casts();
// Parameters stacked along dim 0 into one product's weight (or bias), as
// stacked_linear takes a layer's query, key and value projections. With
// `bf16`, of their bf16 copies (bf16_weight), and cached as those are, until
// any part's storage changes version: the micro-batches of an optimizer step
// stack the parts once. Without, stacked anew each call. One part: that part
// (or its bf16 copy) itself.
Tensor stacked_weight(const std::vector<Tensor>& parts, bool bf16);
// Number of stacks stacked_weight has built since start (for tests).
int64_t stacked_weight_builds();
// Drops every cached copy and stack (and the registered working copy below).
void clear_bf16_weights();

// A bf16 working copy kept by the storage's writer: `working` (contiguous
// bf16, source's element count) holds the flat f32 `source` (contiguous)
// rounded to bf16 as of source's current version. The device AdamW writes it
// in its update pass; until the storage's version moves again, bf16_weight
// serves every weight inside `source` as a view of `working`, with no cast.
// One working copy is registered at a time (the model's flat parameters).
void set_bf16_working_copy(const Tensor& source, const Tensor& working);
// Number of weights bf16_weight has served from the working copy (for tests).
int64_t bf16_working_copy_hits();

// A bf16 copy of `t` (no history), contiguous. The caller must not write to
// it: a repeated call for the same unchanged tensor returns the same copy,
// and a contiguous bf16 `t` is returned itself (detached).
Tensor to_bf16(const Tensor& t);
// Makes `cast` (contiguous bf16, t's values rounded as to_bf16 rounds them)
// the copy to_bf16(t) returns while t is unchanged: a kernel that wrote it
// beside t (the residual layer norm's output) saves the product reading t a
// cast pass. One cast is remembered at a time, per thread.
void remember_bf16_cast(const Tensor& t, const Tensor& cast);

}  // namespace roformer
