// The token-stream layout of an unpadded micro-batch (docs/architecture.md,
// "Token stream"): the real tokens of all rows laid end to end, T of them,
// and where each row and each document starts. Embeddings, projections, the
// FFN and the heads run on [T, hidden]; attention runs per segment (a
// document: the whole row, or one of the documents packed into it).
//
// A row is what a padded batch's row would be: its tokens keep their row
// position, and dropout draws by (row, position) as a padded row does, so an
// unpadded run draws the padded run's masks. With packing several documents
// share a row; attention never crosses a document, and RoPE positions either
// restart at each document or run on through the row.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/tensor.h"

namespace roformer {

struct TokenLayout {
  int64_t num_tokens = 0;
  std::vector<int64_t> row_starts;       // first token of each row, then num_tokens
  std::vector<int64_t> document_starts;  // first token of each document, then num_tokens
  // [documents, 4] i64: (first token, length, row, row position). Always on
  // the host: the attention ops check it there (and take its longest
  // length) without waiting for the device.
  Tensor segments;
  // The same table where the model runs (set by `to` and `with_tensors`),
  // which the attention kernels read; undefined: each op copies it.
  Tensor device_segments;
  Tensor positions;        // [T] i64: each token's RoPE (and absolute-embedding) position
  Tensor tokens;           // [T, 2] i64: (row, row position), the dropout key
  Tensor document_firsts;  // [documents] i64: each document's first token ([CLS])

  int64_t num_rows() const { return int64_t(row_starts.size()) - 1; }
  int64_t num_documents() const { return int64_t(document_starts.size()) - 1; }

  // rows[r] lists the lengths of the documents packed into row r (one entry
  // per row when nothing is packed). restart_positions: each document's
  // positions start at 0; otherwise they run on through the row.
  static TokenLayout of_rows(const std::vector<std::vector<int64_t>>& rows,
                             bool restart_positions = true);
  // One document per row.
  static TokenLayout of_lengths(const std::vector<int64_t>& lengths);

  // The same layout with its tensors on `device` (the host vectors and the
  // host segment table stay; device_segments is its copy).
  TokenLayout to(Device device) const;
  // The same layout with each tensor replaced by move(tensor), the segment
  // table's into device_segments: how a trainer sends it through its
  // pinned-memory uploader.
  TokenLayout with_tensors(const std::function<Tensor(const Tensor&)>& move) const;
};

}  // namespace roformer
