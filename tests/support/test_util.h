// Small helpers the test files share.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>

namespace gclab::testing {

// An empty folder of its own under the system temp folder (per process, so parallel ctest runs do not meet).
inline std::filesystem::path fresh_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("gclab_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// A parameterized test's name from a preset name: GoogleTest allows letters, digits and '_' only.
inline std::string test_name(std::string text) {
  std::replace(text.begin(), text.end(), '-', '_');
  return text;
}

}  // namespace gclab::testing
