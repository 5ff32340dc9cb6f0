#pragma once

#include "core/tensor.h"

namespace roformer::cpu {

// dst[i] = cast(src[i]) for same-shaped tensors of any geometry and dtypes.
void copy_strided(const Tensor& src, const Tensor& dst);

// dst[i] = value for every element of dst.
void fill(const Tensor& dst, double value);

}  // namespace roformer::cpu
