#include "data/text_reader.h"

#include <glob.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"
#include "data/utf8.h"

namespace roformer::data {
namespace {

std::string read_file(const std::string& path) {
  std::error_code ec;
  RF_INPUT_CHECK(std::filesystem::exists(path, ec), "input file '", path, "' does not exist");
  RF_INPUT_CHECK(!std::filesystem::is_directory(path, ec), "input '", path,
                 "' is a directory (give files or a glob such as dir/*.txt)");
  std::ifstream in(path, std::ios::binary);
  RF_INPUT_CHECK(in, "input file '", path, "' cannot be opened");
  std::ostringstream buf;
  buf << in.rdbuf();
  RF_INPUT_CHECK(!in.bad(), "reading input file '", path, "' failed");
  return std::move(buf).str();
}

int64_t line_of(std::string_view content, size_t offset) {
  return 1 + std::count(content.begin(), content.begin() + std::ptrdiff_t(offset), '\n');
}

bool is_blank(std::string_view line) {
  return line.find_first_not_of(" \t\r\f\v") == std::string_view::npos;
}

}  // namespace

InputFormat parse_input_format(std::string_view name) {
  if (name == "text") return InputFormat::text;
  if (name == "jsonl") return InputFormat::jsonl;
  throw InputError(detail::concat("input_format must be 'text' or 'jsonl', not '", name, "'"));
}

InvalidUtf8 parse_invalid_utf8(std::string_view name) {
  if (name == "error") return InvalidUtf8::error;
  if (name == "replace") return InvalidUtf8::replace;
  throw InputError(detail::concat("invalid_utf8 must be 'error' or 'replace', not '", name, "'"));
}

int64_t read_documents(const std::string& path, const TextReadOptions& options,
                       const std::function<void(std::string_view, int64_t)>& on_document) {
  std::string content = read_file(path);
  RF_INPUT_CHECK(!content.empty(), "input file '", path, "' is empty");
  if (auto bad = find_invalid_utf8(content)) {
    if (options.invalid_utf8 == InvalidUtf8::error) {
      const size_t newline = *bad == 0 ? std::string::npos : content.rfind('\n', *bad - 1);
      const size_t column = *bad - (newline == std::string::npos ? 0 : newline + 1) + 1;
      throw InputError(detail::concat(
          path, ":", line_of(content, *bad), ": invalid UTF-8 at byte offset ", *bad, " (column ",
          column, ", byte 0x", std::hex, unsigned(static_cast<unsigned char>(content[*bad])),
          std::dec, "); fix the file or set invalid_utf8: replace"));
    }
    spdlog::warn("{}:{}: invalid UTF-8 at byte offset {}; replacing invalid bytes with U+FFFD",
                 path, line_of(content, *bad), *bad);
    content = replace_invalid_utf8(content);
  }

  int64_t documents = 0;
  int64_t line_no = 0;
  size_t pos = 0;
  if (options.format == InputFormat::text) {
    std::string doc;
    int64_t doc_line = 0;
    auto flush = [&] {
      if (!doc.empty()) {
        on_document(doc, doc_line);
        ++documents;
        doc.clear();
      }
    };
    while (pos < content.size()) {
      size_t end = content.find('\n', pos);
      if (end == std::string::npos) end = content.size();
      std::string_view line(content.data() + pos, end - pos);
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (is_blank(line)) {
        flush();
      } else {
        if (doc.empty())
          doc_line = line_no;
        else
          doc.push_back('\n');
        doc.append(line);
      }
      pos = end + 1;
    }
    flush();
  } else {
    while (pos < content.size()) {
      size_t end = content.find('\n', pos);
      if (end == std::string::npos) end = content.size();
      std::string_view line(content.data() + pos, end - pos);
      ++line_no;
      pos = end + 1;
      if (is_blank(line)) continue;
      nlohmann::json record;
      try {
        record = nlohmann::json::parse(line);
      } catch (const nlohmann::json::parse_error& e) {
        throw InputError(detail::concat(path, ":", line_no, ": invalid JSON: ", e.what()));
      }
      RF_INPUT_CHECK(record.is_object(), path, ":", line_no, ": expected a JSON object per line");
      auto it = record.find(options.jsonl_field);
      RF_INPUT_CHECK(it != record.end(), path, ":", line_no, ": no field '", options.jsonl_field,
                     "' in this JSON line (set jsonl_field to the field holding the text)");
      RF_INPUT_CHECK(it->is_string(), path, ":", line_no, ": field '", options.jsonl_field,
                     "' is not a string");
      const auto& text = it->get_ref<const std::string&>();
      if (is_blank(text)) continue;
      on_document(text, line_no);
      ++documents;
    }
  }
  RF_INPUT_CHECK(documents > 0, "input file '", path, "' holds no document (only blank lines",
                 options.format == InputFormat::jsonl ? " or empty texts" : "", ")");
  return documents;
}

std::vector<std::string> expand_inputs(const std::vector<std::string>& patterns) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const auto& pattern : patterns) {
    std::vector<std::string> matches;
    if (pattern.find_first_of("*?[") == std::string::npos) {
      std::error_code ec;
      RF_INPUT_CHECK(std::filesystem::exists(pattern, ec), "input '", pattern, "' does not exist");
      matches.push_back(pattern);
    } else {
      glob_t g{};
      const int rc = glob(pattern.c_str(), 0, nullptr, &g);
      for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i) matches.emplace_back(g.gl_pathv[i]);
      globfree(&g);
      RF_INPUT_CHECK(rc == 0 || rc == GLOB_NOMATCH, "cannot expand input pattern '", pattern, "'");
      RF_INPUT_CHECK(!matches.empty(), "input pattern '", pattern, "' matches no file");
      std::sort(matches.begin(), matches.end());
    }
    for (auto& m : matches)
      if (seen.insert(m).second) out.push_back(std::move(m));
  }
  RF_INPUT_CHECK(!out.empty(), "no input files given");
  return out;
}

}  // namespace roformer::data
