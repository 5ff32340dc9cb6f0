// The tokenizer against the golden file written by an independent reference
// (tests/golden/make_tokenizer_golden.py: a pure-Python port of Hugging
// Face's BertTokenizer on Python's unicodedata), plus the vocab's checks.
#include "data/tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "data/prepare.h"
#include "test_util.h"

namespace roformer::data {
namespace {

using testing::bert_vocab;
using testing::kFixtures;
using testing::TempDir;
using testing::write_file;

std::string show(const std::vector<int32_t>& ids) {
  std::string s;
  for (auto id : ids) s += std::to_string(id) + " ";
  return s;
}

TokenizerOptions cased() {
  TokenizerOptions o;
  o.lowercase = false;
  return o;
}

TEST(Tokenizer, GoldenFileExactIds) {
  std::ifstream in(kFixtures + "/tokenizer_golden.jsonl");
  ASSERT_TRUE(in) << "missing golden file";
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  const auto header = nlohmann::json::parse(line);
  ASSERT_TRUE(header.contains("reference"));
  EXPECT_EQ(header["vocab_md5"], "64800d5d8528ce344256daf115d4965e");
  const Tokenizer uncased_tok(bert_vocab());
  const Tokenizer cased_tok(bert_vocab(), cased());
  int64_t records = 0, failures = 0, decoded = 0, pairs = 0;
  while (std::getline(in, line)) {
    const auto r = nlohmann::json::parse(line);
    ++records;
    const Tokenizer& tok = r["lowercase"].get<bool>() ? uncased_tok : cased_tok;
    const std::string text = r["text"];
    std::optional<std::string> pair;
    if (r.contains("text_pair")) pair = r["text_pair"].get<std::string>();
    const int64_t max_length = r.value("max_length", int64_t(0));
    const Encoding e = pair ? tok.encode(text, std::string_view(*pair), max_length)
                            : tok.encode(text, std::nullopt, max_length);
    const auto want = r["ids"].get<std::vector<int32_t>>();
    if (e.input_ids != want) {
      if (++failures <= 10)
        ADD_FAILURE() << "line " << records + 1 << ": " << r["text"].dump() << "\n  want "
                      << show(want) << "\n  got  " << show(e.input_ids);
      continue;
    }
    if (r.contains("token_type_ids")) {
      ++pairs;
      EXPECT_EQ(e.token_type_ids, r["token_type_ids"].get<std::vector<int32_t>>())
          << "line " << records + 1;
    }
    if (r.contains("decoded")) {
      ++decoded;
      EXPECT_EQ(tok.decode(e.input_ids), r["decoded"].get<std::string>()) << "line " << records + 1;
    }
  }
  EXPECT_EQ(records, header["records"].get<int64_t>());
  EXPECT_GE(records, 2000);
  EXPECT_GT(decoded, 500);
  EXPECT_GT(pairs, 100);
  EXPECT_EQ(failures, 0) << failures << " of " << records << " lines differ";
}

TEST(Tokenizer, WordPieceAndSpecials) {
  const Tokenizer tok(bert_vocab());
  EXPECT_EQ(tok.tokenize("unaffable"), (std::vector<std::string>{"una", "##ffa", "##ble"}));
  // Special tokens are cut out of the raw text, even without spaces around.
  EXPECT_EQ(tok.encode_ids("the[MASK]"), (std::vector<int32_t>{1996, 103}));
  EXPECT_EQ(tok.encode_ids("[mask]"), (std::vector<int32_t>{1031, 7308, 1033}));
  // Words over 100 characters are [UNK]; exactly 100 is still split.
  EXPECT_EQ(tok.encode_ids(std::string(101, 'a')), (std::vector<int32_t>{100}));
  EXPECT_NE(tok.encode_ids(std::string(100, 'a')), (std::vector<int32_t>{100}));
  // Accents stripped when lower-casing, kept (and unknown here) when not.
  EXPECT_EQ(tok.tokenize("Café"), (std::vector<std::string>{"cafe"}));
  const Tokenizer keep(bert_vocab(), cased());
  EXPECT_EQ(keep.tokenize("Café")[0], "[UNK]");
  EXPECT_TRUE(tok.encode_ids("").empty());
  EXPECT_TRUE(tok.encode_ids(" \t\x01\n").empty());
}

TEST(Tokenizer, PairsTruncateLongestFirst) {
  const Tokenizer tok(bert_vocab());
  const Encoding e = tok.encode("one two three four five six", std::string_view("seven eight"), 8);
  // 6 + 2 + 3 special > 8: three tokens go, all from the longer first text.
  EXPECT_EQ(e.input_ids, (std::vector<int32_t>{101, 2028, 2048, 2093, 102, 2698, 2809, 102}));
  EXPECT_EQ(e.token_type_ids, (std::vector<int32_t>{0, 0, 0, 0, 0, 1, 1, 1}));
  EXPECT_THROW(tok.encode("a", std::string_view("b"), 2), InputError);
}

TEST(Tokenizer, DecodeJoinsPieces) {
  const Tokenizer tok(bert_vocab());
  const auto e = tok.encode("The unaffable whale, don't you think?");
  EXPECT_EQ(tok.decode(e.input_ids), "the unaffable whale, don't you think?");
  EXPECT_EQ(tok.decode(e.input_ids, /*skip_special_tokens=*/false),
            "[CLS] the unaffable whale, don't you think? [SEP]");
}

TEST(Tokenizer, IdentityNamesVocabAndOptions) {
  const Tokenizer a(bert_vocab()), b(bert_vocab(), cased());
  EXPECT_EQ(a.identity().vocab_size, 30522);
  EXPECT_FALSE(a.identity() == b.identity());
  EXPECT_NE(a.identity().describe().find(bert_vocab()->hash()), std::string::npos);
}

TEST(Vocab, MissingSpecialTokenNamesFileAndToken) {
  TempDir dir;
  const std::string path = dir / "vocab.txt";
  write_file(path, "[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n##lo\n");
  try {
    Vocab::load(path);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[MASK]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Vocab::load(dir / "missing.txt"), InputError);
  write_file(path, "");
  EXPECT_THROW(Vocab::load(path), InputError);
  write_file(path, "[PAD]\n[UNK]\n\xff\xfe\n");
  try {
    Vocab::load(path);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("line 3"), std::string::npos) << e.what();
  }
}

TEST(Vocab, SaveLoadRoundTripKeepsHash) {
  TempDir dir;
  bert_vocab()->save(dir / "v.txt");
  const Vocab v = Vocab::load(dir / "v.txt");
  EXPECT_EQ(v.hash(), bert_vocab()->hash());
  EXPECT_EQ(v.size(), 30522);
  EXPECT_EQ(v.special().mask, 103);
  EXPECT_TRUE(v.is_continuation(v.find("##s")));
}

TEST(TokenizeStream, IdsAndJson) {
  const Tokenizer tok(bert_vocab());
  std::istringstream in("Call me Ishmael.\nthe [MASK]\n");
  std::ostringstream out;
  tokenize_stream(in, out, tok);
  EXPECT_EQ(out.str(), "2655 2033 2003 22444 2884 1012\n1996 103\n");
  std::istringstream in2("Hello\n");
  std::ostringstream json;
  tokenize_stream(in2, json, tok, {.json = true, .add_special_tokens = true});
  EXPECT_EQ(json.str(), R"({"ids":[101,7592,102],"tokens":["[CLS]","hello","[SEP]"]})"
                        "\n");
  std::istringstream bad("ok\nbad \xc3\x28 byte\n");
  std::ostringstream sink;
  try {
    tokenize_stream(bad, sink, tok);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("byte 4"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace roformer::data
