// A JSON file read whole (a diffusers or transformers config.json, a tokenizer's files): the one rule for
// what a file that cannot be read, or is not JSON, says.
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace gclab::io {

// The file's JSON; throws std::runtime_error naming the file when it cannot be read or is not JSON.
inline nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path.string() + ": cannot be read");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path.string() + ": not JSON (" + e.what() + ")");
  }
  return j;
}

// Reads `path` and returns parse(its JSON); whatever goes wrong — the file unreadable or not JSON, a value of
// the wrong type, an error `parse` throws — is a std::runtime_error that begins with the path.
template <class Parse>
auto parse_json_file(const std::filesystem::path& path, Parse&& parse) -> decltype(parse(nlohmann::json{})) {
  const nlohmann::json j = read_json_file(path);
  try {
    return parse(j);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path.string() + ": " + e.what());
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(path.string() + ": " + e.what());
  }
}

}  // namespace gclab::io
