// A diffusers config.json, read for one model class (private to the vae library).
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace gclab::vae {

// The file's JSON; throws std::runtime_error when it cannot be read, is not JSON, or names another class.
inline nlohmann::json read_config_json(const std::filesystem::path& path, const std::string& class_name) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path.string() + ": cannot be read");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path.string() + ": not JSON (" + e.what() + ")");
  }
  const std::string cls = j.value("_class_name", class_name);
  if (cls != class_name) throw std::runtime_error(path.string() + ": a " + cls + ", not an " + class_name);
  return j;
}

}  // namespace gclab::vae
