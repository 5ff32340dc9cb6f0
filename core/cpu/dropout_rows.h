// Dropout over contiguous rows of `features` (the last dim), row r being one
// token of the shared rule (core/philox.h): the dropout kernels' loop, which
// layer norm's residual dropout (ResidualDropout, core/kernels/kernel_list.h)
// runs too, so both give the same bits.
#pragma once

#include "core/cpu/view.h"

namespace roformer::kernels::cpu {

// out = dropout(x) for x, out contiguous [..., features], of one dtype or an
// f32 x into a bf16 out (x rounded to bf16 first: the cast, then dropout).
// Row r is token (key.first_sequence + tokens[r][0], tokens[r][1]) when
// `tokens` ([rows, 2] i64) is defined, else (key.first_sequence +
// r / positions, r % positions).
void dropout_rows(const View& x, const View& out, double p, const DropoutKey& key,
                  const View& tokens, int64_t positions);

// sum = dropout(x) + residual in one pass, the rows as dropout_rows': x of
// the sum's dtype, or bf16 on an f32 residual and sum; dropout's output is
// rounded to x's dtype before the add, as the two kernels would leave it.
void dropout_add_rows(const View& x, const View& residual, const View& sum, double p,
                      const DropoutKey& key, const View& tokens, int64_t positions);

}  // namespace roformer::kernels::cpu
