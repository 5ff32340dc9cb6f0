// roformer tokenize --vocab FILE [--json] [--special] [--cased]: reads lines on
// stdin and prints their WordPiece ids, one line per input line. Without
// --vocab the config's data.vocab and data.lowercase are used.
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
    return "Print the WordPiece ids of each line read on stdin";
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
    app.add_flag("--cased", cased_, "Do not lower-case or strip accents (cased vocabularies)");
  }
  int run(const roformer::cli::Invocation& inv) override {
    roformer::data::TokenizerOptions tok;
    std::string vocab = vocab_;
    if (inv.config) {
      if (vocab.empty()) vocab = inv.config->data.vocab;
      tok.lowercase = inv.config->data.lowercase;
    }
    if (cased_) tok.lowercase = false;
    RF_INPUT_CHECK(!vocab.empty(), "tokenize needs --vocab FILE (or --config with data.vocab)");
    const roformer::data::Tokenizer tokenizer(vocab, tok);
    std::ios::sync_with_stdio(false);
    roformer::data::tokenize_stream(std::cin, std::cout, tokenizer, options_);
    std::cout.flush();
    return 0;
  }

 private:
  std::string vocab_;
  bool cased_ = false;
  roformer::data::TokenizeStreamOptions options_;
};

}  // namespace

ROFORMER_REGISTER_COMMAND(TokenizeCommand)
