// Tokenizer throughput in MB/s of UTF-8 input on the State of the Union
// speeches (scripts/fetch_data.sh), single-threaded and with all cores.
// With --jieba: RoFormer's Chinese tokenizer (jieba words, then WordPiece) on
// the Chinese corpus (scripts/fetch_data_zh.sh), and jieba's segmentation alone.
// Usage: tokenizer_bench [--jieba] [VOCAB] [FILES...]
//   defaults: .data/vocab/bert-base-uncased-vocab.txt .data/text/sotu/*.txt
//   --jieba:  .data/vocab/zh-jieba-16k.txt .data/text/zh/*.txt
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <tuple>

#include "core/error.h"
#include "data/text_reader.h"
#include "data/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

// Process CPU time in seconds (all threads): on a shared machine MB per
// CPU-second is steadier than wall-clock MB/s.
double cpu_seconds() {
  return double(std::clock()) / CLOCKS_PER_SEC;
}

// Tokenizes `docs` on `threads` threads (documents handed out in turn);
// returns wall seconds, CPU seconds and the number of ids.
std::tuple<double, double, int64_t> run(const roformer::data::Tokenizer& tok,
                                        const std::vector<std::string>& docs, int threads) {
  std::atomic<size_t> next{0};
  std::atomic<int64_t> ids{0};
  const auto t0 = Clock::now();
  const double c0 = cpu_seconds();
  auto work = [&] {
    std::vector<int32_t> out;
    int64_t n = 0;
    for (size_t i; (i = next++) < docs.size();) {
      out.clear();
      tok.encode_ids(docs[i], out);
      n += int64_t(out.size());
    }
    ids += n;
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
  return {std::chrono::duration<double>(Clock::now() - t0).count(), cpu_seconds() - c0, ids.load()};
}

}  // namespace

int main(int argc, char** argv) try {
  roformer::data::TokenizerOptions options;
  std::string vocab = ".data/vocab/bert-base-uncased-vocab.txt";
  std::vector<std::string> patterns{".data/text/sotu/*.txt"};
  if (argc > 1 && std::string(argv[1]) == "--jieba") {
    options.pre_tokenizer = roformer::data::PreTokenizer::jieba;
    vocab = ".data/vocab/zh-jieba-16k.txt";
    patterns = {".data/text/zh/*.txt"};
    --argc;
    ++argv;
  }
  if (argc > 1) vocab = argv[1];
  if (argc > 2) patterns.assign(argv + 2, argv + argc);
  const auto files = roformer::data::expand_inputs(patterns);
  std::vector<std::string> docs;
  size_t bytes = 0;
  for (const auto& f : files)
    roformer::data::read_documents(f, {}, [&](std::string_view text, int64_t) {
      docs.emplace_back(text);
      bytes += text.size();
    });
  const roformer::data::Tokenizer tok(vocab, options);
  const double mb = double(bytes) / 1e6;
  std::printf("tokenizer_bench: %zu files, %zu documents, %.1f MB, vocab %s\n", files.size(),
              docs.size(), mb, vocab.c_str());
  run(tok, docs, 1);  // warm-up (page cache, allocations)
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  for (int threads : {1, cores}) {
    double best = 1e30, best_cpu = 1e30;
    int64_t ids = 0;
    for (int rep = 0; rep < 5; ++rep) {
      auto [secs, cpu, n] = run(tok, docs, threads);
      best = std::min(best, secs);
      best_cpu = std::min(best_cpu, cpu);
      ids = n;
    }
    std::printf(
        "  %2d thread(s): %8.2f MB/s  %10.0f tokens/s  (best of 5: %.3f s; %.2f MB per "
        "CPU-second)\n",
        threads, mb / best, double(ids) / best, best, mb / best_cpu);
    if (cores == 1) break;
  }
  if (const auto* jieba = tok.jieba()) {
    std::vector<std::string_view> words;
    double best = 1e30, best_cpu = 1e30;
    int64_t n = 0;
    for (int rep = 0; rep < 5; ++rep) {
      const auto t0 = Clock::now();
      const double c0 = cpu_seconds();
      n = 0;
      for (const auto& d : docs) {
        words.clear();
        jieba->cut(d, words);
        n += int64_t(words.size());
      }
      best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
      best_cpu = std::min(best_cpu, cpu_seconds() - c0);
    }
    std::printf(
        "  jieba cut alone, 1 thread: %8.2f MB/s  %10.0f words/s  (%.2f MB per CPU-second)\n",
        mb / best, double(n) / best, mb / best_cpu);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "tokenizer_bench: %s\n(run scripts/fetch_data.sh first)\n", e.what());
  return 1;
}
