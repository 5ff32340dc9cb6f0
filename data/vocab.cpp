#include "data/vocab.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/file_checks.h"
#include "core/file_write.h"
#include "data/hash.h"
#include "data/utf8.h"

namespace roformer::data {

Vocab Vocab::load(const std::string& path) {
  reject_directory(path, "vocab file");
  std::ifstream in(path, std::ios::binary);
  RF_INPUT_CHECK(in, "vocab file '", path, "' cannot be opened (does it exist?)");
  std::vector<std::string> tokens;
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();  // CRLF files
    if (auto bad = find_invalid_utf8(line))
      throw InputError(detail::concat("vocab file '", path, "' line ", line_no,
                                      ": invalid UTF-8 at byte ", *bad, " of the line"));
    tokens.push_back(std::move(line));
  }
  RF_INPUT_CHECK(!tokens.empty(), "vocab file '", path, "' is empty");
  return from_tokens(std::move(tokens), path);
}

Vocab Vocab::from_tokens(std::vector<std::string> tokens, std::string source) {
  Vocab v;
  v.tokens_ = std::move(tokens);
  v.source_ = std::move(source);
  v.index();
  return v;
}

void Vocab::index() {
  ids_.clear();
  ids_.reserve(tokens_.size());
  continuation_.assign(tokens_.size(), 0);
  Fnv1a64 h;
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const std::string& t = tokens_[i];
    // A repeated piece maps to its last line, as Hugging Face's load_vocab does.
    ids_[t] = int32_t(i);
    const bool cont = t.size() > 2 && t.compare(0, 2, "##") == 0;
    continuation_[i] = cont;
    max_piece_bytes_ = std::max(max_piece_bytes_, cont ? t.size() - 2 : t.size());
    h.update(t).update("\n");
  }
  hash_ = h.hex();
  auto need = [&](std::string_view name) {
    const int32_t id = find(name);
    RF_INPUT_CHECK(id >= 0, "vocab '", source_, "' lacks the special token ", name,
                   " (a BERT vocab needs [PAD] [UNK] [CLS] [SEP] [MASK])");
    return id;
  };
  special_.pad = need(kPadToken);
  special_.unk = need(kUnkToken);
  special_.cls = need(kClsToken);
  special_.sep = need(kSepToken);
  special_.mask = need(kMaskToken);
}

const std::string& Vocab::token(int32_t id) const {
  RF_CHECK(id >= 0 && size_t(id) < tokens_.size(), "token id ", id, " is outside the vocab of ",
           tokens_.size(), " pieces ('", source_, "')");
  return tokens_[size_t(id)];
}

void Vocab::save(const std::string& path) const {
  write_file_atomically(path, "vocab file", [this](std::ostream& out) {
    for (const auto& t : tokens_) out << t << '\n';
  });
}

}  // namespace roformer::data
