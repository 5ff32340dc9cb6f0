#include "train/config.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <system_error>
#include <variant>

#include "core/error.h"
#include "core/file_checks.h"
#include "core/file_write.h"
#include "train/config_schema.h"
#include "train/config_stages.h"

namespace roformer {

// ---------------------------------------------------------------------------
// Enum names as they appear in YAML.

template <>
std::span<const EnumEntry<Precision>> enum_entries<Precision>() {
  static constexpr EnumEntry<Precision> kEntries[] = {{"f32", Precision::kF32},
                                                      {"bf16", Precision::kBf16}};
  return kEntries;
}
template <>
std::span<const EnumEntry<GemmAlgorithmChoice>> enum_entries<GemmAlgorithmChoice>() {
  static constexpr EnumEntry<GemmAlgorithmChoice> kEntries[] = {
      {"heuristic", GemmAlgorithmChoice::kHeuristic}, {"timed", GemmAlgorithmChoice::kTimed}};
  return kEntries;
}
template <>
std::span<const EnumEntry<data::InputFormat>> enum_entries<data::InputFormat>() {
  static constexpr EnumEntry<data::InputFormat> kEntries[] = {{"text", data::InputFormat::text},
                                                              {"jsonl", data::InputFormat::jsonl}};
  return kEntries;
}
template <>
std::span<const EnumEntry<data::PreTokenizer>> enum_entries<data::PreTokenizer>() {
  static constexpr EnumEntry<data::PreTokenizer> kEntries[] = {
      {"none", data::PreTokenizer::none}, {"jieba", data::PreTokenizer::jieba}};
  return kEntries;
}
template <>
std::span<const EnumEntry<data::InvalidUtf8>> enum_entries<data::InvalidUtf8>() {
  static constexpr EnumEntry<data::InvalidUtf8> kEntries[] = {
      {"error", data::InvalidUtf8::error}, {"replace", data::InvalidUtf8::replace}};
  return kEntries;
}
template <>
std::span<const EnumEntry<optim::DecayKind>> enum_entries<optim::DecayKind>() {
  static constexpr EnumEntry<optim::DecayKind> kEntries[] = {
      {"linear", optim::DecayKind::linear},
      {"cosine", optim::DecayKind::cosine},
      {"constant", optim::DecayKind::constant},
      {"wsd", optim::DecayKind::wsd}};
  return kEntries;
}
template <>
std::span<const EnumEntry<optim::DecayShape>> enum_entries<optim::DecayShape>() {
  static constexpr EnumEntry<optim::DecayShape> kEntries[] = {
      {"linear", optim::DecayShape::linear},
      {"cosine", optim::DecayShape::cosine},
      {"1-sqrt", optim::DecayShape::one_minus_sqrt}};
  return kEntries;
}
template <>
std::span<const EnumEntry<ProgressMode>> enum_entries<ProgressMode>() {
  static constexpr EnumEntry<ProgressMode> kEntries[] = {{"auto", ProgressMode::kAuto},
                                                         {"always", ProgressMode::kAlways},
                                                         {"never", ProgressMode::kNever}};
  return kEntries;
}
template <>
std::span<const EnumEntry<FinetuneTask>> enum_entries<FinetuneTask>() {
  static constexpr EnumEntry<FinetuneTask> kEntries[] = {
      {"classification", FinetuneTask::kClassification},
      {"pair", FinetuneTask::kPair},
      {"triplet", FinetuneTask::kTriplet}};
  return kEntries;
}
template <>
std::span<const EnumEntry<TaskFormat>> enum_entries<TaskFormat>() {
  static constexpr EnumEntry<TaskFormat> kEntries[] = {{"jsonl", TaskFormat::kJsonl},
                                                       {"tsv", TaskFormat::kTsv}};
  return kEntries;
}
template <>
std::span<const EnumEntry<Truncation>> enum_entries<Truncation>() {
  static constexpr EnumEntry<Truncation> kEntries[] = {{"error", Truncation::kError},
                                                       {"truncate", Truncation::kTruncate}};
  return kEntries;
}

namespace config_schema {

namespace {
std::string format_bound(double v) {
  return fmt::format("{}", v);
}
}  // namespace

std::string describe(const Range& r, bool integer) {
  const std::string noun = integer ? "integer" : "number";
  const bool has_lo = std::isfinite(r.lo), has_hi = std::isfinite(r.hi);
  if (!has_lo && !has_hi) return (integer ? "an " : "a ") + noun;
  if (has_lo && !has_hi && r.lo == 0.0)
    return (r.lo_open ? "a positive " : "a non-negative ") + noun;
  if (has_lo && !has_hi)
    return fmt::format("{} {} {} {}", integer ? "an" : "a", noun,
                       r.lo_open ? ">" : ">=", format_bound(r.lo));
  if (!has_lo)
    return fmt::format("{} {} {} {}", integer ? "an" : "a", noun,
                       r.hi_open ? "<" : "<=", format_bound(r.hi));
  return fmt::format("{} {} in {}{}, {}{}", integer ? "an" : "a", noun, r.lo_open ? '(' : '[',
                     format_bound(r.lo), format_bound(r.hi), r.hi_open ? ')' : ']');
}

std::vector<std::string_view> section_keys(std::string_view section) {
  KeyLister lister;
  if (section == "run") {
    RunConfig c;
    visit_run(lister, c);
  } else if (section == "model") {
    ModelConfig c;
    visit_model(lister, c);
  } else if (section == "data") {
    DataConfig c;
    visit_data(lister, c);
  } else if (section == "optim") {
    OptimConfig c;
    visit_optim(lister, c);
  } else if (section == "stages") {
    StageConfig c;
    visit_stage(lister, c);
  } else if (section == "checkpoint") {
    CheckpointConfig c;
    visit_checkpoint(lister, c);
  } else if (section == "log") {
    LogConfig c;
    visit_log(lister, c);
  } else if (section == "distributed") {
    DistributedConfig c;
    visit_distributed(lister, c);
  } else if (section == "finetune") {
    FinetuneConfig c;
    visit_finetune(lister, c);
  }
  return lister.keys;
}

}  // namespace config_schema

namespace {

using namespace config_schema;

// ---------------------------------------------------------------------------
// Key suggestions.

// Optimal string alignment distance: Levenshtein plus adjacent swaps, so
// "modle" is one edit from "model".
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

// The closest candidate when it is close enough to be a plausible typo.
std::optional<std::string_view> nearest(std::string_view word,
                                        const std::vector<std::string_view>& candidates) {
  std::string lower(word);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  const size_t limit = lower.size() <= 4 ? 1 : lower.size() <= 8 ? 2 : 3;
  std::optional<std::string_view> best;
  size_t best_distance = limit + 1;
  for (auto candidate : candidates) {
    const size_t d = edit_distance(lower, candidate);
    if (d < best_distance) {
      best = candidate;
      best_distance = d;
    }
  }
  return best;
}

std::string join(const std::vector<std::string_view>& words) {
  std::string out;
  for (auto w : words) {
    if (!out.empty()) out += ", ";
    out += w;
  }
  return out;
}

std::string parent_path(const std::string& path) {
  const size_t cut = path.find_last_of(".[");
  return cut == std::string::npos ? std::string() : path.substr(0, cut);
}

std::string child_path(const std::string& parent, std::string_view key) {
  return parent.empty() ? std::string(key) : parent + "." + std::string(key);
}

// `inner` is `outer` or lies below it ("stages[0].steps" is under "stages").
bool is_under(const std::string& inner, const std::string& outer) {
  if (inner.size() < outer.size() || inner.compare(0, outer.size(), outer) != 0) return false;
  return inner.size() == outer.size() || inner[outer.size()] == '.' || inner[outer.size()] == '[';
}

// ---------------------------------------------------------------------------
// Where values came from, so every message can name a file position or the
// command-line override that set it.

class Context {
 public:
  explicit Context(std::string source) : source_(std::move(source)) {}

  const std::string& source() const { return source_; }
  void record(const std::string& path, const YAML::Mark& mark) { marks_[path] = mark; }
  void own(const std::string& path, const std::string& override_text) {
    owned_.emplace_back(path, override_text);
  }
  // Set by the file or an override, as opposed to left at its default.
  bool set_by_user(const std::string& path) const {
    return marks_.count(path) > 0 || override_for(path) != nullptr;
  }
  bool set_by_override(const std::string& path) const { return override_for(path) != nullptr; }

  // "file:line:col" or "command-line override 'k=v'" for a key path; `hint`
  // is a more precise position (e.g. of a key rather than its value).
  std::string where(const std::string& path, const YAML::Mark* hint = nullptr) const {
    if (const std::string* text = override_for(path))
      return fmt::format("command-line override '{}'", *text);
    if (hint) return position(*hint);
    for (std::string p = path;; p = parent_path(p)) {
      if (auto it = marks_.find(p); it != marks_.end()) return position(it->second);
      if (p.empty()) return fmt::format("{}:1:1", source_);
    }
  }

  [[noreturn]] void fail(const std::string& path, const std::string& message,
                         const YAML::Mark* hint = nullptr) const {
    if (path.empty()) throw InputError(fmt::format("{}: {}", where(path, hint), message));
    throw InputError(fmt::format("{}: {}: {}", where(path, hint), path, message));
  }

 private:
  std::string position(const YAML::Mark& m) const {
    return fmt::format("{}:{}:{}", source_, m.line + 1, m.column + 1);
  }
  // The override owning the deepest path that contains `path`.
  const std::string* override_for(const std::string& path) const {
    const std::string* best = nullptr;
    size_t best_len = 0;
    for (const auto& [owned, text] : owned_) {
      if (is_under(path, owned) && (best == nullptr || owned.size() >= best_len)) {
        best = &text;
        best_len = owned.size();
      }
    }
    return best;
  }

  std::string source_;
  std::map<std::string, YAML::Mark> marks_;
  std::vector<std::pair<std::string, std::string>> owned_;
};

// ---------------------------------------------------------------------------
// Scalars.

std::string describe_node(const YAML::Node& n, bool quote) {
  switch (n.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return "null";
    case YAML::NodeType::Sequence:
      return n.size() == 0 ? "an empty list" : "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Scalar:
      break;
  }
  return quote ? fmt::format("\"{}\"", n.Scalar()) : n.Scalar();
}

template <class Int>
std::optional<Int> parse_integer(std::string_view text) {
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  Int value{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

std::optional<double> parse_number(std::string_view text) {
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  double value = 0.0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty() ||
      !std::isfinite(value))
    return std::nullopt;
  return value;
}

std::optional<bool> parse_bool(std::string_view text) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  if (lower == "true" || lower == "yes" || lower == "on") return true;
  if (lower == "false" || lower == "no" || lower == "off") return false;
  return std::nullopt;
}

// Shortest text that reads back to the same double, always with a decimal
// point or exponent so it reads as a number to a human too.
std::string format_number(double v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

// ---------------------------------------------------------------------------
// Reading: a visitor over one YAML mapping.

class MapReader {
 public:
  struct Entry {
    std::string key;
    YAML::Node key_node;
    YAML::Node value;
  };

  // `node` may be null or undefined (section absent: every key defaulted).
  MapReader(Context& ctx, const YAML::Node& node, std::string path)
      : ctx_(ctx), path_(std::move(path)) {
    if (!node.IsDefined() || node.IsNull()) return;
    if (!node.IsMap())
      ctx_.fail(path_,
                fmt::format("expected a mapping of keys, got {}", describe_node(node, true)));
    std::map<std::string, int> first_line;
    for (auto it = node.begin(); it != node.end(); ++it) {
      // A copy: yaml-cpp's iterator returns a temporary pair, so a reference
      // to it->first dangles (found by fuzz/fuzz_config under ASan).
      const YAML::Node key_node = it->first;
      const YAML::Mark key_mark = key_node.Mark();
      if (!key_node.IsScalar())
        ctx_.fail(path_, "expected a key name, got " + describe_node(key_node, false), &key_mark);
      const std::string key = key_node.Scalar();
      auto [pos, inserted] = first_line.emplace(key, key_mark.line + 1);
      if (!inserted)
        ctx_.fail(child_path(path_, key),
                  fmt::format("duplicate key (first set at line {})", pos->second), &key_mark);
      entries_.push_back(Entry{key, key_node, it->second});
    }
  }

  const std::string& path() const { return path_; }
  const Entry* find(std::string_view key) const {
    for (const auto& e : entries_)
      if (e.key == key) return &e;
    return nullptr;
  }
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // Every key must be one of `known`; otherwise suggest the nearest one.
  void check_keys(const std::vector<std::string_view>& known) const {
    for (const auto& e : entries_) {
      if (std::find(known.begin(), known.end(), e.key) != known.end()) continue;
      const YAML::Mark key_mark = e.key_node.Mark();
      ctx_.fail(child_path(path_, e.key), "unknown key" + suggestion(e.key, known), &key_mark);
    }
  }

  template <class T>
  void field(std::string_view key, T& out, Opt opt = {}) {
    const std::string path = child_path(path_, key);
    const Entry* e = find(key);
    if (e == nullptr) {
      if (opt.required) ctx_.fail(path, "required key is missing");
      return;
    }
    // A null value has no position of its own; point at its key.
    ctx_.record(path, e->value.IsNull() ? e->key_node.Mark() : e->value.Mark());
    read(path, e->value, out, opt);
  }

 private:
  std::string suggestion(const std::string& key, const std::vector<std::string_view>& known) const {
    if (auto best = nearest(key, known)) return fmt::format(", did you mean '{}'?", *best);
    // Otherwise a key that belongs to another section is the likeliest slip.
    if (path_.find('[') == std::string::npos) {
      for (auto section : kSections) {
        if (section == path_ || section == "stages") continue;
        const auto keys = section_keys(section);
        if (std::find(keys.begin(), keys.end(), key) != keys.end())
          return fmt::format(", did you mean '{}.{}'?", section, key);
      }
    }
    if (path_.empty()) return fmt::format(" (known sections: {})", join(known));
    return fmt::format(" (known keys in {}: {})", path_, join(known));
  }

  [[noreturn]] void expected(const std::string& path, const YAML::Node& n,
                             const std::string& what) const {
    ctx_.fail(path, fmt::format("expected {}, got {}", what, describe_node(n, true)));
  }

  void read(const std::string& path, const YAML::Node& n, int64_t& out, const Opt& opt) const {
    const std::string what = describe(opt.range, true);
    if (!n.IsScalar()) expected(path, n, what);
    auto v = parse_integer<int64_t>(n.Scalar());
    if (!v) expected(path, n, what);
    if (!opt.range.contains(static_cast<double>(*v)))
      ctx_.fail(path, fmt::format("expected {}, got {}", what, *v));
    // Every count is bounded so sums and products of them (total steps,
    // tokens per batch) cannot overflow 64 bits.
    if (*v > kMaxInteger || *v < -kMaxInteger)
      ctx_.fail(path,
                fmt::format("expected {} of magnitude at most {}, got {}", what, kMaxInteger, *v));
    out = *v;
  }
  void read(const std::string& path, const YAML::Node& n, uint64_t& out, const Opt&) const {
    if (!n.IsScalar()) expected(path, n, "a non-negative integer");
    auto v = parse_integer<uint64_t>(n.Scalar());
    if (!v) expected(path, n, "a non-negative integer");
    out = *v;
  }
  void read(const std::string& path, const YAML::Node& n, double& out, const Opt& opt) const {
    const std::string what = describe(opt.range, false);
    if (!n.IsScalar()) expected(path, n, what);
    auto v = parse_number(n.Scalar());
    if (!v) expected(path, n, what);
    if (!opt.range.contains(*v)) ctx_.fail(path, fmt::format("expected {}, got {}", what, *v));
    out = *v;
  }
  void read(const std::string& path, const YAML::Node& n, bool& out, const Opt&) const {
    std::optional<bool> v;
    if (n.IsScalar()) v = parse_bool(n.Scalar());
    if (!v) expected(path, n, "true or false");
    out = *v;
  }
  void read(const std::string& path, const YAML::Node& n, std::string& out, const Opt& opt) const {
    if (n.IsNull() && opt.nullable) {
      out.clear();
      return;
    }
    if (!n.IsScalar()) expected(path, n, opt.nullable ? "a string or null" : "a non-empty string");
    if (n.Scalar().empty() && !opt.nullable) expected(path, n, "a non-empty string");
    out = checked_utf8(path, n);
  }
  // yaml-cpp passes invalid UTF-8 through, but writes it back as U+FFFD: the
  // config saved with a run would name another file than the one used.
  const std::string& checked_utf8(const std::string& path, const YAML::Node& n) const {
    const std::string& s = n.Scalar();
    for (size_t i = 0; i < s.size();) {
      const auto c = static_cast<unsigned char>(s[i]);
      const size_t len = c < 0x80           ? 1
                         : (c >> 5) == 0x6  ? 2
                         : (c >> 4) == 0xe  ? 3
                         : (c >> 3) == 0x1e ? 4
                                            : 0;
      bool ok = len > 0 && i + len <= s.size() && !(len == 2 && c < 0xc2);
      for (size_t k = 1; ok && k < len; ++k)
        ok = (static_cast<unsigned char>(s[i + k]) >> 6) == 0x2;
      if (!ok)
        ctx_.fail(path, fmt::format("not valid UTF-8 (byte {} of the value)", i + 1), nullptr);
      i += len;
    }
    return s;
  }
  template <class T>
  void read(const std::string& path, const YAML::Node& n, std::optional<T>& out,
            const Opt& opt) const {
    if (n.IsNull()) {
      out.reset();
      return;
    }
    T value{};
    read(path, n, value, opt);
    out = value;
  }
  void read(const std::string& path, const YAML::Node& n, std::vector<std::string>& out,
            const Opt&) const {
    out.clear();
    if (n.IsNull()) return;
    if (n.IsScalar()) {  // a single entry may be written without brackets
      out.push_back(checked_utf8(path, n));
      return;
    }
    if (!n.IsSequence()) expected(path, n, "a list of strings");
    for (size_t i = 0; i < n.size(); ++i) {
      const std::string item = fmt::format("{}[{}]", path, i);
      ctx_.record(item, n[i].Mark());
      if (!n[i].IsScalar() || n[i].Scalar().empty()) expected(item, n[i], "a non-empty string");
      out.push_back(checked_utf8(item, n[i]));
    }
  }
  void read(const std::string& path, const YAML::Node& n, std::array<double, 2>& out,
            const Opt& opt) const {
    // "a number in [0, 1)" -> "a list of two numbers in [0, 1)"
    const std::string what = "a list of two numbers" + describe(opt.range, false).substr(8);
    if (!n.IsSequence() || n.size() != 2) expected(path, n, what);
    for (size_t i = 0; i < 2; ++i) {
      const std::string item = fmt::format("{}[{}]", path, i);
      ctx_.record(item, n[i].Mark());
      read(item, n[i], out[i], opt);
    }
  }
  // "cpu", "cuda" (= cuda:0) or "cuda:N": parse_device's grammar (core/tensor.cpp),
  // read here so the config library does not link the tensor core.
  void read(const std::string& path, const YAML::Node& n, Device& out, const Opt&) const {
    const std::string what = "one of [cpu, cuda, cuda:N]";
    if (!n.IsScalar()) expected(path, n, what);
    const std::string& text = n.Scalar();
    if (text == "cpu" || text == "cuda") {
      out = text == "cpu" ? Device::cpu() : Device::cuda(0);
      return;
    }
    const std::string index = text.rfind("cuda:", 0) == 0 ? text.substr(5) : std::string();
    if (!index.empty() && index.size() <= 4 &&
        std::all_of(index.begin(), index.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      out = Device::cuda(std::stoi(index));
      return;
    }
    std::string hint;
    const std::vector<std::string_view> names = {"cpu", "cuda"};
    if (auto best = nearest(text, names)) hint = fmt::format(" (did you mean '{}'?)", *best);
    ctx_.fail(path, fmt::format("expected {}, got \"{}\"{}", what, text, hint));
  }
  template <class E>
  requires std::is_enum_v<E>
  void read(const std::string& path, const YAML::Node& n, E& out, const Opt&) const {
    const std::string what = fmt::format("one of [{}]", enum_choices<E>());
    if (!n.IsScalar()) expected(path, n, what);
    auto v = enum_from_name<E>(n.Scalar());
    if (!v) {
      std::vector<std::string_view> names;
      for (const auto& entry : enum_entries<E>()) names.push_back(entry.name);
      std::string hint;
      if (auto best = nearest(n.Scalar(), names))
        hint = fmt::format(" (did you mean '{}'?)", *best);
      ctx_.fail(path, fmt::format("expected {}, got \"{}\"{}", what, n.Scalar(), hint));
    }
    out = *v;
  }

  Context& ctx_;
  std::string path_;
  std::vector<Entry> entries_;
};

template <class S, class Visit>
void read_section(Context& ctx, const MapReader& top, std::string_view name, S& out, Visit visit) {
  const MapReader::Entry* e = top.find(name);
  if (e == nullptr) return;
  const std::string path(name);
  ctx.record(path, e->value.IsNull() ? e->key_node.Mark() : e->value.Mark());
  MapReader reader(ctx, e->value, path);
  reader.check_keys(section_keys(name));
  visit(reader, out);
}

// ---------------------------------------------------------------------------
// Overrides: "a.b.c=value" edits the YAML tree before it is read, so
// overridden values go through exactly the checks file values do.

struct Override {
  std::string text;
  std::vector<std::variant<std::string, size_t>> parts;  // key or list index
  YAML::Node value;
};

[[noreturn]] void override_error(const std::string& text, const std::string& message) {
  throw InputError(fmt::format("command-line override '{}': {}", text, message));
}

Override parse_override(const std::string& text) {
  auto fail = [&](const std::string& message) { override_error(text, message); };
  Override o{text, {}, {}};
  const size_t eq = text.find('=');
  if (eq == std::string::npos) fail("expected KEY=VALUE, e.g. optim.lr=3e-4");
  const std::string key = text.substr(0, eq);
  if (key.empty()) fail("expected KEY=VALUE, the key is empty");
  size_t start = 0;
  while (true) {
    const size_t dot = key.find('.', start);
    const std::string part = key.substr(start, dot == std::string::npos ? dot : dot - start);
    if (part.empty()) fail(fmt::format("'{}' has an empty key between dots", key));
    const bool valid = std::all_of(part.begin(), part.end(), [](unsigned char ch) {
      return std::isalnum(ch) || ch == '_' || ch == '-';
    });
    if (!valid) fail(fmt::format("'{}' is not a key name", part));
    if (std::all_of(part.begin(), part.end(), [](unsigned char ch) { return std::isdigit(ch); })) {
      if (o.parts.empty()) fail(fmt::format("'{}' must start with a section name", key));
      o.parts.emplace_back(static_cast<size_t>(std::stoull(part)));
    } else {
      o.parts.emplace_back(part);
    }
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  try {
    o.value = YAML::Load(text.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    fail("the value is not valid YAML: " + e.msg);
  }
  return o;
}

void apply_override(YAML::Node& root, const Override& o, Context& ctx) {
  auto fail = [&](const std::string& message) { override_error(o.text, message); };
  if (root.IsNull() || !root.IsDefined()) root.reset(YAML::Node(YAML::NodeType::Map));
  if (!root.IsMap()) fail("the config file is not a mapping of sections");

  YAML::Node cur;
  cur.reset(root);
  std::string path;
  std::string created;  // first node this override adds, which it then owns
  for (size_t i = 0; i < o.parts.size(); ++i) {
    const bool last = i + 1 == o.parts.size();
    if (const auto* key = std::get_if<std::string>(&o.parts[i])) {
      const std::string here = child_path(path, *key);
      if (!cur.IsMap() && !cur.IsNull()) fail(fmt::format("{} is a value, not a section", path));
      bool exists = false;
      for (auto it = cur.begin(); cur.IsMap() && it != cur.end(); ++it)
        if (it->first.IsScalar() && it->first.Scalar() == *key) exists = true;
      if (last) {
        cur[*key] = o.value;
      } else {
        const bool next_is_index = std::holds_alternative<size_t>(o.parts[i + 1]);
        if (!exists && next_is_index)
          fail(fmt::format("{} has no entry {}: it is not in the config", here,
                           std::get<size_t>(o.parts[i + 1])));
        if (!exists) cur[*key] = YAML::Node(YAML::NodeType::Map);
        YAML::Node next = cur[*key];
        cur.reset(next);
      }
      if (!exists && created.empty()) created = here;
      path = here;
    } else {
      const size_t index = std::get<size_t>(o.parts[i]);
      if (!cur.IsSequence()) fail(fmt::format("{} is not a list", path));
      if (index >= cur.size())
        fail(fmt::format("{} has {} entr{}, so there is no index {}", path, cur.size(),
                         cur.size() == 1 ? "y" : "ies", index));
      path = fmt::format("{}[{}]", path, index);
      if (last) {
        cur[index] = o.value;
      } else {
        YAML::Node next = cur[index];
        cur.reset(next);
      }
    }
  }
  ctx.own(path, o.text);
  if (!created.empty()) ctx.own(created, o.text);
}

// ---------------------------------------------------------------------------
// Cross-key validation (single-key ranges are checked while reading).

[[noreturn]] void fail_issue(const Context& ctx, const std::string& section,
                             const ConfigIssue& issue) {
  // Blame the key the user touched: an override first, then a file key.
  std::string path = child_path(section, issue.keys.front());
  bool found = false;
  for (const auto& key : issue.keys) {
    if (ctx.set_by_override(child_path(section, key))) {
      path = child_path(section, key);
      found = true;
      break;
    }
  }
  for (size_t i = 0; !found && i < issue.keys.size(); ++i) {
    if (ctx.set_by_user(child_path(section, issue.keys[i]))) {
      path = child_path(section, issue.keys[i]);
      found = true;
    }
  }
  ctx.fail(path, issue.message);
}

void validate(const Context& ctx, const Config& c) {
  if (auto problem = find_model_config_issue(c.model, "model.")) fail_issue(ctx, "model", *problem);

  if (c.data.mask_token_prob + c.data.random_token_prob > 1.0 + 1e-12)
    fail_issue(ctx, "data",
               {{"random_token_prob", "mask_token_prob"},
                fmt::format("data.mask_token_prob + data.random_token_prob must be at most 1, "
                            "got {} + {}",
                            c.data.mask_token_prob, c.data.random_token_prob)});

  if (c.optim.decay_tokens && c.optim.schedule != optim::DecayKind::wsd)
    fail_issue(ctx, "optim",
               {{"decay_tokens", "schedule"},
                fmt::format("only used by schedule: wsd (optim.schedule is {})",
                            optim::decay_kind_name(c.optim.schedule))});
  if (c.optim.decay_tokens && !c.stages.empty()) {
    const std::optional<int64_t> decay = steps_of_last_tokens(c, *c.optim.decay_tokens);
    if (!decay || *decay > c.total_steps() - c.optim.warmup_steps)
      fail_issue(ctx, "optim",
                 {{"decay_tokens"},
                  fmt::format("{} tokens of decay are more than the run holds after its warm-up",
                              *c.optim.decay_tokens)});
  }
  if (c.model.attention_kernel == AttentionKernel::kCudnnSdpa &&
      c.model.attention == AttentionKind::kSoftmax) {
    const char* why = c.run.device.is_cpu() ? "runs on CUDA only (run.device)"
                      : c.run.precision != Precision::kBf16
                          ? "takes bf16 operands: set run.precision: bf16"
                      : uses_token_stream(c.data, c.model, c.run)
                          ? "takes padded batches only: set data.unpadded: false (token streams "
                            "run on the other kernels)"
                          : nullptr;
    if (why) fail_issue(ctx, "model", {{"attention_kernel"}, fmt::format("cudnn_sdpa {}", why)});
  }
  if (c.run.gemm_algorithms == GemmAlgorithmChoice::kTimed && c.run.device.is_cpu())
    fail_issue(ctx, "run",
               {{"gemm_algorithms", "device"},
                "timed chooses among cuBLASLt's algorithms and needs "
                "run.device: cuda (the CPU's products have no such choice)"});
  if (c.data.packing) {
    const char* why = !c.data.unpadded ? "needs data.unpadded: true (packed rows are token streams)"
                      : c.model.attention != AttentionKind::kSoftmax
                          ? "needs model.attention: softmax"
                      : !c.run.device.is_cpu() ? "runs on the CPU only so far (run.device)"
                                               : nullptr;
    if (why) fail_issue(ctx, "data", {{"packing"}, fmt::format("data.packing: {}", why)});
  }

  const bool absolute = c.model.position == PositionEncoding::kAbsolute;
  for (size_t i = 0; i < c.stages.size(); ++i) {
    const StageConfig& s = c.stages[i];
    const std::string section = fmt::format("stages[{}]", i);
    if (absolute && s.max_seq_len > c.model.max_position_embeddings)
      fail_issue(ctx, section,
                 {{"max_seq_len"},
                  fmt::format("{} exceeds model.max_position_embeddings ({}), the length of the "
                              "learned position table used by model.position: absolute",
                              s.max_seq_len, c.model.max_position_embeddings)});
  }

  if (c.finetune) {
    const FinetuneConfig& f = *c.finetune;
    const size_t needed = f.task == FinetuneTask::kClassification ? 1
                          : f.task == FinetuneTask::kPair         ? 2
                                                                  : 3;
    if (f.text_fields.size() != needed)
      fail_issue(ctx, "finetune",
                 {{"text_fields", "task"},
                  fmt::format("task {} needs {} text field{}, got {}", enum_name(f.task), needed,
                              needed == 1 ? "" : "s", f.text_fields.size())});
    std::set<std::string> seen;
    for (const auto& label : f.labels)
      if (!seen.insert(label).second)
        fail_issue(ctx, "finetune",
                   {{"labels"}, fmt::format("label \"{}\" is listed twice", label)});
    if (absolute && f.max_seq_len > c.model.max_position_embeddings)
      fail_issue(ctx, "finetune",
                 {{"max_seq_len"},
                  fmt::format("{} exceeds model.max_position_embeddings ({}), the length of the "
                              "learned position table used by model.position: absolute",
                              f.max_seq_len, c.model.max_position_embeddings)});
  }
}

std::vector<std::string> default_text_fields(FinetuneTask task) {
  switch (task) {
    case FinetuneTask::kClassification:
      return {"text"};
    case FinetuneTask::kPair:
      return {"text_a", "text_b"};
    case FinetuneTask::kTriplet:
      return {"anchor", "positive", "negative"};
  }
  return {};
}

Config read_config(Context& ctx, const YAML::Node& root) {
  ctx.record("", root.Mark());
  if (root.IsDefined() && !root.IsNull() && !root.IsMap())
    ctx.fail("", fmt::format("expected a mapping of sections ({}), got {}",
                             join({std::begin(kSections), std::end(kSections)}),
                             describe_node(root, true)));
  MapReader top(ctx, root, "");
  top.check_keys({std::begin(kSections), std::end(kSections)});

  Config c;
  c.source = ctx.source();
  read_section(ctx, top, "run", c.run, [&](MapReader& r, RunConfig& run) {
    visit_run(r, run);
    if (!r.has("dir")) run.dir = "runs/" + run.name;
  });
  read_section(ctx, top, "model", c.model,
               [](MapReader& r, ModelConfig& model) { visit_model(r, model); });
  read_section(ctx, top, "data", c.data, [](MapReader& r, DataConfig& d) { visit_data(r, d); });
  read_section(ctx, top, "optim", c.optim, [](MapReader& r, OptimConfig& o) { visit_optim(r, o); });

  const MapReader::Entry* finetune = top.find("finetune");
  const bool has_finetune = finetune != nullptr && !finetune->value.IsNull();
  if (const MapReader::Entry* e = top.find("stages")) {
    const YAML::Node& list = e->value;
    ctx.record("stages", list.IsNull() ? e->key_node.Mark() : list.Mark());
    // A finetune config may have no stages: to_yaml writes them as [].
    if (!list.IsSequence() || (list.size() == 0 && !has_finetune))
      ctx.fail("stages", fmt::format("expected a non-empty list of stages, got {}",
                                     describe_node(list, true)));
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string path = fmt::format("stages[{}]", i);
      ctx.record(path, list[i].Mark());
      MapReader reader(ctx, list[i], path);
      if (list[i].IsNull()) ctx.fail(path, "expected a mapping of keys, got null");
      reader.check_keys(section_keys("stages"));
      StageConfig stage;
      visit_stage(reader, stage);
      if (auto issue = derive_stage(stage, c.optim)) fail_issue(ctx, path, *issue);
      c.stages.push_back(stage);
    }
  } else if (!has_finetune) {
    ctx.fail("stages",
             "required key is missing (a pretraining config needs a list of "
             "{max_seq_len, batch_size, steps} stages)");
  }

  read_section(ctx, top, "checkpoint", c.checkpoint,
               [](MapReader& r, CheckpointConfig& k) { visit_checkpoint(r, k); });
  read_section(ctx, top, "log", c.log, [](MapReader& r, LogConfig& l) { visit_log(r, l); });
  read_section(ctx, top, "distributed", c.distributed,
               [](MapReader& r, DistributedConfig& d) { visit_distributed(r, d); });
  if (has_finetune) {
    FinetuneConfig f;
    read_section(ctx, top, "finetune", f, [](MapReader& r, FinetuneConfig& ft) {
      visit_finetune(r, ft);
      if (!r.has("text_fields")) ft.text_fields = default_text_fields(ft.task);
    });
    c.finetune = std::move(f);
  }

  validate(ctx, c);
  return c;
}

// ---------------------------------------------------------------------------
// Writing.

class Writer {
 public:
  explicit Writer(YAML::Emitter& out) : out_(out) {}

  void field(std::string_view key, int64_t v, Opt = {}) { emit_key(key) << v; }
  void field(std::string_view key, uint64_t v, Opt = {}) { emit_key(key) << v; }
  void field(std::string_view key, double v, Opt = {}) { emit_key(key) << format_number(v); }
  void field(std::string_view key, bool v, Opt = {}) { emit_key(key) << v; }
  void field(std::string_view key, const std::string& v, Opt opt = {}) {
    if (v.empty() && opt.nullable)
      emit_key(key) << YAML::Null;
    else
      emit_key(key) << v;
  }
  template <class T>
  void field(std::string_view key, const std::optional<T>& v, Opt opt = {}) {
    if (v)
      field(key, *v, opt);
    else if (!opt.omit_if_unset)
      emit_key(key) << YAML::Null;
  }
  void field(std::string_view key, const std::vector<std::string>& v, Opt = {}) {
    emit_key(key) << YAML::Flow << YAML::BeginSeq;
    for (const auto& s : v) out_ << s;
    out_ << YAML::EndSeq;
  }
  void field(std::string_view key, const std::array<double, 2>& v, Opt = {}) {
    emit_key(key) << YAML::Flow << YAML::BeginSeq << format_number(v[0]) << format_number(v[1])
                  << YAML::EndSeq;
  }
  template <class E>
  requires std::is_enum_v<E>
  void field(std::string_view key, E v, Opt = {}) { emit_key(key) << std::string(enum_name(v)); }
  // cuda:0 is written "cuda", as configs usually say.
  void field(std::string_view key, Device v, Opt = {}) {
    emit_key(key) << (v == Device::cuda(0) ? std::string("cuda") : v.str());
  }

 private:
  YAML::Emitter& emit_key(std::string_view key) {
    return out_ << YAML::Key << std::string(key) << YAML::Value;
  }
  YAML::Emitter& out_;
};

template <class S, class Visit>
void write_section(YAML::Emitter& out, std::string_view name, const S& section, Visit visit) {
  Writer w(out);
  out << YAML::Key << std::string(name) << YAML::Value << YAML::BeginMap;
  visit(w, section);
  out << YAML::EndMap;
}

}  // namespace

// ---------------------------------------------------------------------------
// Public API.

int64_t Config::total_steps() const {
  int64_t total = 0;
  for (const auto& s : stages)
    if (__builtin_add_overflow(total, s.steps, &total))
      throw InputError("stages: the total step count overflows 64 bits");
  return total;
}

bool Config::operator==(const Config& o) const {
  return run == o.run && model == o.model && data == o.data && optim == o.optim &&
         stages == o.stages && checkpoint == o.checkpoint && log == o.log &&
         distributed == o.distributed && finetune == o.finetune;
}

Config parse_config_string(std::string_view yaml, std::string source_name,
                           const std::vector<std::string>& overrides) {
  Context ctx(std::move(source_name));
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::ParserException& e) {
    throw InputError(fmt::format("{}:{}:{}: YAML syntax error: {}", ctx.source(), e.mark.line + 1,
                                 e.mark.column + 1, e.msg));
  }
  for (const auto& text : overrides) apply_override(root, parse_override(text), ctx);
  try {
    return read_config(ctx, root);
  } catch (const YAML::Exception& e) {
    // yaml-cpp only throws here on malformed trees; keep the position.
    throw InputError(
        fmt::format("{}:{}:{}: {}", ctx.source(), e.mark.line + 1, e.mark.column + 1, e.msg));
  }
}

Config load_config(const std::filesystem::path& path, const std::vector<std::string>& overrides) {
  reject_directory(path, "config file");
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw InputError(
        fmt::format("cannot read config file '{}': {}", path.string(), std::strerror(errno)));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw InputError(fmt::format("cannot read config file '{}'", path.string()));
  return parse_config_string(text.str(), path.string(), overrides);
}

std::string to_yaml(const Config& c) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  write_section(out, "run", c.run, [](Writer& w, const RunConfig& s) { visit_run(w, s); });
  write_section(out, "model", c.model, [](Writer& w, const ModelConfig& s) { visit_model(w, s); });
  write_section(out, "data", c.data, [](Writer& w, const DataConfig& s) { visit_data(w, s); });
  write_section(out, "optim", c.optim, [](Writer& w, const OptimConfig& s) { visit_optim(w, s); });
  out << YAML::Key << "stages" << YAML::Value << YAML::BeginSeq;
  for (const auto& stage : c.stages) {
    Writer w(out);
    out << YAML::Flow << YAML::BeginMap;
    visit_stage(w, stage);
    out << YAML::EndMap;
  }
  out << YAML::EndSeq;
  write_section(out, "checkpoint", c.checkpoint,
                [](Writer& w, const CheckpointConfig& s) { visit_checkpoint(w, s); });
  write_section(out, "log", c.log, [](Writer& w, const LogConfig& s) { visit_log(w, s); });
  write_section(out, "distributed", c.distributed,
                [](Writer& w, const DistributedConfig& s) { visit_distributed(w, s); });
  if (c.finetune)
    write_section(out, "finetune", *c.finetune,
                  [](Writer& w, const FinetuneConfig& s) { visit_finetune(w, s); });
  out << YAML::EndMap;
  RF_CHECK(out.good(), "to_yaml: YAML emitter failed: ", out.GetLastError());
  return std::string("# roformer config, resolved: every key with its value or default\n") +
         out.c_str() + "\n";
}

void save_config(const Config& config, const std::filesystem::path& path) {
  write_file_atomically(path, "config file", to_yaml(config));
}

void require_for(const Config& c, ConfigUse use) {
  const std::string source = c.source.empty() ? "config" : c.source;
  const char* command = use == ConfigUse::kPrepare    ? "prepare"
                        : use == ConfigUse::kPretrain ? "pretrain"
                                                      : "finetune";
  auto missing = [&](const char* key, const char* how) {
    throw InputError(
        fmt::format("{}: {}: required by '{}' but not set ({})", source, key, command, how));
  };
  if (use == ConfigUse::kPrepare || use == ConfigUse::kPretrain) {
    if (c.data.vocab.empty())
      missing("data.vocab", "the path of a vocab.txt, e.g. data.vocab=PATH");
  }
  if (use == ConfigUse::kPrepare && c.data.inputs.empty())
    missing("data.inputs", "a list of text files or globs");
  if (use == ConfigUse::kPretrain && c.stages.empty())
    missing("stages", "a list of {max_seq_len, batch_size, steps} stages");
  if (use == ConfigUse::kFinetune && !c.finetune)
    missing("finetune", "a finetune section with at least task and train_file");
}

}  // namespace roformer
