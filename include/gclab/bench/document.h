// A report as data: a JSON value (what `--json` prints) with comments for people attached by JSON Pointer
// (what the YAML print shows beside or above a key). gclab's reports (check, estimate, bench, fit) are
// built as Documents and printed either way from the same value; nothing is written as text and parsed
// back.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gclab/config/yaml_json.h"

namespace gclab::bench {

using config::yaml_value;

class Document {
 public:
  nlohmann::ordered_json value = nlohmann::ordered_json::object();

  // A comment at the end of the line of the key or list item at `pointer` ("/estimate/weights",
  // "/bench/0"), or on lines of its own above it.
  void note(const std::string& pointer, std::string text) { notes_[pointer] = std::move(text); }
  void heading(const std::string& pointer, std::string text) { headings_[pointer] = std::move(text); }
  // Lines printed before the document (a table for people), as comments.
  void preamble(const std::string& text) { preamble_ += text; }
  // Another document's keys, comments and preamble after this one's.
  void append(const Document& other);

  // YAML: block mappings, lists of scalars and objects of scalars on one line (flow style), strings in
  // double quotes, the comments. Parses (yaml-cpp) to `value`.
  std::string yaml() const;
  std::string json() const { return value.dump(2) + "\n"; }

 private:
  void emit(std::string& out, const nlohmann::ordered_json& v, const std::string& pointer, int indent) const;
  std::string trailing(const std::string& pointer) const;
  std::string above(const std::string& pointer, int indent) const;
  bool commented_inside(const std::string& pointer) const;  // a comment on something under `pointer`

  std::map<std::string, std::string> notes_, headings_;
  std::string preamble_;
};

}  // namespace gclab::bench
