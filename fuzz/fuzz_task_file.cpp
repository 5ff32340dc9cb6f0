// The fine-tuning task-file readers (JSON lines and TSV, labelled or not) and
// their encoding with the test vocabulary.
#include <memory>

#include "data/tokenizer.h"
#include "fuzz/fuzz_support.h"
#include "train/task_data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const roformer::data::Tokenizer tokenizer(ROFORMER_FUZZ_VOCAB);
  const std::string& path = roformer::fuzz::input_file(data, size, ".task");
  const bool tsv = size > 0 && (data[0] & 1);
  const bool pair = size > 0 && (data[0] & 2);
  roformer::FinetuneConfig spec;
  spec.format = tsv ? roformer::TaskFormat::kTsv : roformer::TaskFormat::kJsonl;
  spec.task = pair ? roformer::FinetuneTask::kPair : roformer::FinetuneTask::kClassification;
  spec.text_fields =
      pair ? std::vector<std::string>{"text_a", "text_b"} : std::vector<std::string>{"text"};
  spec.max_seq_len = 16;
  for (auto use : {roformer::LabelUse::kRequired, roformer::LabelUse::kIgnored}) {
    roformer::fuzz::expect_error_or_success([&] {
      const roformer::TaskFile file = roformer::read_task_file(path, spec, use);
      const auto labels = use == roformer::LabelUse::kRequired
                              ? roformer::resolve_labels(spec, file)
                              : std::vector<std::string>{};
      (void)roformer::encode_task(file, tokenizer, spec, labels);
    });
  }
  return 0;
}
