// Dropout over contiguous rows of `features` (the last dim), row r being one
// token of the shared rule (core/philox.h): the dropout kernels' loop, which
// layer norm's residual dropout (ResidualDropout, core/kernels/kernel_list.h)
// runs too, so both give the same bits.
#pragma once

#include "core/cpu/view.h"

namespace roformer::kernels::cpu {

// out = dropout(x) for x, out contiguous [..., features] of one dtype. Row r
// is token (key.first_sequence + tokens[r][0], tokens[r][1]) when `tokens`
// ([rows, 2] i64) is defined, else (key.first_sequence + r / positions,
// r % positions).
void dropout_rows(const View& x, const View& out, double p, const DropoutKey& key,
                  const View& tokens, int64_t positions);

}  // namespace roformer::kernels::cpu
