// The jieba segmenter and the RoFormer (jieba + WordPiece) tokenizer against
// the golden file of tests/golden/make_jieba_golden.py (Debian's python3-jieba
// plus Hugging Face's RoFormerTokenizer rule over a pure-Python BERT port),
// and their edge cases.
#include "data/jieba.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "data/prepare.h"
#include "data/tokenizer.h"
#include "test_util.h"
#include "tests/test_support.h"

namespace roformer::data {
namespace {

using testing::kFixtures;
using testing::TempDir;
using testing::write_file;

const std::string kZh = kFixtures + "/zh";
const std::string kDict = kZh + "/jieba_dict.txt";

// bert-base-uncased with the golden script's Chinese pieces appended.
std::shared_ptr<const Vocab> zh_vocab() {
  static const auto vocab = [] {
    std::vector<std::string> tokens = testing::bert_vocab()->tokens();
    std::ifstream in(kZh + "/vocab_extra.txt");
    for (std::string line; std::getline(in, line);) tokens.push_back(line);
    return std::make_shared<const Vocab>(Vocab::from_tokens(std::move(tokens)));
  }();
  return vocab;
}

TokenizerOptions jieba_options(bool lowercase = true) {
  TokenizerOptions o;
  o.lowercase = lowercase;
  o.pre_tokenizer = PreTokenizer::jieba;
  o.jieba_dict = kDict;
  return o;
}

std::string show(const std::vector<int32_t>& ids) {
  std::string s;
  for (auto id : ids) s += std::to_string(id) + " ";
  return s;
}

std::string join(const std::vector<std::string>& words) {
  std::string s;
  for (auto& w : words) s += (s.empty() ? "" : " | ") + w;
  return s;
}

TEST(Jieba, GoldenFileExactIdsAndWords) {
  std::ifstream in(kZh + "/jieba_golden.jsonl");
  ASSERT_TRUE(in) << "missing golden file";
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  const auto header = nlohmann::json::parse(line);
  const auto vocab = zh_vocab();
  ASSERT_EQ(header["vocab_size"].get<int64_t>(), vocab->size());
  const Tokenizer uncased(vocab, jieba_options(true));
  const Tokenizer cased(vocab, jieba_options(false));
  const Jieba& jieba = *uncased.jieba();
  int64_t records = 0, failures = 0, worded = 0, chinese_tokens = 0;
  while (std::getline(in, line)) {
    const auto r = nlohmann::json::parse(line);
    ++records;
    const std::string text = r["text"];
    const bool lower = r["lowercase"].get<bool>();
    const auto ids = (lower ? uncased : cased).encode(text).input_ids;
    const auto want = r["ids"].get<std::vector<int32_t>>();
    if (ids != want && ++failures <= 10)
      ADD_FAILURE() << "line " << records + 1 << " (lowercase=" << lower
                    << "): " << r["text"].dump() << "\n  want " << show(want) << "\n  got  "
                    << show(ids) << "\n  jieba " << join(jieba.cut(text));
    for (int32_t id : ids) chinese_tokens += id >= 30522;
    if (r.contains("words")) {
      ++worded;
      const auto words = r["words"].get<std::vector<std::string>>();
      const auto got = jieba.cut(text);
      if (got != words && ++failures <= 10)
        ADD_FAILURE() << "line " << records + 1 << ": jieba words differ\n  want " << join(words)
                      << "\n  got  " << join(got);
    }
  }
  EXPECT_EQ(failures, 0);
  EXPECT_EQ(records, header["records"].get<int64_t>());
  EXPECT_GE(records, 2000);
  EXPECT_GE(worded, 500);
  EXPECT_GT(chinese_tokens, 10000);  // the word and character pieces are really used
}

TEST(Jieba, MaximumProbabilityRouteAndTies) {
  // total 100: log-probabilities of the words decide, and characters no word
  // covers count as frequency 1.
  const Jieba j =
      Jieba::from_text("北京 40\n北 5\n京 5\n大学 20\n北京大学 1\n大 10\n学 10\n南 9\n");
  EXPECT_EQ(j.cut("北京大学"), (std::vector<std::string>{"北京", "大学"}));  // .4*.2 > .01
  EXPECT_EQ(j.cut("南京人"), (std::vector<std::string>{"南", "京", "人"}));
  // 甲乙+甲 and 甲+乙甲 score a + b and b + a, exactly equal: the longer
  // first word wins, as Python's max over (score, end) tuples picks it.
  const Jieba ties = Jieba::from_text("甲乙 30\n乙甲 30\n甲 30\n乙 1\n");
  EXPECT_EQ(ties.cut("甲乙甲"), (std::vector<std::string>{"甲乙", "甲"}));
}

TEST(Jieba, BlocksAsciiRunsAndSeparators) {
  const Jieba j = Jieba::from_text("北京 40\nc# 3\n");
  // ASCII letters and digits stay together; other characters outside the
  // han blocks stand alone; "\r\n" is one segment.
  EXPECT_EQ(j.cut("abc123北京x.y"), (std::vector<std::string>{"abc123", "北京", "x", ".", "y"}));
  EXPECT_EQ(j.cut("c#北京，Ｘ \r\n\n"),
            (std::vector<std::string>{"c#", "北京", "，", "Ｘ", " ", "\r\n", "\n"}));
  EXPECT_TRUE(j.cut("").empty());
  // Segments cover the text exactly.
  const std::string text = "我们 use Python3 和 C++，😀 ok";
  std::string joined;
  for (auto& w : j.cut(text)) joined += w;
  EXPECT_EQ(joined, text);
}

TEST(Jieba, MalformedDictionaryNamesTheLine) {
  const std::string e1 =
      roformer::testing::error_of([] { Jieba::from_text("北京 40\n大学\n", "d.txt"); });
  EXPECT_NE(e1.find("d.txt:2"), std::string::npos) << e1;
  const std::string e2 =
      roformer::testing::error_of([] { Jieba::from_text("北京 4x0 ns\n", "d.txt"); });
  EXPECT_NE(e2.find("d.txt:1"), std::string::npos) << e2;
  const std::string e3 = roformer::testing::error_of([] { Jieba::from_text("北京 0\n", "d.txt"); });
  EXPECT_NE(e3.find("no word with a positive frequency"), std::string::npos) << e3;
  const std::string e4 = roformer::testing::error_of([] { Jieba::load("/nonexistent/dict.txt"); });
  EXPECT_NE(e4.find("/nonexistent/dict.txt"), std::string::npos) << e4;
}

TEST(Jieba, TokenizerRuleWholeWordsElseWordPiece) {
  TempDir dir;
  write_file(dir / "dict.txt", "北京 40\n大学 20\n北京大学 1\nhello 3\n");
  const auto vocab = std::make_shared<const Vocab>(
      Vocab::from_tokens({"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "北京", "北", "京", "大",
                          "学", "hel", "##lo", "hello", "，"}));
  TokenizerOptions o = jieba_options();
  o.jieba_dict = dir / "dict.txt";
  const Tokenizer tok(vocab, o);
  // 北京 is a vocab word; 大学 is not and splits into characters; HELLO is
  // lower-cased before jieba, then found whole.
  EXPECT_EQ(tok.tokenize("北京大学，HELLO"),
            (std::vector<std::string>{"北京", "大", "学", "，", "hello"}));
  o.lowercase = false;
  const Tokenizer cased(vocab, o);
  EXPECT_EQ(cased.tokenize("北京[MASK]hello"),
            (std::vector<std::string>{"北京", "[MASK]", "hello"}));
  EXPECT_EQ(cased.tokenize("Hello"), (std::vector<std::string>{"[UNK]"}));
  // Without the pre-tokenizer the same vocab gives BERT's characters.
  const Tokenizer plain(vocab);
  EXPECT_EQ(plain.tokenize("北京大学"), (std::vector<std::string>{"北", "京", "大", "学"}));
  EXPECT_NE(tok.pre_tokenizer_identity(), plain.pre_tokenizer_identity());
  EXPECT_EQ(tok.pre_tokenize("北京 大学[MASK]"),
            (std::vector<std::string>{"北京", "大学", "[MASK]"}));
}

TEST(Jieba, StreamEdgeCases) {
  const Tokenizer tok(zh_vocab(), jieba_options());
  // Empty lines and lines of punctuation or spaces; a line far longer than
  // any sequence; a run of 150 letters (longer than WordPiece's 100).
  std::string long_line;
  for (int i = 0; i < 2000; ++i) long_line += "床前明月光，疑是地上霜。";
  std::istringstream in("\n，。！？\n   \n" + long_line + "\n" + std::string(150, 'a') + "中\n");
  std::ostringstream out;
  tokenize_stream(in, out, tok);
  std::istringstream lines(out.str());
  std::vector<std::string> got;
  for (std::string l; std::getline(lines, l);) got.push_back(l);
  ASSERT_EQ(got.size(), 5u);
  EXPECT_EQ(got[0], "");
  EXPECT_EQ(got[1], show(tok.encode_ids("，。！？")).substr(0, got[1].size()));
  EXPECT_EQ(std::count(got[1].begin(), got[1].end(), ' '), 3);
  EXPECT_EQ(got[2], "");
  EXPECT_EQ(std::count(got[3].begin(), got[3].end(), ' ') + 1,
            int64_t(tok.encode_ids(long_line).size()));
  const auto unk = std::to_string(tok.vocab().special().unk);
  EXPECT_EQ(got[4].substr(0, unk.size() + 1), unk + " ");

  std::istringstream bad("北京\n好\xff\xfe\n");
  std::ostringstream sink;
  const std::string e = roformer::testing::error_of([&] { tokenize_stream(bad, sink, tok); });
  EXPECT_NE(e.find("line 2"), std::string::npos) << e;
  EXPECT_NE(e.find("invalid UTF-8"), std::string::npos) << e;
}

TEST(Jieba, MissingDictionaryIsAClearError) {
  TokenizerOptions o = jieba_options();
  o.jieba_dict = "/nonexistent/jieba/dict.txt";
  const std::string e = roformer::testing::error_of([&] { Tokenizer(zh_vocab(), o); });
  EXPECT_NE(e.find("/nonexistent/jieba/dict.txt"), std::string::npos) << e;
  EXPECT_THROW(parse_pre_tokenizer("hmm"), InputError);
}

}  // namespace
}  // namespace roformer::data
