#include "data/token_batch.h"

#include <algorithm>

#include "core/error.h"
#include "data/loader.h"

namespace roformer::data {

std::vector<std::vector<int64_t>> pack_first_fit(const std::vector<int64_t>& lengths,
                                                 int64_t capacity) {
  std::vector<std::vector<int64_t>> rows;
  std::vector<int64_t> used;
  for (size_t d = 0; d < lengths.size(); ++d) {
    size_t r = 0;
    while (r < rows.size() && used[r] + lengths[d] > capacity) ++r;
    if (r == rows.size()) {
      rows.emplace_back();
      used.push_back(0);
    }
    rows[r].push_back(int64_t(d));
    used[r] += lengths[d];
  }
  return rows;
}

TokenBatch make_token_batch(const std::vector<TokenSource>& docs, bool packing,
                            int64_t max_seq_len) {
  RF_CHECK(max_seq_len >= 1, "make_token_batch: max_seq_len must be positive, got ", max_seq_len);
  std::vector<int64_t> lengths;
  bool labelled = false;
  for (size_t d = 0; d < docs.size(); ++d) {
    const TokenSource& s = docs[d];
    RF_CHECK(!s.input_ids.empty() && s.token_type_ids.size() == s.input_ids.size() &&
                 (s.labels.empty() || s.labels.size() == s.input_ids.size()),
             "make_token_batch: document ", d, " has ", s.input_ids.size(), " ids, ",
             s.token_type_ids.size(), " token types and ", s.labels.size(), " labels");
    lengths.push_back(int64_t(s.input_ids.size()));
    labelled |= !s.labels.empty();
  }
  std::vector<std::vector<int64_t>> groups;
  if (packing) {
    groups = pack_first_fit(lengths, max_seq_len);
  } else {
    for (size_t d = 0; d < docs.size(); ++d) groups.push_back({int64_t(d)});
  }
  TokenBatch b;
  int64_t longest = 0;
  for (const auto& group : groups) {
    std::vector<int64_t>& row = b.rows.emplace_back();
    int64_t row_length = 0;
    for (const int64_t d : group) {
      const TokenSource& s = docs[size_t(d)];
      b.order.push_back(d);
      row.push_back(lengths[size_t(d)]);
      row_length += lengths[size_t(d)];
      b.input_ids.insert(b.input_ids.end(), s.input_ids.begin(), s.input_ids.end());
      b.token_type_ids.insert(b.token_type_ids.end(), s.token_type_ids.begin(),
                              s.token_type_ids.end());
      if (labelled) {
        if (s.labels.empty()) {
          b.labels.insert(b.labels.end(), s.input_ids.size(), -100);
        } else {
          b.labels.insert(b.labels.end(), s.labels.begin(), s.labels.end());
        }
      }
    }
    longest = std::max(longest, row_length);
  }
  b.num_tokens = int64_t(b.input_ids.size());
  b.padded_slots = int64_t(b.rows.size()) * bucketed_length(longest, max_seq_len);
  return b;
}

}  // namespace roformer::data
