// A diffusers config.json, read for one model class (private to the vae library).
#pragma once

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "gclab/io/json_file.h"

namespace gclab::vae {

// parse(the file's JSON), as io::parse_json_file, after checking that the file names `class_name` (or no
// class) — or one of `also` (a class of the same network, which `parse` checks); every error a
// std::runtime_error that begins with the path.
template <class Parse>
auto parse_config_json(const std::filesystem::path& path, const std::string& class_name, Parse&& parse,
                       const std::vector<std::string>& also = {}) {
  return io::parse_json_file(path, [&](const nlohmann::json& j) {
    const std::string cls = j.value("_class_name", class_name);
    if (cls != class_name && std::find(also.begin(), also.end(), cls) == also.end())
      throw std::runtime_error("a " + cls + ", not an " + class_name);
    return parse(j);
  });
}

}  // namespace gclab::vae
