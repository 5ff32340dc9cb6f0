// Fused softmax attention: one autograd node whose backward recomputes the
// probabilities from q, k and the saved row log-sum-exp instead of keeping
// [B, H, S, S] tensors alive between forward and backward.
#include <algorithm>
#include <atomic>
#include <memory>
#include <vector>

#include "core/ops.h"
#include "core/ops/dispatch.h"
#include "core/ops/rope_table.h"
#include "core/philox.h"
#include "core/precision.h"

namespace roformer {

namespace {

// Buffer laid out [B, S, H, D], returned as its [B, H, S, D] view: the layout
// the output projection (and the projections' gradients) read without copies.
Tensor heads_view_buffer(int64_t B, int64_t H, int64_t S, int64_t D, DType dtype, Device device) {
  const Tensor buf = Tensor::empty({B, S, H, D}, dtype, device);
  return make_view(buf, {B, H, S, D}, {S * H * D, D, H * D, 1}, 0);
}

Tensor unit_last_stride(const Tensor& t) {
  return t.strides().back() == 1 || t.shape().back() <= 1 ? t : t.contiguous();
}

// What the kernels read of q, k or v: bf16 for bf16 products (`low`; a bf16
// tensor as it is, an f32 one cast), else the tensor; unit last stride.
Tensor kernel_operand(const Tensor& t, bool low) {
  if (low && t.dtype() != DType::bf16) return to_bf16(t);
  return unit_last_stride(t.detach());
}

// The kernel's scale and dropout for `op`: dropout only while training, its
// probability checked, and its keys drawn from the context's next site.
kernels::AttentionParams attention_params(const char* op, const Tensor& q, int64_t heads,
                                          double scale, double dropout_p, bool training,
                                          DropoutContext& ctx) {
  if (!(dropout_p >= 0.0 && dropout_p < 1.0))
    throw Error(detail::concat(op, ": dropout probability must be in [0, 1), got ", dropout_p));
  const bool drop = training && dropout_p > 0.0;
  kernels::AttentionParams params;
  params.scale = scale;
  params.dropout_p = drop ? dropout_p : 0.0;
  if (drop) {
    if (heads > kDropoutMaxHeads)
      throw Error(detail::concat(op, ": dropout supports at most ", kDropoutMaxHeads,
                                 " heads, got ", q.desc()));
    params.dropout = ctx.next_site_key();
  }
  return params;
}

// The RoPE table of a call with RoPE inside (checked: one position per row
// of q's sequence dimension `S`, which k shares), or undefined without.
Tensor rotary_table(const char* op, const RotaryEmbedding* rotary, const Tensor& q, const Tensor& k,
                    int64_t seq_dim) {
  if (!rotary) return Tensor();
  const int64_t S = q.size(seq_dim), D = q.shape().back();
  if (k.size(seq_dim) != S)
    throw Error(detail::concat(op, ": q ", q.desc(), " and k ", k.desc(),
                               " must have one length to share RoPE positions"));
  if (!(rotary->positions.device() == q.device()))
    throw Error(detail::concat(op, ": positions ", rotary->positions.desc(), " are not on ",
                               q.desc(), "'s device"));
  check_rope_arguments(op, rotary->positions, S, D, rotary->base, q);
  return rope_table(rotary->positions, D, rotary->base, rope_table_dtype(q.dtype()));
}

// Whether the vendor's fused attention (cuDNN SDPA) takes a call: a CUDA
// device, bf16 operands (autocast), no dropout (its RNG cannot follow the
// shared Philox rule), a head dim it has kernels for.
bool vendor_takes(Device device, bool low, bool drop, int64_t head_dim) {
  return !device.is_cpu() && low && !drop && head_dim % 8 == 0 && head_dim <= 128;
}

// The report site of a key mask cuDNN's padding mask cannot express (a kept
// key after a masked one in a row); 0 without a mask.
int32_t vendor_mask_site(const char* op, Device device, const Tensor& key_padding_mask,
                         int64_t Sk) {
  if (!key_padding_mask.defined()) return 0;
  return kernels::index_check_site(
      device, [op, Sk, mask = key_padding_mask.desc()](int64_t kept, int64_t position) {
        return detail::concat(op, ": cuDNN SDPA (model.attention_kernel: cudnn_sdpa) takes key ",
                              "masks whose kept keys come first; key_padding_mask ", mask, " row ",
                              position / Sk, " keeps key ", position % Sk, " after a masked one (",
                              kept, " kept in all)");
      });
}

// attention() and rope_attention(): one node, RoPE inside when `rotary`.
Tensor padded_attention(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& key_padding_mask, const RotaryEmbedding* rotary,
                        double dropout_p, bool training, DropoutContext& ctx, double scale,
                        kernels::AttentionEngine engine = kernels::AttentionEngine::own) {
  const Device device = kernel_device(op, {&q, &k, &v, &key_padding_mask});
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4)
    throw Error(detail::concat(op, ": expected q, k, v as [B, H, S, D], got ", q.desc(), ", ",
                               k.desc(), ", ", v.desc()));
  if (q.dtype() != k.dtype() || q.dtype() != v.dtype())
    throw Error(
        detail::concat(op, ": dtype mismatch, q ", q.desc(), ", k ", k.desc(), ", v ", v.desc()));
  if (q.dtype() != DType::f32 && q.dtype() != DType::f64 && q.dtype() != DType::bf16)
    throw Error(detail::concat(op, ": expected f32, bf16 or f64 inputs, got ", q.desc()));
  const int64_t B = q.size(0), H = q.size(1), Sq = q.size(2), D = q.size(3);
  const int64_t Sk = k.size(2), Dv = v.size(3);
  if (k.size(0) != B || k.size(1) != H || k.size(3) != D || v.size(0) != B || v.size(1) != H ||
      v.size(2) != Sk)
    throw Error(detail::concat(op, ": shapes do not match: q ", q.desc(), ", k ", k.desc(), ", v ",
                               v.desc(), " (expected k [B, H, Sk, D], v [B, H, Sk, Dv])"));
  if (key_padding_mask.defined() && (key_padding_mask.dim() != 2 || key_padding_mask.size(0) != B ||
                                     key_padding_mask.size(1) != Sk))
    throw Error(detail::concat(op, ": key_padding_mask ", key_padding_mask.desc(),
                               " does not match [B, Sk] = [", B, ", ", Sk, "]"));
  const Tensor table = rotary_table(op, rotary, q, k, 2);
  const bool interleaved = rotary && rotary->layout == RopeLayout::interleaved;
  kernels::AttentionParams params = attention_params(op, q, H, scale, dropout_p, training, ctx);
  const bool drop = params.dropout_p > 0.0;
  // Under bf16 autocast, or for bf16 q, k, v (bf16 activations), the two
  // products read bf16 q, k, v (kept for backward at half the memory) and
  // the probabilities as bf16; scores, softmax and lse stay f32. The output
  // and the gradients come in q's dtype: bf16 activations stay bf16.
  const bool low = autocast_bf16(device, q.dtype()) || q.dtype() == DType::bf16;
  const DType out_dtype = q.dtype();
  const DType stat_dtype = q.dtype() == DType::f64 ? DType::f64 : DType::f32;
  if (engine == kernels::AttentionEngine::vendor && vendor_takes(device, low, drop, D) && Dv == D) {
    params.engine = engine;
    params.mask_site = vendor_mask_site(op, device, key_padding_mask, Sk);
  }
  const Tensor qd = kernel_operand(q, low), kd = kernel_operand(k, low),
               vd = kernel_operand(v, low);
  // The kernel reads the mask itself (nonzero = attend): no host copy.
  const Tensor mask = key_padding_mask.defined() ? key_padding_mask.detach() : Tensor();

  Tensor out = heads_view_buffer(B, H, Sq, Dv, out_dtype, device);
  const Tensor lse = Tensor::empty({B, H, Sq}, stat_dtype, device);
  const int64_t keep_words = (Sk + 31) / 32;
  const Tensor bits = drop ? Tensor::empty({B, H, Sq, keep_words}, DType::i32, device) : Tensor();
  if (Sk == 0) {
    out.fill_(0.0);
    return out;
  }
  if (rotary) {
    launch::rope_attention_forward(device, params, table, interleaved, qd, kd, vd, mask, out, lse,
                                   bits);
  } else {
    launch::attention_forward(device, params, qd, kd, vd, mask, out, lse, bits);
  }
  if (!needs_grad({&q, &k, &v})) return out;

  const SavedTensor sq(qd, op), sk(kd, op), sv(vd, op);
  const SavedTensor so(out, op), smask(mask, op);
  const bool gq = q.requires_grad(), gk = k.requires_grad(), gv = v.requires_grad();
  const bool rotate = rotary != nullptr;
  return record(op, out, {&q, &k, &v}, [=](const Tensor& g) {
    const Tensor grad_out = kernel_operand(g, low);
    Tensor dq = heads_view_buffer(B, H, Sq, D, out_dtype, g.device());
    Tensor dk = heads_view_buffer(B, H, Sk, D, out_dtype, g.device());
    Tensor dv = heads_view_buffer(B, H, Sk, Dv, out_dtype, g.device());
    if (rotate) {
      launch::rope_attention_backward(g.device(), params, table, interleaved,
                                      kernels::RopeInputs::unrotated, sq.get(), sk.get(), sv.get(),
                                      smask.get(), so.get(), lse, bits, grad_out, dq, dk, dv);
    } else {
      launch::attention_backward(g.device(), params, sq.get(), sk.get(), sv.get(), smask.get(),
                                 so.get(), lse, bits, grad_out, dq, dk, dv);
    }
    return std::vector<Tensor>{gq ? dq : Tensor(), gk ? dk : Tensor(), gv ? dv : Tensor()};
  });
}

}  // namespace

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_padding_mask,
                 double dropout_p, bool training, DropoutContext& ctx, double scale) {
  return padded_attention("attention", q, k, v, key_padding_mask, nullptr, dropout_p, training, ctx,
                          scale);
}

Tensor cudnn_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& key_padding_mask, double dropout_p, bool training,
                       DropoutContext& ctx, double scale) {
  return padded_attention("cudnn_attention", q, k, v, key_padding_mask, nullptr, dropout_p,
                          training, ctx, scale, kernels::AttentionEngine::vendor);
}

Tensor rope_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& key_padding_mask, const RotaryEmbedding& rotary,
                      double dropout_p, bool training, DropoutContext& ctx, double scale) {
  return padded_attention("rope_attention", q, k, v, key_padding_mask, &rotary, dropout_p, training,
                          ctx, scale);
}

// --- variable-length attention on a token stream ---------------------------------------

namespace {

// What checked_segments finds in a token stream's segment table: its longest
// segment, and whether the segments cover every token (the kernels then
// write every element of the outputs and gradients: no zero fill first).
struct SegmentCover {
  int64_t longest = 0;
  bool every_token = false;
};

// Host copy of the segment table, checked: in order, inside [0, T), not
// overlapping. (A table on a device is read back: a wait for it. Token
// layouts keep theirs on the host for this.)
SegmentCover checked_segments(const Tensor& segments, int64_t T) {
  if (segments.dim() != 2 || segments.size(1) != 4 || segments.dtype() != DType::i64)
    throw Error(detail::concat("varlen_attention: expected segments [N, 4] i64 (first token, ",
                               "length, row, row position), got ", segments.desc()));
  const std::vector<int64_t> s = segments.to_vector<int64_t>();
  int64_t end = 0, longest = 0, covered = 0;
  for (size_t n = 0; n < s.size() / 4; ++n) {
    const int64_t start = s[4 * n], len = s[4 * n + 1], row = s[4 * n + 2], pos = s[4 * n + 3];
    if (start < end || len < 0 || start + len > T || row < 0 || pos < 0)
      throw Error(detail::concat("varlen_attention: segment ", n, " (first token ", start,
                                 ", length ", len, ", row ", row, ", position ", pos,
                                 ") is out of order, overlaps or leaves the ", T, " tokens"));
    end = start + len;
    longest = std::max(longest, len);
    covered += len;
  }
  return {longest, covered == T};
}

std::atomic<bool> g_rotate_once{true};

// q or k [T, H, D] rotated once at the table's token positions: [H, T, D]
// memory (the rope kernel rotates along the dim before the last), returned as
// its [T, H, D] view.
Tensor rotated_copy(Device device, const Tensor& x, const Tensor& table, bool interleaved) {
  const Tensor out = Tensor::empty({x.size(1), x.size(0), x.size(2)}, x.dtype(), device);
  if (x.numel() > 0) launch::rope(device, x.transpose(0, 1), table, interleaved, false, out);
  return out.transpose(0, 1);
}

// varlen_attention(), varlen_rope_attention() and varlen_attention_packed():
// one node, RoPE inside when `rotary` (by the attention kernels, or by
// rotated copies the forward attends with and the backward kernel reads,
// rotating dq and dk back as it writes them: rotate_once()). With `packed` (qkv [T, 3 * H * D]),
// q, k and v are its three parts and the node's one input, whose gradient
// the kernels write part by part.
Tensor token_stream_attention(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& segments, const Tensor& segments_on_device,
                              const RotaryEmbedding* rotary, double dropout_p, bool training,
                              DropoutContext& ctx, double scale, const Tensor* packed = nullptr) {
  // The segment table may be on the host (read there, copied to q's device
  // below) or on q's device.
  const Device device = kernel_device(op, {&q, &k, &v});
  if (segments.defined() && !segments.device().is_cpu() && segments.device() != device)
    throw Error(detail::concat(op, ": segments ", segments.desc(), " are on neither the host nor ",
                               device.str()));
  if (q.dim() != 3 || k.shape() != q.shape() || v.dim() != 3 || v.size(0) != q.size(0) ||
      v.size(1) != q.size(1))
    throw Error(detail::concat(op, ": expected q, k [T, H, D] and v [T, H, Dv], got ", q.desc(),
                               ", ", k.desc(), ", ", v.desc()));
  if (q.dtype() != k.dtype() || q.dtype() != v.dtype() ||
      (q.dtype() != DType::f32 && q.dtype() != DType::f64 && q.dtype() != DType::bf16))
    throw Error(detail::concat(op, ": expected f32, bf16 or f64 q, k, v of one dtype, got ",
                               q.desc(), ", ", k.desc(), ", ", v.desc()));
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), Dv = v.size(2);
  const Tensor table = rotary_table(op, rotary, q, k, 0);
  const bool interleaved = rotary && rotary->layout == RopeLayout::interleaved;
  kernels::AttentionParams params = attention_params(op, q, H, scale, dropout_p, training, ctx);
  const SegmentCover cover = checked_segments(segments, T);
  const int64_t longest = cover.longest;
  params.longest_segment = longest;
  // Rows of tokens in no segment are left to a zero fill, needed only then.
  auto outputs = [every_token = cover.every_token, device](const Shape& shape, DType dtype) {
    return every_token ? Tensor::empty(shape, dtype, device) : Tensor::zeros(shape, dtype, device);
  };
  const bool drop = params.dropout_p > 0.0;
  // bf16 autocast (or bf16 q, k, v) as in attention: the products read bf16
  // q, k, v (kept for backward) and dO; scores, softmax and lse stay f32,
  // out and the gradients come in q's dtype.
  const bool low = autocast_bf16(device, q.dtype()) || q.dtype() == DType::bf16;
  const DType out_dtype = q.dtype();
  const DType stat_dtype = q.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const Tensor qd = kernel_operand(q, low), kd = kernel_operand(k, low),
               vd = kernel_operand(v, low);
  if (segments_on_device.defined() &&
      (segments_on_device.device() != device || segments_on_device.shape() != segments.shape() ||
       segments_on_device.dtype() != DType::i64))
    throw Error(detail::concat(op, ": segments_on_device ", segments_on_device.desc(), " on ",
                               segments_on_device.device().str(), " is not the table ",
                               segments.desc(), " on ", device.str()));
  const Tensor seg =
      segments_on_device.defined() ? segments_on_device.detach() : segments.detach().to(device);
  Tensor out = outputs({T, H, Dv}, out_dtype);
  const Tensor lse = Tensor::empty({T, H}, stat_dtype, device);
  const Tensor bits =
      drop ? Tensor::empty({T, H, (longest + 31) / 32}, DType::i32, device) : Tensor();
  if (T == 0 || longest == 0) return out;
  // Rotated once: the attention kernels read (and backward keeps) the copies.
  const bool rotary_on = rotary != nullptr;  // the backward reads this, not the pointer
  const bool once = rotary_on && g_rotate_once.load(std::memory_order_relaxed);
  const bool rotate = rotary_on && !once;  // inside the attention kernels
  const Tensor qa = once ? rotated_copy(device, qd, table, interleaved) : qd;
  const Tensor ka = once ? rotated_copy(device, kd, table, interleaved) : kd;
  if (rotate) {
    launch::rope_attention_forward(device, params, table, interleaved, qd, kd, vd, seg, out, lse,
                                   bits);
  } else {
    launch::attention_varlen_forward(device, params, qa, ka, vd, seg, out, lse, bits);
  }
  if (packed ? !needs_grad({packed}) : !needs_grad({&q, &k, &v})) return out;

  const SavedTensor sq(qa, op), sk(ka, op), sv(vd, op), so(out, op);
  const bool gq = q.requires_grad(), gk = k.requires_grad(), gv = v.requires_grad();
  const bool pack = packed != nullptr;
  const Shape packed_shape = pack ? packed->shape() : Shape();
  auto backward = [=](const Tensor& g) {
    const Tensor grad_out = kernel_operand(g, low);
    // Packed: the three gradients are parts of qkv's one (D = Dv there).
    const Tensor whole = pack ? outputs({T, 3, H, D}, out_dtype) : Tensor();
    Tensor dq = pack ? whole.select(1, 0) : outputs({T, H, D}, out_dtype);
    Tensor dk = pack ? whole.select(1, 1) : outputs({T, H, D}, out_dtype);
    Tensor dv = pack ? whole.select(1, 2) : outputs({T, H, Dv}, out_dtype);
    if (rotary_on) {
      // Rotated once: the kernels read the rotated copies and rotate the
      // gradients back as they write them (qkv's parts when packed), so dq
      // and dk are rounded to their dtype once.
      launch::rope_attention_backward(
          g.device(), params, table, interleaved,
          once ? kernels::RopeInputs::rotated : kernels::RopeInputs::unrotated, sq.get(), sk.get(),
          sv.get(), seg, so.get(), lse, bits, grad_out, dq, dk, dv);
    } else {
      launch::attention_varlen_backward(g.device(), params, sq.get(), sk.get(), sv.get(), seg,
                                        so.get(), lse, bits, grad_out, dq, dk, dv);
    }
    if (pack) return std::vector<Tensor>{whole.view(packed_shape)};
    return std::vector<Tensor>{gq ? dq : Tensor(), gk ? dk : Tensor(), gv ? dv : Tensor()};
  };
  return pack ? record(op, out, {packed}, backward) : record(op, out, {&q, &k, &v}, backward);
}

}  // namespace

void set_rotate_once(bool on) {
  g_rotate_once.store(on);
}

bool rotate_once() {
  return g_rotate_once.load();
}

Tensor varlen_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& segments,
                        double dropout_p, bool training, DropoutContext& ctx, double scale,
                        const Tensor& segments_on_device) {
  return token_stream_attention("varlen_attention", q, k, v, segments, segments_on_device, nullptr,
                                dropout_p, training, ctx, scale);
}

Tensor varlen_rope_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& segments, const RotaryEmbedding& rotary,
                             double dropout_p, bool training, DropoutContext& ctx, double scale,
                             const Tensor& segments_on_device) {
  return token_stream_attention("varlen_rope_attention", q, k, v, segments, segments_on_device,
                                &rotary, dropout_p, training, ctx, scale);
}

Tensor varlen_attention_packed(const Tensor& qkv, int64_t heads, const Tensor& segments,
                               const std::optional<RotaryEmbedding>& rotary, double dropout_p,
                               bool training, DropoutContext& ctx, double scale,
                               const Tensor& segments_on_device) {
  constexpr const char* op = "varlen_attention_packed";
  if (qkv.dim() != 2 || heads < 1 || qkv.size(1) % (3 * heads) != 0)
    throw Error(detail::concat(op, ": expected qkv [T, 3 * heads * D] for ", heads, " heads, got ",
                               qkv.desc()));
  const int64_t T = qkv.size(0), D = qkv.size(1) / (3 * heads);
  // The three parts as views (no history of their own: the node's input is
  // qkv); a qkv whose rows are not contiguous goes through a copy.
  const Tensor parts = qkv.detach().reshape({T, 3, heads, D});
  return token_stream_attention(op, parts.select(1, 0), parts.select(1, 1), parts.select(1, 2),
                                segments, segments_on_device, rotary ? &*rotary : nullptr,
                                dropout_p, training, ctx, scale, &qkv);
}

}  // namespace roformer
