// What the rope op and the attention ops with RoPE inside share
// (core/ops/rope.cpp): the argument checks and the cached cos/sin table.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace roformer {

// Throws naming `op` unless positions is [S] i32/i64, D is even and base > 0.
void check_rope_arguments(const char* op, const Tensor& positions, int64_t S, int64_t D,
                          double base, const Tensor& x);

// The cos/sin table [2, S, D/2] (f32, or f64 for f64 x) of positions [S] on
// their device, cached per positions tensor (storage, offset, version).
Tensor rope_table(const Tensor& positions, int64_t dim, double base, DType dtype);

// The table's dtype for operands of `x`: angles are computed in double, and
// f32 and bf16 operands rotate with an f32 table.
inline DType rope_table_dtype(DType x) {
  return x == DType::f64 ? DType::f64 : DType::f32;
}

}  // namespace roformer
