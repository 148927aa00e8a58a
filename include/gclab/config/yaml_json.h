// YAML values as JSON, and JSON written as Python's json.dumps writes it: for what gclab echoes from a
// config (reports, the `meta` block) and what it writes where AI Toolkit writes Python's JSON (the weights
// files' metadata).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace YAML {
class Node;
}

namespace gclab::config {

struct ProcessConfig;

// YAML as AI Toolkit's loader (PyYAML) types it, as JSON: quoted scalars stay text; plain ones are integers,
// numbers, booleans (true / false, yes / no, on / off in any of PyYAML's spellings) or null; the rest text.
nlohmann::ordered_json yaml_value(const YAML::Node& node);

// json.dumps(value) with Python's defaults: ", " and ": " between items, non-ASCII escaped as \uXXXX.
std::string python_json(const nlohmann::ordered_json& value);

// The config's `meta` block as AI Toolkit puts it in a weights file's metadata (get_meta_for_safetensors,
// toolkit/metadata.py:13-29): each top-level key, its value as written when it is text, else as JSON.
std::vector<std::pair<std::string, std::string>> meta_entries(const ProcessConfig& config);

}  // namespace gclab::config
