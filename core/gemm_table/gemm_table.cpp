#include "core/gemm_table/gemm_table.h"

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/file_write.h"

namespace roformer {

namespace {

using nlohmann::json;

constexpr const char* kFormat = "roformer gemm algorithms";
constexpr int kVersion = 1;

std::atomic<GemmAlgorithmChoice> g_choice{GemmAlgorithmChoice::kHeuristic};

std::mutex g_mutex;
// By GPU, then problem; ordered, so the JSON text is a function of the table.
auto* g_table = new std::map<std::string, std::map<GemmProblem, GemmAlgorithm>>();
std::atomic<uint64_t> g_generation{0};
std::atomic<uint64_t> g_resets{0};

std::string hex_of(const std::array<uint64_t, 8>& data) {
  std::string out;
  char word[17];
  for (uint64_t w : data) {
    std::snprintf(word, sizeof word, "%016" PRIx64, w);
    out += word;
  }
  return out;
}

json problem_json(const GemmProblem& p) {
  return json{{"m", p.m},
              {"n", p.n},
              {"k", p.k},
              {"batch", p.batch},
              {"lda", p.lda},
              {"ldb", p.ldb},
              {"ldc", p.ldc},
              {"stride_a", p.stride_a},
              {"stride_b", p.stride_b},
              {"stride_c", p.stride_c},
              {"trans_a", p.trans_a},
              {"trans_b", p.trans_b},
              {"accumulate", p.accumulate},
              {"epilogue", p.epilogue},
              {"input_dtype", p.input_dtype},
              {"output_dtype", p.output_dtype},
              {"bias_dtype", p.bias_dtype},
              {"compute", p.compute},
              {"align_a", p.align_a},
              {"align_b", p.align_b},
              {"align_c", p.align_c},
              {"align_bias", p.align_bias},
              {"align_aux", p.align_aux}};
}

// Reads a table's JSON, each error naming the source and the JSON path of
// the value at fault ("gpus[0].algorithms[3].problem.m").
class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& path, const std::string& why) const {
    throw InputError(detail::concat(source_, ": ", path.empty() ? "" : path + ": ", why));
  }

  const json& member(const json& object, const std::string& path, const char* key) const {
    if (!object.is_object()) fail(path, "expected an object");
    auto it = object.find(key);
    if (it == object.end()) fail(path, detail::concat("missing \"", key, "\""));
    return *it;
  }

  int64_t integer(const json& object, const std::string& path, const char* key,
                  int64_t minimum) const {
    const json& v = member(object, path, key);
    const std::string where = path + "." + key;
    if (!v.is_number_integer()) fail(where, "expected an integer");
    const int64_t x = v.get<int64_t>();
    if (x < minimum) fail(where, detail::concat("expected an integer >= ", minimum, ", got ", x));
    return x;
  }

  bool boolean(const json& object, const std::string& path, const char* key) const {
    const json& v = member(object, path, key);
    if (!v.is_boolean()) fail(path + "." + key, "expected true or false");
    return v.get<bool>();
  }

  double number(const json& object, const std::string& path, const char* key) const {
    const json& v = member(object, path, key);
    if (!v.is_number() || v.get<double>() < 0) fail(path + "." + key, "expected a number >= 0");
    return v.get<double>();
  }

  std::string text(const json& object, const std::string& path, const char* key,
                   std::initializer_list<const char*> allowed) const {
    const json& v = member(object, path, key);
    const std::string where = path + "." + key;
    if (!v.is_string()) fail(where, "expected a string");
    const std::string s = v.get<std::string>();
    if (allowed.size() == 0) return s;
    std::string names;
    for (const char* a : allowed) {
      if (s == a) return s;
      names += names.empty() ? "" : ", ";
      names += detail::concat("\"", a, "\"");
    }
    fail(where, detail::concat("expected one of ", names, ", got \"", s, "\""));
  }

  GemmProblem problem(const json& object, const std::string& path) const {
    GemmProblem p;
    p.m = integer(object, path, "m", 1);
    p.n = integer(object, path, "n", 1);
    p.k = integer(object, path, "k", 0);
    p.batch = integer(object, path, "batch", 1);
    p.lda = integer(object, path, "lda", 1);
    p.ldb = integer(object, path, "ldb", 1);
    p.ldc = integer(object, path, "ldc", 1);
    p.stride_a = integer(object, path, "stride_a", 0);
    p.stride_b = integer(object, path, "stride_b", 0);
    p.stride_c = integer(object, path, "stride_c", 0);
    p.trans_a = boolean(object, path, "trans_a");
    p.trans_b = boolean(object, path, "trans_b");
    p.accumulate = boolean(object, path, "accumulate");
    p.epilogue = text(object, path, "epilogue",
                      {"none", "bias", "gelu_aux", "dgelu_bias_grad", "row_sums_of_a"});
    p.input_dtype = text(object, path, "input_dtype", {"f32", "bf16"});
    p.output_dtype = text(object, path, "output_dtype", {"f32", "bf16"});
    p.bias_dtype = text(object, path, "bias_dtype", {"", "f32", "bf16"});
    p.compute = text(object, path, "compute", {"f32", "tf32"});
    p.align_a = alignment(object, path, "align_a");
    p.align_b = alignment(object, path, "align_b");
    p.align_c = alignment(object, path, "align_c");
    p.align_bias = alignment(object, path, "align_bias");
    p.align_aux = alignment(object, path, "align_aux");
    return p;
  }

  int64_t alignment(const json& object, const std::string& path, const char* key) const {
    const int64_t a = integer(object, path, key, 1);
    if (a > 256 || (a & (a - 1)) != 0)
      fail(path + "." + key, detail::concat("expected a power of two up to 256, got ", a));
    return a;
  }

  std::array<uint64_t, 8> algorithm_data(const json& object, const std::string& path) const {
    const std::string hex = text(object, path, "algorithm", {});
    const std::string where = path + ".algorithm";
    if (hex.size() != 128 || hex.find_first_not_of("0123456789abcdef") != std::string::npos)
      fail(where, detail::concat("expected 128 lower-case hex digits (cuBLASLt's 64-byte "
                                 "algorithm), got ",
                                 hex.size(), " characters"));
    std::array<uint64_t, 8> data{};
    for (size_t i = 0; i < data.size(); ++i)
      data[i] = std::stoull(hex.substr(16 * i, 16), nullptr, 16);
    return data;
  }

 private:
  std::string source_;
};

}  // namespace

int64_t gemm_size_bucket(int64_t x) {
  if (x <= 16) return x;
  int64_t top = 1;
  while (top <= x / 2) top *= 2;  // the largest power of two <= x
  const int64_t step = top / 8;
  return (x + step - 1) / step * step;
}

void set_gemm_algorithm_choice(GemmAlgorithmChoice choice) {
  g_choice = choice;
}

GemmAlgorithmChoice gemm_algorithm_choice() {
  return g_choice;
}

std::optional<GemmAlgorithm> find_gemm_algorithm(const std::string& gpu,
                                                 const GemmProblem& problem) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto by_gpu = g_table->find(gpu);
  if (by_gpu == g_table->end()) return std::nullopt;
  auto it = by_gpu->second.find(problem);
  if (it == by_gpu->second.end()) return std::nullopt;
  return it->second;
}

GemmAlgorithm add_gemm_algorithm(const std::string& gpu, const GemmProblem& problem,
                                 const GemmAlgorithm& algorithm) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const auto [it, added] = (*g_table)[gpu].try_emplace(problem, algorithm);
  if (added) ++g_generation;
  return it->second;
}

size_t gemm_table_size() {
  std::lock_guard<std::mutex> lock(g_mutex);
  size_t n = 0;
  for (const auto& [gpu, problems] : *g_table) n += problems.size();
  return n;
}

uint64_t gemm_table_generation() {
  return g_generation;
}

uint64_t gemm_table_resets() {
  return g_resets;
}

void clear_gemm_table() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_table->clear();
  ++g_generation;
  ++g_resets;
}

std::string gemm_table_json() {
  json gpus = json::array();
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (const auto& [gpu, problems] : *g_table) {
      json algorithms = json::array();
      for (const auto& [problem, algorithm] : problems)
        algorithms.push_back(json{{"problem", problem_json(problem)},
                                  {"algorithm", hex_of(algorithm.data)},
                                  {"timed", algorithm.timed},
                                  {"ms", algorithm.ms},
                                  {"heuristic_ms", algorithm.heuristic_ms}});
      gpus.push_back(json{{"gpu", gpu}, {"algorithms", std::move(algorithms)}});
    }
  }
  const json root{{"format", kFormat}, {"version", kVersion}, {"gpus", std::move(gpus)}};
  return root.dump(1) + "\n";
}

void load_gemm_table_json(std::string_view text, const std::string& source) {
  const Reader r(source);
  json root;
  try {
    root = json::parse(text);
  } catch (const json::parse_error& e) {
    r.fail("", detail::concat("not JSON: ", e.what()));
  }
  if (r.text(root, "", "format", {}) != kFormat)
    r.fail("format", detail::concat("expected \"", kFormat, "\""));
  const int64_t version = r.integer(root, "", "version", 1);
  if (version != kVersion)
    r.fail("version",
           detail::concat("version ", version, " is not one this build reads (", kVersion, ")"));
  const json& gpus = r.member(root, "", "gpus");
  if (!gpus.is_array()) r.fail("gpus", "expected a list");
  // Read everything first: a bad entry leaves the table as it was.
  std::vector<std::tuple<std::string, GemmProblem, GemmAlgorithm>> entries;
  for (size_t g = 0; g < gpus.size(); ++g) {
    const std::string gpu_path = detail::concat("gpus[", g, "]");
    const std::string gpu = r.text(gpus[g], gpu_path, "gpu", {});
    const json& algorithms = r.member(gpus[g], gpu_path, "algorithms");
    if (!algorithms.is_array()) r.fail(gpu_path + ".algorithms", "expected a list");
    for (size_t i = 0; i < algorithms.size(); ++i) {
      const std::string path = detail::concat(gpu_path, ".algorithms[", i, "]");
      const json& entry = algorithms[i];
      GemmAlgorithm a;
      a.data = r.algorithm_data(entry, path);
      a.timed = r.boolean(entry, path, "timed");
      a.ms = r.number(entry, path, "ms");
      a.heuristic_ms = r.number(entry, path, "heuristic_ms");
      entries.emplace_back(gpu, r.problem(r.member(entry, path, "problem"), path + ".problem"), a);
    }
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  for (const auto& [gpu, problem, algorithm] : entries) (*g_table)[gpu][problem] = algorithm;
  ++g_generation;
  ++g_resets;
}

void save_gemm_table(const std::filesystem::path& path) {
  const std::string text = gemm_table_json();
  write_file_atomically(path, "GEMM algorithm table", [&](std::ostream& out) { out << text; });
}

void load_gemm_table(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  RF_INPUT_CHECK(in, "cannot open GEMM algorithm table '", path.string(), "'");
  std::ostringstream text;
  text << in.rdbuf();
  RF_INPUT_CHECK(!in.bad(), "cannot read GEMM algorithm table '", path.string(), "'");
  load_gemm_table_json(text.str(), path.string());
}

}  // namespace roformer
