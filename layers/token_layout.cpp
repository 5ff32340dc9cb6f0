#include "layers/token_layout.h"

#include "core/error.h"

namespace roformer {

TokenLayout TokenLayout::of_rows(const std::vector<std::vector<int64_t>>& rows,
                                 bool restart_positions) {
  TokenLayout l;
  std::vector<int64_t> segments, positions, tokens, firsts;
  for (size_t r = 0; r < rows.size(); ++r) {
    l.row_starts.push_back(l.num_tokens);
    int64_t row_position = 0;
    for (const int64_t len : rows[r]) {
      if (len < 1)
        throw Error(detail::concat("TokenLayout: row ", r, " has a document of length ", len,
                                   " (every document needs at least one token)"));
      l.document_starts.push_back(l.num_tokens);
      firsts.push_back(l.num_tokens);
      segments.insert(segments.end(), {l.num_tokens, len, int64_t(r), row_position});
      for (int64_t i = 0; i < len; ++i) {
        positions.push_back(restart_positions ? i : row_position + i);
        tokens.insert(tokens.end(), {int64_t(r), row_position + i});
      }
      row_position += len;
      l.num_tokens += len;
    }
  }
  l.row_starts.push_back(l.num_tokens);
  l.document_starts.push_back(l.num_tokens);
  const int64_t docs = int64_t(firsts.size());
  l.segments = Tensor::from_vector(segments, {docs, 4});
  l.positions = Tensor::from_vector(positions, {l.num_tokens});
  l.tokens = Tensor::from_vector(tokens, {l.num_tokens, 2});
  l.document_firsts = Tensor::from_vector(firsts, {docs});
  return l;
}

TokenLayout TokenLayout::to(Device device) const {
  return with_tensors([device](const Tensor& t) { return t.to(device); });
}

TokenLayout TokenLayout::with_tensors(const std::function<Tensor(const Tensor&)>& move) const {
  TokenLayout l = *this;
  for (Tensor* t : {&l.positions, &l.tokens, &l.document_firsts})
    if (t->defined()) *t = move(*t);
  if (l.segments.defined()) l.device_segments = move(l.segments);
  return l;
}

TokenLayout TokenLayout::of_lengths(const std::vector<int64_t>& lengths) {
  std::vector<std::vector<int64_t>> rows;
  rows.reserve(lengths.size());
  for (const int64_t len : lengths) rows.push_back({len});
  return of_rows(rows);
}

}  // namespace roformer
