#include "gclab/config/yaml_json.h"

#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <set>

#include "gclab/config/config.h"

namespace gclab::config {

using ojson = nlohmann::ordered_json;

ojson yaml_value(const YAML::Node& node) {
  if (node.IsNull()) return nullptr;
  if (node.IsMap()) {
    ojson j = ojson::object();
    for (const auto& kv : node) j[kv.first.Scalar()] = yaml_value(kv.second);
    return j;
  }
  if (node.IsSequence()) {
    ojson j = ojson::array();
    for (const auto& item : node) j.push_back(yaml_value(item));
    return j;
  }
  const std::string& s = node.Scalar();
  if (node.Tag() == "!") return s;  // quoted in the YAML: text, whatever it looks like
  // PyYAML's YAML 1.1 booleans (resolver.py, tag:yaml.org,2002:bool).
  static const std::set<std::string> yes = {"yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"};
  static const std::set<std::string> no = {"no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"};
  if (yes.count(s)) return true;
  if (no.count(s)) return false;
  char* end = nullptr;
  const long long i = std::strtoll(s.c_str(), &end, 10);
  if (!s.empty() && *end == '\0') return i;
  const double d = std::strtod(s.c_str(), &end);
  if (!s.empty() && *end == '\0') return d;
  return s;
}

std::string python_json(const ojson& value) {
  if (value.is_object()) {
    std::string out = "{";
    bool first = true;
    for (auto it = value.begin(); it != value.end(); ++it, first = false)
      out += (first ? "" : ", ") + ojson(it.key()).dump(-1, ' ', true) + ": " + python_json(it.value());
    return out + "}";
  }
  if (value.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < value.size(); ++i) out += (i ? ", " : "") + python_json(value[i]);
    return out + "]";
  }
  if (value.is_boolean()) return value.get<bool>() ? "true" : "false";
  return value.dump(-1, ' ', true);
}

std::vector<std::pair<std::string, std::string>> meta_entries(const ProcessConfig& config) {
  std::vector<std::pair<std::string, std::string>> out;
  if (config.meta_yaml.empty()) return out;
  const ojson meta = yaml_value(YAML::Load(config.meta_yaml));
  if (!meta.is_object()) return out;
  for (auto it = meta.begin(); it != meta.end(); ++it)
    out.emplace_back(it.key(), it.value().is_string() ? it.value().get<std::string>() : python_json(it.value()));
  return out;
}

}  // namespace gclab::config
