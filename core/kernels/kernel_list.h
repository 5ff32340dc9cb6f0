// THE KERNEL LIST: every kernel of every device, declared once.
//
// Convention
// - ROFORMER_KERNELS(X) calls X(name, signature) once per kernel. The list
//   is expanded three ways below: a function declaration in
//   roformer::kernels::cpu, the same in roformer::kernels::cuda, and a
//   member (function pointer) of KernelTable.
// - A device's table (core/kernels/cpu_table.cpp, cuda_table.cpp) is
//   initialised from the list with &<device>::<name> for every entry, so a
//   build whose device lacks one listed kernel fails to link -- never a
//   run-time "no kernel" error.
// - Ops never name a device namespace: they call launch::<name>(device, ...)
//   (core/ops/dispatch.h), which picks the device's table and its current
//   Stream. That is the one dispatch point per device.
// - Kernels see KernelTensor (pointer, dtype, sizes, strides in elements) and
//   a Stream, never Tensor or autograd. The caller allocates every output
//   (and scratch) tensor; a kernel never allocates device memory that
//   outlives the call.
// - Kernels never throw for bad data (ids out of range): they skip the bad
//   element (writing zeros) and report the first one in stream.error with the
//   `site` the op registered; the host raises it at the next sync point.
//   They do throw (roformer::Error) for a dtype or geometry they do not
//   support; the op checks these first, so that is an internal error.
// - Optional tensors are passed as KernelTensor{} (ndim -1, defined() false).
// - Adding a kernel: one line here, a function in every device's library
//   (core/cpu/*.cpp, core/cuda/kernels/*.cu). The tables pick it up.
// C++17, no host-only types: nvcc reads this header.
#pragma once

#include <cstdint>

#include "core/dropout_context.h"
#include "core/kernels/kernel_tensor.h"
#include "core/kernels/stream.h"

namespace roformer::kernels {

using KT = const KernelTensor&;

enum class BinaryOp : uint8_t { add, sub, mul, div };

enum class UnaryOp : uint8_t {
  neg,
  exp,
  log,
  sqrt,
  rsqrt,
  tanh,
  pow,           // a ^ scalar
  add_scalar,    // a + scalar
  mul_scalar,    // a * scalar
  rsub_scalar,   // scalar - a
  elu_plus_one,  // elu(a) + 1
  elu_plus_one_grad
};

// Dropout draws follow the shared rule of core/philox.h (dropout_key,
// dropout_block, dropout_threshold) for a DropoutKey (core/dropout_context.h):
// they depend on (seed, step, sequence, site, head, position, feature) only.
// Which implementation a device uses for padded softmax attention: its own
// kernels, or the vendor's fused attention (cuDNN SDPA on CUDA; bf16
// operands, no dropout, key masks whose kept keys come first -- a row that
// breaks this is reported with `mask_site`). The CPU has only its own.
enum class AttentionEngine : uint8_t { own, vendor };

// What rope_attention_backward's q and k are: the inputs of the rotation
// (unrotated), or the rotated copies the forward attended with (rotated:
// set_rotate_once in core/ops.h). Its gradients are those of the unrotated
// q and k either way.
enum class RopeInputs : uint8_t { unrotated, rotated };

struct AttentionParams {
  AttentionEngine engine = AttentionEngine::own;
  int32_t mask_site = 0;        // vendor: the op's report site for a key mask it cannot take
  double scale = 1.0;           // scores = q k^T * scale
  double dropout_p = 0.0;       // on the probabilities; 0 = none
  DropoutKey dropout;           // batch row b is sequence dropout.first_sequence + b;
                                // the query is the position, the key the feature
  int64_t longest_segment = 0;  // token streams: the longest segment (a device's
                                // launch geometry); 0 = not given
};

// Dropout of layer_norm's x before the residual add: layer_norm(dropout(x) +
// residual), a residual block's end in one pass each way. The draws, and the
// bits of every output, are those of dropout() then add_layer_norm: x's rows
// are dropout's tokens, row r being (with the kernel's `tokens`, [rows, 2]
// i64 of row and position) token r of dropout_tokens, or (without) position
// r % positions of batch row r / positions, as dropout's [rows, positions,
// features].
struct ResidualDropout {
  double p = 0.0;  // 0 = none
  DropoutKey key;
  int64_t positions = 1;
};

// clang-format off
#define ROFORMER_KERNELS(X)                                                                      \
  /* --- device services ------------------------------------------------------------- */     \
  /* The device's current stream (with its error record). */                                   \
  X(default_stream, Stream(int device_index))                                                   \
  /* Waits for the stream, copies its error record to *host and clears it. */                  \
  X(take_error, void(Stream, KernelError* host))                                                \
  /* Blocks until the stream has run every kernel queued on it. */                             \
  X(synchronize, void(Stream))                                                                  \
  /* --- copies and fills (core/cpu/copy.cpp) ---------------------------------------------- */\
  /* dst = cast(src): same shape, any dtypes and strides; dst may overlap src. */              \
  X(copy, void(Stream, KT src, KT dst))                                                         \
  X(fill, void(Stream, KT dst, double value))                                                   \
  /* out = uniform [0, 1) (normal when `normal`) from Philox(seed, offset + i). */             \
  X(random_fill, void(Stream, KT out, uint64_t seed, uint64_t offset, bool normal))            \
  /* --- elementwise (core/cpu/elementwise.cpp): operands expanded to out's shape ---------- */\
  X(binary, void(Stream, BinaryOp op, KT a, KT b, KT out))                                      \
  X(unary, void(Stream, UnaryOp op, KT a, KT out, double scalar))                               \
  X(where, void(Stream, KT cond, KT a, KT b, KT out))                                           \
  /* --- reductions (core/cpu/reduce.cpp): outputs contiguous in keepdim shape ------------ */ \
  /* bit d of reduced_dims set: dimension d is summed. */                                       \
  X(sum, void(Stream, KT x, uint32_t reduced_dims, KT out))                                     \
  X(max, void(Stream, KT x, int32_t dim, KT values, KT indices))                                \
  /* grad_x (zeroed) at the argmax positions += grad. */                                        \
  X(scatter_along, void(Stream, KT grad, KT indices, int32_t dim, KT grad_x))                   \
  /* --- matrix products (core/cpu/matmul.cpp) --------------------------------------------- */\
  /* out[..., M, N] = a[..., M, K] b[..., K, N] (+ bias[N]); batch dims may broadcast. */       \
  X(matmul, void(Stream, KT a, KT b, KT bias, KT out))                                          \
  /* out[..., M, N] += a b, as matmul (no bias): a product added into a gradient sum with   */ \
  /* no pass of its own (cuBLASLt's beta = 1, oneDNN's sum post-op).                        */ \
  X(matmul_accumulate, void(Stream, KT a, KT b, KT out))                                        \
  /* A linear's weight and bias gradients in one call: dw[N, K] = g^T x and db[N] = the     */ \
  /* column sums of g, as `sum` over dim 0 gives them; g [T, N], x [T, K], db contiguous in */ \
  /* g's dtype. `fused`: db summed inside the product where the device can (CUDA: cuBLASLt's */ \
  /* BGRADB epilogue, one pass over g); otherwise the product, then `sum`.                   */ \
  X(linear_weight_grads, void(Stream, KT g, KT x, KT dw, KT db, bool fused))                     \
  /* --- products with the tanh-GELU epilogue (core/cpu/gelu_gemm.cpp; CUDA: cuBLASLt --- */    \
  /* GELU_AUX_BIAS / DGELU_BGRAD). 2-D; a, b as matmul's; pre, y, dpre [M, N]. */               \
  /* pre = a b + bias, y = gelu_tanh(pre) */                                                    \
  X(gemm_gelu_forward, void(Stream, KT a, KT b, KT bias, KT pre, KT y))                         \
  /* dpre = (a b) * gelu_tanh'(pre), dbias[N] = column sums of dpre */                          \
  X(gemm_dgelu_backward, void(Stream, KT a, KT b, KT pre, KT dpre, KT dbias))                   \
  /* --- softmax, layer norm, GELU (core/cpu/softmax.cpp, layer_norm.cpp, gelu.cpp) -------- */\
  X(softmax_forward, void(Stream, KT x, KT y, bool log))                                        \
  X(softmax_backward, void(Stream, KT y, KT dy, KT dx, bool log))                               \
  /* With `residual` (else undefined): normalises sum = x + residual (same shape), written  */  \
  /* to `sum` for the backward; the residual add costs no pass of its own. Dtypes: all one  */  \
  /* (mean, var f32, or f64 for f64), or with a residual bf16 x and f32 for all the rest    */  \
  /* (sum = float(x) + residual in f32: bf16 activations on an f32 residual stream). Other  */  \
  /* mixes throw naming the dtypes (core/kernels/layer_norm_dtypes.h). `drop` (p > 0 needs  */  \
  /* the residual) drops x before the add, `drop_tokens` saying where x's rows are. y_low    */  \
  /* (optional, f32 y only): y rounded to bf16 as well, in the same pass -- the operand of   */  \
  /* the product that reads y next under bf16 activations, with no cast pass of its own.     */  \
  X(layer_norm_forward, void(Stream, KT x, KT residual, KT weight, KT bias, double eps,         \
                             const ResidualDropout& drop, KT drop_tokens, KT y, KT y_low,       \
                             KT sum, KT mean, KT var))                                          \
  /* dx_x (optional): x's gradient where it is not dx itself, in the same pass: dx rounded   */  \
  /* to bf16 for add_layer_norm's bf16 x on an f32 dx (bf16 activations, no cast pass of its */  \
  /* own), and with the forward's `drop` (p > 0 needs dx_x) the dropout's backward applied.  */  \
  X(layer_norm_backward, void(Stream, KT x, KT weight, KT mean, KT var, KT dy, double eps,      \
                              const ResidualDropout& drop, KT drop_tokens, KT dx, KT dx_x,      \
                              KT dweight, KT dbias))                                            \
  X(gelu_forward, void(Stream, KT x, KT y))                                                     \
  X(gelu_backward, void(Stream, KT x, KT dy, KT dx))                                            \
  /* --- dropout (core/cpu/dropout.cpp) ------------------------------------------------- */ \
  /* x, out contiguous [rows, positions, features]; row r is sequence key.first_sequence+r.*/  \
  X(dropout, void(Stream, KT x, KT out, double p, const DropoutKey& key))                       \
  /* Token-stream dropout: x, out contiguous [T, features]; tokens [T, 2] i64 (row, position):*/\
  /* token t is sequence key.first_sequence + row at that position (the rule above). */          \
  X(dropout_tokens, void(Stream, KT x, KT out, KT tokens, double p, const DropoutKey& key))     \
  /* --- gathers (core/cpu/gather.cpp): table [N, R], ids (i32/i64) of any shape ----------- */\
  /* out [ids..., R] = table[ids]; a bad id gives a zero row and is reported at `site`. */     \
  X(gather_rows, void(Stream, KT table, KT ids, int32_t site, KT out))                          \
  /* grad_table (zeroed) [ids[n]] += grad_out[n] in n order (deterministic); bad ids skipped.*/\
  X(scatter_add_rows, void(Stream, KT grad_out, KT ids, KT grad_table))                         \
  /* --- cross-entropy (core/cpu/cross_entropy.cpp) ---------------------------------------- */\
  /* logits [N, C], targets [N]; lse, row_loss [N] f64; loss [] (f64 for f64 logits, else */   \
  /* f32) = sum of row losses in row order / count; count [] i64 = rows not ignored; */         \
  /* correct [] i64 = of those, rows whose argmax (max's rule: the first NaN, else the */       \
  /* first largest) is the target. */                                                         \
  X(cross_entropy_forward, void(Stream, KT logits, KT targets, int64_t ignore_index,            \
                                int32_t site, KT lse, KT row_loss, KT loss, KT count,           \
                                KT correct))                                                    \
  /* grad [N, C] = (softmax - onehot) * grad_loss[] / count[] for counted rows, 0 else. */     \
  X(cross_entropy_backward, void(Stream, KT logits, KT targets, int64_t ignore_index, KT lse,   \
                                 KT grad_loss, KT count, KT grad))                              \
  /* --- rotary position embedding (core/cpu/rope.cpp) ------------------------------------- */\
  /* table [2, S, D/2] (cos, sin; f32 or f64) of positions[s] * base^(-2i/D), in double. */    \
  X(rope_table, void(Stream, KT positions, double base, KT table))                              \
  /* out = x [..., S, D] rotated pair-wise (out: x's shape, any strides, the last 1, no   */  \
  /* overlap with x); inverse: by minus the angle. */                                         \
  X(rope, void(Stream, KT x, KT table, bool interleaved, bool inverse, KT out))                 \
  /* --- fused softmax attention (core/cpu/attention.cpp) ---------------------------------- */\
  /* q [B, H, Sq, D], k [B, H, Sk, D], v [B, H, Sk, Dv] (unit last stride), key_mask [B, Sk] */\
  /* any dtype, nonzero = keep (or undefined); out [B, H, Sq, Dv]; lse [B, H, Sq]; */          \
  /* keep_bits [B, H, Sq, ceil(Sk / 32)] i32 when dropout_p > 0. Dtypes (this kernel, the */    \
  /* token-stream and RoPE-inside ones; core/kernels/attention_dtypes.h): q, k, v one dtype */   \
  /* and grad_out q's; f32 q: out, grads f32; f64 q: all f64; bf16 q: out f32 or bf16 and */    \
  /* grad_q, grad_k, grad_v all f32 or all bf16; lse f32 (f64 for f64). Arithmetic in f32 */    \
  /* (f64): a bf16 output is the f32 result rounded once (round to nearest even). */           \
  X(attention_forward, void(Stream, const AttentionParams& params, KT q, KT k, KT v,            \
                            KT key_mask, KT out, KT lse, KT keep_bits))                         \
  X(attention_backward, void(Stream, const AttentionParams& params, KT q, KT k, KT v,           \
                             KT key_mask, KT out, KT lse, KT keep_bits, KT grad_out,            \
                             KT grad_q, KT grad_k, KT grad_v))                          \
  /* --- variable-length attention over a token stream (core/cpu/attention_varlen.cpp) ------ */\
  /* q [T, H, D], k [T, H, D], v [T, H, Dv] (unit last stride); segments [N, 4] i64 in q's */ \
  /* device memory: (first token, length, row, position of the first token in its row); a token */     \
  /* attends only to its own segment's tokens; dropout: sequence first_sequence + row, query */  \
  /* position = row position. out [T, H, Dv] and lse [T, H] of tokens in no segment are not */  \
  /* written; keep_bits [T, H, ceil(longest segment / 32)] i32 when dropout_p > 0. */           \
  X(attention_varlen_forward, void(Stream, const AttentionParams& params, KT q, KT k, KT v,     \
                                   KT segments, KT out, KT lse, KT keep_bits))                 \
  /* grad_q, grad_k, grad_v rows of tokens in no segment are not written. */                   \
  X(attention_varlen_backward, void(Stream, const AttentionParams& params, KT q, KT k, KT v,    \
                                    KT segments, KT out, KT lse, KT keep_bits, KT grad_out,    \
                                    KT grad_q, KT grad_k, KT grad_v))                         \
  /* --- attention with RoPE inside (core/cpu/rope_attention.cpp) -------------------------- */\
  /* attention of rope(q), rope(k), v -- padded (q [B, H, S, D], mask_or_segments the key */  \
  /* mask) or a token stream (q [T, H, D], mask_or_segments the segments) -- as the two */    \
  /* kernels above; table [2, S or T, D/2] as rope's (positions of q's sequence dimension */   \
  /* or of its tokens). A device may rotate on the fly; no rotated copy is an output. */      \
  X(rope_attention_forward, void(Stream, const AttentionParams& params, KT table,              \
                                 bool interleaved, KT q, KT k, KT v, KT mask_or_segments,      \
                                 KT out, KT lse, KT keep_bits))                                \
  /* grad_q, grad_k: gradients of the unrotated q and k, rounded once to their dtype; q and */\
  /* k are rope(q), rope(k) when `inputs` says rotated; dtypes as attention_*'s. */            \
  X(rope_attention_backward, void(Stream, const AttentionParams& params, KT table,             \
                                  bool interleaved, RopeInputs inputs, KT q, KT k, KT v,       \
                                  KT mask_or_segments, KT out, KT lse, KT keep_bits,           \
                                  KT grad_out, KT grad_q, KT grad_k, KT grad_v))
// clang-format on

// The C++ function type of each kernel: signature::<name>.
namespace signature {
#define ROFORMER_KERNEL_SIGNATURE(name, ...) using name = __VA_ARGS__;
ROFORMER_KERNELS(ROFORMER_KERNEL_SIGNATURE)
#undef ROFORMER_KERNEL_SIGNATURE
}  // namespace signature

#define ROFORMER_DECLARE_KERNEL(name, ...) signature::name name;
namespace cpu {
ROFORMER_KERNELS(ROFORMER_DECLARE_KERNEL)
}  // namespace cpu
namespace cuda {
ROFORMER_KERNELS(ROFORMER_DECLARE_KERNEL)
}  // namespace cuda
#undef ROFORMER_DECLARE_KERNEL

// One device's kernels, filled from the list (same order, by construction).
struct KernelTable {
#define ROFORMER_KERNEL_MEMBER(name, ...) signature::name* name;
  ROFORMER_KERNELS(ROFORMER_KERNEL_MEMBER)
#undef ROFORMER_KERNEL_MEMBER
};

// Defined in core/kernels/cpu_table.cpp (always) and cuda_table.cpp (builds
// with ROFORMER_CUDA_KERNELS).
extern const KernelTable cpu_kernel_table;
extern const KernelTable cuda_kernel_table;

}  // namespace roformer::kernels
