// Downstream task files (JSON lines or TSV with a header row) and their
// encoding into token ids. Every problem is an InputError naming the file and
// the line: empty lines, missing or non-text fields, unknown labels, texts
// over the length limit with truncation: error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "train/config.h"

namespace roformer {

struct TaskExample {
  std::vector<std::string> texts;  // finetune.text_fields, in order
  std::string label;               // "" when the file has no label (prediction)
  int64_t line = 0;                // 1-based line in the file
};

struct TaskFile {
  std::string path;
  std::vector<TaskExample> examples;
};

// Reads `path` with the fields `spec` names. `label`: required (training and
// evaluation) or ignored (prediction).
enum class LabelUse { kRequired, kIgnored };
TaskFile read_task_file(const std::string& path, const FinetuneConfig& spec, LabelUse label);

// The label set: spec.labels, or for triplet tasks ["B", "C"] when empty, or
// the sorted distinct labels of `train` otherwise. Throws InputError when a
// task needs a label set of a given size (triplet: 2) or fewer than 2 remain.
std::vector<std::string> resolve_labels(const FinetuneConfig& spec, const TaskFile& train);

// One example as model input: 1 encoding for classification and pair tasks,
// 2 for triplets ((A, B) and (A, C), each with token types 0/1).
struct EncodedExample {
  std::vector<data::Encoding> parts;
  int32_t label = -1;  // index into the label set; -1 when unlabelled
  int64_t line = 0;
};

struct EncodedTask {
  std::string path;
  std::vector<EncodedExample> examples;
  int64_t truncated = 0;  // examples cut to max_seq_len
};

// Tokenizes every example to at most spec.max_seq_len tokens (longest text
// cut first). With truncation: error, an example that does not fit throws
// naming its line. A label outside `labels` throws naming the line and the
// known labels.
EncodedTask encode_task(const TaskFile& file, const data::Tokenizer& tokenizer,
                        const FinetuneConfig& spec, const std::vector<std::string>& labels);

}  // namespace roformer
