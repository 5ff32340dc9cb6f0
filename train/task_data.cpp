#include "train/task_data.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/file_checks.h"

namespace roformer {

namespace {

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t tab = line.find('\t', start);
    out.push_back(line.substr(start, tab == std::string::npos ? std::string::npos : tab - start));
    if (tab == std::string::npos) break;
    start = tab + 1;
  }
  return out;
}

bool blank(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isspace(c); });
}

// Labels may be written as strings, integers or booleans in JSON lines.
std::string label_text(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_integer() || v.is_boolean()) return v.dump();
  return "";
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + ("\"" + s + "\"");
  return out;
}

}  // namespace

TaskFile read_task_file(const std::string& path, const FinetuneConfig& spec, LabelUse label) {
  reject_directory(path, "task file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open task file");
  TaskFile out;
  out.path = path;
  const bool want_label = label == LabelUse::kRequired;
  std::string line;
  int64_t n = 0;
  std::vector<int> columns;  // TSV: column of each text field, then the label
  while (std::getline(in, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const std::string at = detail::concat(path, ":", n, ": ");
    if (spec.format == TaskFormat::kTsv && n == 1) {
      const std::vector<std::string> header = split_tabs(line);
      std::vector<std::string> needed = spec.text_fields;
      if (want_label) needed.push_back(spec.label_field);
      for (const auto& f : needed) {
        auto it = std::find(header.begin(), header.end(), f);
        if (it == header.end())
          throw InputError(at + "the header row has no column \"" + f +
                           "\" (columns: " + join(header) + ")");
        columns.push_back(int(it - header.begin()));
      }
      continue;
    }
    if (blank(line)) throw InputError(at + "empty line (remove it; every line is one example)");
    TaskExample ex;
    ex.line = n;
    if (spec.format == TaskFormat::kTsv) {
      const std::vector<std::string> cells = split_tabs(line);
      for (size_t i = 0; i < columns.size(); ++i) {
        const int c = columns[i];
        const std::string& field =
            i < spec.text_fields.size() ? spec.text_fields[i] : spec.label_field;
        if (c >= int(cells.size()))
          throw InputError(detail::concat(at, "missing field \"", field, "\" (", cells.size(),
                                          " tab-separated columns, it is column ", c + 1, ")"));
        if (i < spec.text_fields.size())
          ex.texts.push_back(cells[size_t(c)]);
        else
          ex.label = cells[size_t(c)];
      }
    } else {
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        throw InputError(at + "not valid JSON: " + e.what());
      }
      if (!j.is_object()) throw InputError(at + "expected a JSON object");
      for (const auto& f : spec.text_fields) {
        if (!j.contains(f)) throw InputError(at + "missing field \"" + f + "\"");
        if (!j[f].is_string()) throw InputError(at + "field \"" + f + "\" is not a string");
        ex.texts.push_back(j[f].get<std::string>());
      }
      if (want_label) {
        if (!j.contains(spec.label_field))
          throw InputError(at + "missing label field \"" + spec.label_field + "\"");
        ex.label = label_text(j[spec.label_field]);
        if (ex.label.empty())
          throw InputError(at + "label field \"" + spec.label_field +
                           "\" must be a non-empty string, integer or boolean");
      }
    }
    if (want_label && ex.label.empty())
      throw InputError(at + "empty label in field \"" + spec.label_field + "\"");
    out.examples.push_back(std::move(ex));
  }
  if (out.examples.empty()) throw InputError(path + ": no examples");
  return out;
}

std::vector<std::string> resolve_labels(const FinetuneConfig& spec, const TaskFile& train) {
  std::vector<std::string> labels = spec.labels;
  if (labels.empty()) {
    if (spec.task == FinetuneTask::kTriplet) {
      labels = {"B", "C"};
    } else {
      std::set<std::string> seen;
      for (const auto& ex : train.examples) seen.insert(ex.label);
      labels.assign(seen.begin(), seen.end());
    }
  }
  if (spec.task == FinetuneTask::kTriplet && labels.size() != 2)
    throw InputError(detail::concat(
        "finetune.labels: a triplet task has exactly 2 labels (positive closer, negative "
        "closer), got ",
        labels.size()));
  if (labels.size() < 2)
    throw InputError(detail::concat(train.path, ": only ", labels.size(), " distinct label(s) (",
                                    join(labels), "); classification needs at least 2"));
  return labels;
}

EncodedTask encode_task(const TaskFile& file, const data::Tokenizer& tokenizer,
                        const FinetuneConfig& spec, const std::vector<std::string>& labels) {
  EncodedTask out;
  out.path = file.path;
  const int64_t max_len = spec.max_seq_len;
  for (const TaskExample& ex : file.examples) {
    EncodedExample e;
    e.line = ex.line;
    if (!ex.label.empty()) {
      auto it = std::find(labels.begin(), labels.end(), ex.label);
      if (it == labels.end())
        throw InputError(detail::concat(file.path, ":", ex.line, ": unknown label \"", ex.label,
                                        "\" (the model knows ", join(labels), ")"));
      e.label = int32_t(it - labels.begin());
    }
    std::vector<std::pair<std::string_view, std::optional<std::string_view>>> inputs;
    if (ex.texts.size() == 1) inputs.push_back({ex.texts[0], std::nullopt});
    if (ex.texts.size() == 2) inputs.push_back({ex.texts[0], ex.texts[1]});
    if (ex.texts.size() == 3) {
      inputs.push_back({ex.texts[0], ex.texts[1]});
      inputs.push_back({ex.texts[0], ex.texts[2]});
    }
    bool cut = false;
    for (const auto& [a, b] : inputs) {
      data::Encoding enc = tokenizer.encode(a, b, 0);
      if (int64_t(enc.input_ids.size()) > max_len) {
        if (spec.truncation == Truncation::kError)
          throw InputError(detail::concat(file.path, ":", ex.line, ": ", enc.input_ids.size(),
                                          " tokens, more than finetune.max_seq_len (", max_len,
                                          "); raise it or set finetune.truncation: truncate"));
        enc = tokenizer.encode(a, b, max_len);
        cut = true;
      }
      e.parts.push_back(std::move(enc));
    }
    out.truncated += cut;
    out.examples.push_back(std::move(e));
  }
  return out;
}

}  // namespace roformer
