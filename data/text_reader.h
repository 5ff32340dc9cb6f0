// Documents from input files: plain text (documents separated by one or more
// blank lines; a file without blank lines is one document) or JSON lines (one
// document per line, its text in a named field). Invalid UTF-8 is an error
// naming the file, line and byte offset, or is replaced by U+FFFD.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace roformer::data {

enum class InputFormat { text, jsonl };
enum class InvalidUtf8 { error, replace };

InputFormat parse_input_format(std::string_view name);  // "text" | "jsonl"
InvalidUtf8 parse_invalid_utf8(std::string_view name);  // "error" | "replace"

struct TextReadOptions {
  InputFormat format = InputFormat::text;
  std::string jsonl_field = "text";
  InvalidUtf8 invalid_utf8 = InvalidUtf8::error;
};

// Calls on_document(text, first_line) for every document of `path` in order
// (lines of one text document are joined with '\n'). Returns the number of
// documents. Throws InputError for a missing or unreadable file, a file with no
// document, invalid UTF-8 (in error mode), bad JSON or a missing field.
int64_t read_documents(const std::string& path, const TextReadOptions& options,
                       const std::function<void(std::string_view text, int64_t line)>& on_document);

// Expands paths and glob patterns (sorted per pattern, duplicates removed, in
// the order given). A path that does not exist or a pattern that matches no
// file is an InputError.
std::vector<std::string> expand_inputs(const std::vector<std::string>& patterns);

}  // namespace roformer::data
