// roformer tokenize --vocab FILE [--pre-tokenizer none|jieba] [--json] [--special]
// [--no-lowercase]: reads lines on stdin and prints their ids, one line per
// input line. Without --vocab the config's data.vocab, data.lowercase and
// data.pre_tokenizer are used.
#include <iostream>

#include "core/error.h"
#include "data/prepare.h"
#include "train/cli/command.h"
#include "train/config.h"

namespace {

class TokenizeCommand : public roformer::cli::Command {
 public:
  std::string name() const override { return "tokenize"; }
  std::string description() const override {
    return "Print the token ids of each line read on stdin";
  }
  roformer::cli::ConfigMode config_mode() const override {
    return roformer::cli::ConfigMode::kOptional;
  }
  void setup(CLI::App& app) override {
    app.add_option("--vocab", vocab_, "vocab.txt (default: the config's data.vocab)")
        ->type_name("FILE");
    app.add_flag("--json", options_.json,
                 "Print {\"ids\": [...], \"tokens\": [...]} per line instead of ids");
    app.add_flag("--special", options_.add_special_tokens, "Add [CLS] and [SEP]");
    app.add_flag("--no-lowercase,--cased", cased_,
                 "Do not lower-case or strip accents (cased vocabularies)");
    app.add_option("--pre-tokenizer", pre_tokenizer_,
                   "none: BERT's WordPiece; jieba: RoFormer's Chinese words first "
                   "(default: the config's data.pre_tokenizer, else none)")
        ->check(CLI::IsMember({"none", "jieba"}));
    app.add_option("--jieba-dict", jieba_dict_,
                   "jieba's dict.txt (default: the config's, else python3-jieba's)")
        ->type_name("FILE");
  }
  int run(const roformer::cli::Invocation& inv) override {
    roformer::data::TokenizerOptions tok;
    std::string vocab = vocab_;
    if (inv.config) {
      if (vocab.empty()) vocab = inv.config->data.vocab;
      tok = roformer::tokenizer_options(inv.config->data);
    }
    if (cased_) tok.lowercase = false;
    if (!pre_tokenizer_.empty())
      tok.pre_tokenizer = roformer::data::parse_pre_tokenizer(pre_tokenizer_);
    if (!jieba_dict_.empty()) tok.jieba_dict = jieba_dict_;
    RF_INPUT_CHECK(!vocab.empty(), "tokenize needs --vocab FILE (or --config with data.vocab)");
    const roformer::data::Tokenizer tokenizer(vocab, tok);
    std::ios::sync_with_stdio(false);
    roformer::data::tokenize_stream(std::cin, std::cout, tokenizer, options_);
    std::cout.flush();
    return 0;
  }

 private:
  std::string vocab_, pre_tokenizer_, jieba_dict_;
  bool cased_ = false;
  roformer::data::TokenizeStreamOptions options_;
};

}  // namespace

ROFORMER_REGISTER_COMMAND(TokenizeCommand)
