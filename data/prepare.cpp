#include "data/prepare.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <thread>

#include "core/error.h"
#include "core/file_write.h"
#include "core/philox.h"
#include "data/hash.h"
#include "data/shard.h"
#include "data/text_reader.h"
#include "data/utf8.h"
#include "data/vocab_builder.h"

namespace roformer::data {
namespace fs = std::filesystem;
namespace {

constexpr const char* kManifest = "manifest.json";
constexpr const char* kManifestFormat = "roformer-corpus-manifest";

// "\r[#####.....]  45%  12.3 MB/s" on stderr when it is a terminal.
class ProgressBar {
 public:
  ProgressBar(std::string label, uint64_t total, bool enabled)
      : label_(std::move(label)),
        total_(std::max<uint64_t>(1, total)),
        enabled_(enabled && ::isatty(STDERR_FILENO)),
        start_(std::chrono::steady_clock::now()) {}
  ~ProgressBar() { finish(); }
  void add(uint64_t n) {
    const uint64_t done = done_ += n;
    if (!enabled_) return;
    std::lock_guard lock(mutex_);
    const auto now = std::chrono::steady_clock::now();
    if (done < total_ && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    draw(done);
  }
  void finish() {
    if (!enabled_ || finished_) return;
    finished_ = true;
    draw(done_);
    std::fputc('\n', stderr);
  }

 private:
  void draw(uint64_t done) {
    const double frac = std::min(1.0, double(done) / double(total_));
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const int width = 30, fill = int(frac * width);
    std::fprintf(stderr, "\r%s [%s%s] %3d%%  %.1f MB/s", label_.c_str(),
                 std::string(size_t(fill), '#').c_str(),
                 std::string(size_t(width - fill), '.').c_str(), int(frac * 100),
                 secs > 0 ? double(done) / 1e6 / secs : 0.0);
    std::fflush(stderr);
  }
  std::string label_;
  uint64_t total_;
  bool enabled_;
  bool finished_ = false;
  std::atomic<uint64_t> done_{0};
  std::mutex mutex_;
  std::chrono::steady_clock::time_point start_, last_{};
};

struct FileTokens {
  std::vector<uint32_t> tokens;
  std::vector<uint64_t> doc_lengths;
  int64_t empty_documents = 0;  // documents with no token after clean-up
};

// Runs fn(i) for i in [0, n) on `threads` threads; rethrows the first error.
template <class Fn>
void parallel_for(size_t n, int threads, Fn&& fn) {
  const int t = std::max(
      1, std::min<int>(threads > 0 ? threads : int(std::thread::hardware_concurrency()), int(n)));
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&] {
    for (size_t i; !failed && (i = next++) < n;) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int k = 1; k < t; ++k) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

std::string shard_name(const std::string& split, size_t index) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-%05zu.h5", split.c_str(), index);
  return buf;
}

TextReadOptions read_options(const PrepareOptions& o) {
  TextReadOptions r;
  r.format = parse_input_format(o.input_format);
  r.jsonl_field = o.jsonl_field;
  r.invalid_utf8 = parse_invalid_utf8(o.invalid_utf8);
  return r;
}

// The manifest's shards when it matches `fingerprint` and every shard it lists
// exists with that fingerprint; otherwise nullopt.
std::optional<PrepareResult> existing_result(const std::string& dir,
                                             const std::string& fingerprint) {
  const fs::path manifest = fs::path(dir) / kManifest;
  std::error_code ec;
  if (!fs::exists(manifest, ec)) return std::nullopt;
  try {
    std::ifstream in(manifest);
    const auto m = nlohmann::json::parse(in);
    if (m.value("format", "") != kManifestFormat || m.value("fingerprint", "") != fingerprint)
      return std::nullopt;
    PrepareResult r;
    r.up_to_date = true;
    r.fingerprint = fingerprint;
    for (const char* split : {"train", "validation"}) {
      for (const auto& name : m.at(split).get<std::vector<std::string>>()) {
        const std::string path = (fs::path(dir) / name).string();
        if (read_shard_info(path).fingerprint != fingerprint) return std::nullopt;
        (std::string(split) == "train" ? r.train_shards : r.validation_shards).push_back(path);
      }
    }
    r.files = m.value("files", int64_t(0));
    r.train_documents = m.value("train_documents", int64_t(0));
    r.validation_documents = m.value("validation_documents", int64_t(0));
    r.documents = r.train_documents + r.validation_documents;
    r.train_tokens = m.value("train_tokens", int64_t(0));
    r.validation_tokens = m.value("validation_tokens", int64_t(0));
    return r;
  } catch (const std::exception&) {
    return std::nullopt;  // unreadable manifest or shard: rebuild
  }
}

}  // namespace

std::string prepare_fingerprint(const PrepareOptions& o, const std::vector<std::string>& files,
                                const TokenizerIdentity& tok, const std::string& pre_tokenizer) {
  Fnv1a64 h;
  h.update_field("roformer-prepare-v1");
  h.update_field(tok.describe());
  // Absent for BERT's tokenizer, so its fingerprints stay what they were.
  if (pre_tokenizer != "none") h.update_field(pre_tokenizer);
  h.update_field(o.input_format).update_field(o.jsonl_field).update_field(o.invalid_utf8);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", o.validation_fraction);
  h.update_field(buf);
  h.update_value(o.split_seed).update_value(o.max_shard_tokens);
  std::vector<char> chunk(1 << 20);
  for (const auto& f : files) {
    h.update_field(f);
    std::ifstream in(f, std::ios::binary);
    RF_INPUT_CHECK(in, "input file '", f, "' cannot be opened");
    uint64_t size = 0;
    while (in) {
      in.read(chunk.data(), std::streamsize(chunk.size()));
      const auto got = size_t(in.gcount());
      h.update(chunk.data(), got);
      size += got;
    }
    h.update_value(size);
  }
  return h.hex();
}

PrepareResult run_prepare(const PrepareOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  RF_INPUT_CHECK(!o.vocab.empty(), "data.vocab is not set (path of a vocab.txt)");
  RF_INPUT_CHECK(!o.shard_dir.empty(), "data.shard_dir is not set");
  RF_INPUT_CHECK(!o.inputs.empty(), "data.inputs is empty (list files or glob patterns)");
  RF_INPUT_CHECK(o.validation_fraction >= 0 && o.validation_fraction < 1,
                 "data.validation_fraction must be in [0, 1), not ", o.validation_fraction);
  RF_INPUT_CHECK(o.max_shard_tokens > 0, "max_shard_tokens must be positive");
  const TextReadOptions read = read_options(o);
  const std::vector<std::string> files = expand_inputs(o.inputs);
  TokenizerOptions tok_options;
  tok_options.lowercase = o.lowercase;
  tok_options.pre_tokenizer = o.pre_tokenizer;
  tok_options.jieba_dict = o.jieba_dict;

  if (o.build_vocab > 0) {
    const bool words = o.pre_tokenizer == PreTokenizer::jieba;
    spdlog::info("prepare: learning a {}-piece {} vocab from {} files", o.build_vocab,
                 words ? "jieba word + character" : "WordPiece", files.size());
    VocabBuilderOptions vb;
    vb.vocab_size = o.build_vocab;
    vb.threads = o.threads;
    auto pieces = words
                      ? build_word_vocab(count_pre_tokens(files, read, tok_options, o.threads),
                                         tok_options, vb)
                      : build_wordpiece_vocab(count_words(files, read, tok_options, o.threads), vb);
    const Vocab built = Vocab::from_tokens(std::move(pieces), o.vocab);
    std::error_code ec;
    bool same = false;
    if (fs::exists(o.vocab, ec)) {
      try {
        same = Vocab::load(o.vocab).tokens() == built.tokens();
      } catch (const InputError&) {
      }
    }
    if (same) {
      spdlog::info("prepare: vocab {} is unchanged ({} pieces)", o.vocab, built.size());
    } else {
      const auto parent = fs::path(o.vocab).parent_path();
      if (!parent.empty()) fs::create_directories(parent);
      built.save(o.vocab);
      spdlog::info("prepare: wrote vocab {} ({} pieces)", o.vocab, built.size());
    }
  }

  const Tokenizer tokenizer(o.vocab, tok_options);
  const TokenizerIdentity identity = tokenizer.identity();
  const std::string fingerprint =
      prepare_fingerprint(o, files, identity, tokenizer.pre_tokenizer_identity());
  if (!o.force) {
    if (auto r = existing_result(o.shard_dir, fingerprint)) {
      spdlog::info("prepare: shards in {} are up to date (fingerprint {}); nothing to do",
                   o.shard_dir, fingerprint);
      return *r;
    }
  }

  // Tokenize every file, files in parallel.
  uint64_t total_bytes = 0;
  for (const auto& f : files) total_bytes += fs::file_size(f);
  std::vector<FileTokens> per_file(files.size());
  {
    ProgressBar bar("tokenizing", total_bytes, o.progress);
    parallel_for(files.size(), o.threads, [&](size_t i) {
      FileTokens& ft = per_file[i];
      std::vector<int32_t> ids;
      read_documents(files[i], read, [&](std::string_view text, int64_t) {
        ids.clear();
        tokenizer.encode_ids(text, ids);
        if (ids.empty()) {
          ++ft.empty_documents;
          return;
        }
        ft.tokens.insert(ft.tokens.end(), ids.begin(), ids.end());
        ft.doc_lengths.push_back(ids.size());
      });
      bar.add(fs::file_size(files[i]));
    });
  }

  // Documents in corpus order: (file, index in file).
  struct DocRef {
    uint32_t file;
    uint64_t begin, length;
  };
  std::vector<DocRef> docs;
  int64_t empty = 0;
  for (size_t f = 0; f < files.size(); ++f) {
    uint64_t begin = 0;
    for (uint64_t len : per_file[f].doc_lengths) {
      docs.push_back({uint32_t(f), begin, len});
      begin += len;
    }
    empty += per_file[f].empty_documents;
  }
  if (empty > 0) spdlog::warn("prepare: skipped {} documents with no tokens", empty);
  RF_INPUT_CHECK(!docs.empty(), "the inputs hold no tokenizable text");

  // Train/validation split by document: a seeded shuffle of document indices,
  // the first n_val go to validation.
  const size_t n = docs.size();
  size_t n_val = 0;
  if (o.validation_fraction > 0 && n >= 2)
    n_val = std::clamp<size_t>(size_t(std::llround(o.validation_fraction * double(n))), 1, n - 1);
  std::vector<uint8_t> is_val(n, 0);
  {
    std::vector<uint32_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = uint32_t(i);
    PhiloxStream rng(o.split_seed, subsequence_of(0x53504C4954ull /*"SPLIT"*/, n));
    for (size_t k = 0; k < n_val; ++k) {
      const size_t j = k + rng.next_below(uint32_t(n - k));
      std::swap(order[k], order[j]);
      is_val[order[k]] = 1;
    }
  }

  fs::create_directories(o.shard_dir);
  // The old manifest goes first: a half-rewritten directory is never "complete".
  fs::remove(fs::path(o.shard_dir) / kManifest);

  PrepareResult result;
  result.fingerprint = fingerprint;
  result.files = int64_t(files.size());
  result.documents = int64_t(n);
  for (const char* split_name : {"train", "validation"}) {
    const std::string split = split_name;
    const bool val = split == "validation";
    // Group this split's documents into shards of at most max_shard_tokens.
    std::vector<std::vector<size_t>> groups(1);
    uint64_t in_group = 0;
    for (size_t d = 0; d < n; ++d) {
      if (bool(is_val[d]) != val) continue;
      if (in_group > 0 && in_group + docs[d].length > uint64_t(o.max_shard_tokens)) {
        groups.emplace_back();
        in_group = 0;
      }
      groups.back().push_back(d);
      in_group += docs[d].length;
    }
    if (groups.back().empty()) groups.pop_back();
    for (size_t g = 0; g < groups.size(); ++g) {
      std::vector<uint32_t> tokens;
      std::vector<uint64_t> offsets{0};
      std::set<uint32_t> sources;
      for (size_t d : groups[g]) {
        const DocRef& ref = docs[d];
        const auto& src = per_file[ref.file].tokens;
        tokens.insert(tokens.end(), src.begin() + std::ptrdiff_t(ref.begin),
                      src.begin() + std::ptrdiff_t(ref.begin + ref.length));
        offsets.push_back(tokens.size());
        sources.insert(ref.file);
      }
      ShardInfo info;
      info.split = split;
      info.tokenizer = identity;
      for (uint32_t f : sources) info.sources.push_back(files[f]);
      info.fingerprint = fingerprint;
      info.created_by = "roformer prepare";
      info.shard_index = int64_t(g);
      info.num_shards = int64_t(groups.size());
      const std::string path = (fs::path(o.shard_dir) / shard_name(split, g)).string();
      write_shard(path, info, tokens, offsets);
      (val ? result.validation_shards : result.train_shards).push_back(path);
      (val ? result.validation_tokens : result.train_tokens) += int64_t(tokens.size());
      (val ? result.validation_documents : result.train_documents) += int64_t(groups[g].size());
    }
  }

  // Shards of an earlier run with more shards would be stale: remove them.
  const std::regex shard_re(R"((train|validation)-\d{5}\.h5)");
  std::set<std::string> written;
  for (auto& p : result.train_shards) written.insert(fs::path(p).filename().string());
  for (auto& p : result.validation_shards) written.insert(fs::path(p).filename().string());
  for (const auto& entry : fs::directory_iterator(o.shard_dir)) {
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, shard_re) && !written.count(name)) fs::remove(entry.path());
  }

  nlohmann::json m;
  m["format"] = kManifestFormat;
  m["fingerprint"] = fingerprint;
  m["tokenizer"] = identity.describe();
  m["pre_tokenizer"] = tokenizer.pre_tokenizer_identity();
  m["vocab"] = o.vocab;
  m["files"] = result.files;
  auto names = [](const std::vector<std::string>& paths) {
    std::vector<std::string> out;
    for (auto& p : paths) out.push_back(fs::path(p).filename().string());
    return out;
  };
  m["train"] = names(result.train_shards);
  m["validation"] = names(result.validation_shards);
  m["train_documents"] = result.train_documents;
  m["validation_documents"] = result.validation_documents;
  m["train_tokens"] = result.train_tokens;
  m["validation_tokens"] = result.validation_tokens;
  const fs::path manifest = fs::path(o.shard_dir) / kManifest;
  write_file_atomically(manifest, "shard manifest", m.dump(2) + "\n");

  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info(
      "prepare: {} files, {} documents -> train {} docs / {} tokens in {} shard(s), validation {} "
      "docs / {} tokens in {} shard(s), {:.1f} s",
      result.files, result.documents, result.train_documents, result.train_tokens,
      result.train_shards.size(), result.validation_documents, result.validation_tokens,
      result.validation_shards.size(), result.seconds);
  return result;
}

std::vector<std::string> list_shards(const std::string& shard_dir, const std::string& split) {
  RF_INPUT_CHECK(split == "train" || split == "validation",
                 "split must be train or validation, not '", split, "'");
  const fs::path manifest = fs::path(shard_dir) / kManifest;
  std::ifstream in(manifest);
  RF_INPUT_CHECK(in, "no ", kManifest, " in '", shard_dir,
                 "': run `roformer prepare --config FILE` first");
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw InputError(detail::concat(manifest.string(), " is not valid JSON: ", e.what()));
  }
  RF_INPUT_CHECK(m.value("format", "") == kManifestFormat, manifest.string(),
                 " is not a roformer corpus manifest");
  std::vector<std::string> out;
  for (const auto& name : m.at(split).get<std::vector<std::string>>())
    out.push_back((fs::path(shard_dir) / name).string());
  return out;
}

void tokenize_stream(std::istream& in, std::ostream& out, const Tokenizer& tokenizer,
                     const TokenizeStreamOptions& options) {
  std::string line;
  int64_t line_no = 0;
  std::vector<int32_t> ids;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (auto bad = find_invalid_utf8(line))
      throw InputError(
          detail::concat("stdin line ", line_no, ": invalid UTF-8 at byte ", *bad, " of the line"));
    if (options.add_special_tokens) {
      ids = tokenizer.encode(line).input_ids;
    } else {
      ids.clear();
      tokenizer.encode_ids(line, ids);
    }
    if (options.json) {
      nlohmann::json j;
      j["ids"] = ids;
      std::vector<std::string> tokens;
      for (int32_t id : ids) tokens.push_back(tokenizer.vocab().token(id));
      j["tokens"] = tokens;
      out << j.dump() << '\n';
    } else {
      for (size_t i = 0; i < ids.size(); ++i) out << (i ? " " : "") << ids[i];
      out << '\n';
    }
  }
}

}  // namespace roformer::data
