// roformer prepare --config FILE [--build-vocab SIZE] [--force]: the corpus
// (data.inputs) -> optionally a learned WordPiece vocab (data.vocab) -> HDF5
// shards in data.shard_dir. The work is data::run_prepare (data/prepare.h).
#include <spdlog/spdlog.h>

#include <iostream>

#include "data/prepare.h"
#include "train/cli/command.h"
#include "train/config.h"

namespace {

class PrepareCommand : public roformer::cli::Command {
 public:
  std::string name() const override { return "prepare"; }
  std::string description() const override {
    return "Tokenize the corpus (data.inputs) into HDF5 shards in data.shard_dir, optionally "
           "learning the vocab first";
  }
  void setup(CLI::App& app) override {
    app.add_option("--build-vocab", build_vocab_,
                   "Learn a vocab of SIZE pieces from data.inputs (WordPiece; with "
                   "data.pre_tokenizer: jieba, characters + jieba words + WordPiece) and write it "
                   "to data.vocab before making the shards")
        ->type_name("SIZE")
        ->check(CLI::Range(int64_t(6), int64_t(1) << 31));
    app.add_flag("--force", force_, "Rebuild the shards even when they are up to date");
    app.add_option("--max-shard-tokens", max_shard_tokens_, "Tokens per shard file at most")
        ->type_name("N")
        ->check(CLI::PositiveNumber);
  }
  int run(const roformer::cli::Invocation& inv) override {
    const roformer::Config& config = *inv.config;
    roformer::require_for(config, roformer::ConfigUse::kPrepare);
    const roformer::DataConfig& d = config.data;
    roformer::data::PrepareOptions o;
    o.vocab = d.vocab;
    o.lowercase = d.lowercase;
    o.pre_tokenizer = d.pre_tokenizer;
    o.jieba_dict = d.jieba_dict;
    o.inputs = d.inputs;
    o.input_format = d.input_format == roformer::data::InputFormat::jsonl ? "jsonl" : "text";
    o.jsonl_field = d.jsonl_field;
    o.shard_dir = d.shard_dir;
    o.validation_fraction = d.validation_fraction;
    o.split_seed = d.split_seed;
    o.invalid_utf8 = d.invalid_utf8 == roformer::data::InvalidUtf8::replace ? "replace" : "error";
    o.build_vocab = build_vocab_;
    o.threads = int(config.run.threads);
    o.progress = config.log.progress != roformer::ProgressMode::kNever;
    o.max_shard_tokens = max_shard_tokens_;
    o.force = force_;
    const roformer::data::PrepareResult r = roformer::data::run_prepare(o);
    std::cout << (r.up_to_date ? "up to date: " : "wrote: ") << r.train_shards.size()
              << " train shard(s) (" << r.train_tokens << " tokens, " << r.train_documents
              << " documents), " << r.validation_shards.size() << " validation shard(s) ("
              << r.validation_tokens << " tokens, " << r.validation_documents << " documents) in "
              << o.shard_dir << "\n";
    return 0;
  }

 private:
  int64_t build_vocab_ = 0;
  bool force_ = false;
  int64_t max_shard_tokens_ = int64_t(1) << 28;
};

}  // namespace

ROFORMER_REGISTER_COMMAND(PrepareCommand)
