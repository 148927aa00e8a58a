#include "gclab/bench/document.h"

#include <cstdlib>
#include <sstream>

#include <yaml-cpp/yaml.h>

namespace gclab::bench {

namespace {

using ojson = nlohmann::ordered_json;

bool scalar(const ojson& v) { return !v.is_object() && !v.is_array(); }

std::string flow(const ojson& v);

// A scalar, an object of scalars, or a short list of scalars: printed on one line (a long list, e.g. of
// sentences, one item a line).
bool flat(const ojson& v) {
  if (scalar(v)) return true;
  for (const auto& item : v) {
    if (!scalar(item)) return false;
  }
  return v.is_object() || flow(v).size() <= 100;
}

// JSON Pointer's escaping of a key ("~" -> "~0", "/" -> "~1").
std::string pointer_key(const std::string& key) {
  std::string out;
  for (char c : key) out += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
  return out;
}

// A key as a plain YAML scalar where that reads back as the same text, else double-quoted.
std::string yaml_key(const std::string& key) {
  bool plain = !key.empty() && key.find_first_of(",[]{}#&*!|>'\"%@`: ") == std::string::npos && key.front() != '-' &&
               key.front() != '?';
  for (const char* word : {"true", "false", "null", "yes", "no", "on", "off", "~"})
    if (key == word) plain = false;
  return plain ? key : ojson(key).dump();
}

// A scalar, or an object / list of scalars in flow style. Strings in JSON's double quotes, which YAML reads
// the same way.
std::string flow(const ojson& v) {
  if (v.is_object()) {
    std::string out = "{";
    for (auto it = v.begin(); it != v.end(); ++it)
      out += (it == v.begin() ? "" : ", ") + yaml_key(it.key()) + ": " + flow(it.value());
    return out + "}";
  }
  if (v.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + flow(v[i]);
    return out + "]";
  }
  return v.dump();
}

}  // namespace

void Document::append(const Document& other) {
  for (auto it = other.value.begin(); it != other.value.end(); ++it) value[it.key()] = it.value();
  notes_.insert(other.notes_.begin(), other.notes_.end());
  headings_.insert(other.headings_.begin(), other.headings_.end());
  preamble_ += other.preamble_;
}

std::string Document::trailing(const std::string& pointer) const {
  const auto it = notes_.find(pointer);
  return it == notes_.end() ? "" : "  # " + it->second;
}

std::string Document::above(const std::string& pointer, int indent) const {
  const auto it = headings_.find(pointer);
  if (it == headings_.end()) return "";
  std::string out;
  std::istringstream in(it->second);
  for (std::string line; std::getline(in, line);)
    out += std::string(static_cast<size_t>(indent), ' ') + "# " + line + "\n";
  return out;
}

bool Document::commented_inside(const std::string& pointer) const {
  const std::string prefix = pointer + "/";
  for (const auto* m : {&notes_, &headings_}) {
    const auto it = m->lower_bound(prefix);
    if (it != m->end() && it->first.compare(0, prefix.size(), prefix) == 0) return true;
  }
  return false;
}

void Document::emit(std::string& out, const nlohmann::ordered_json& v, const std::string& pointer, int indent) const {
  const std::string pad(static_cast<size_t>(indent), ' ');
  if (v.is_object()) {
    for (auto it = v.begin(); it != v.end(); ++it) {
      const std::string p = pointer + "/" + pointer_key(it.key());
      out += above(p, indent) + pad + yaml_key(it.key()) + ":";
      if (flat(it.value()) && !commented_inside(p)) {
        out += " " + flow(it.value()) + trailing(p) + "\n";
      } else {
        out += trailing(p) + "\n";
        emit(out, it.value(), p, indent + 2);
      }
    }
  } else {
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string p = pointer + "/" + std::to_string(i);
      out += above(p, indent);
      if (flat(v[i]) && !commented_inside(p)) {
        out += pad + "- " + flow(v[i]) + trailing(p) + "\n";
        continue;
      }
      std::string item;
      emit(item, v[i], p, indent + 2);
      const std::string inner(static_cast<size_t>(indent + 2), ' ');
      if (v[i].is_object() && trailing(p).empty() && item.compare(0, inner.size() + 1, inner + "#") != 0 &&
          item.compare(0, inner.size(), inner) == 0)
        out += pad + "- " + item.substr(inner.size());  // "- key: ..." and the rest under it
      else
        out += pad + "-" + trailing(p) + "\n" + item;
    }
  }
}

std::string Document::yaml() const {
  std::string out;
  std::istringstream in(preamble_);
  for (std::string line; std::getline(in, line);) out += "# " + line + "\n";
  emit(out, value, "", 0);
  return out;
}

}  // namespace gclab::bench
