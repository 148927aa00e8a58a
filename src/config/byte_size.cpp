#include "gclab/config/byte_size.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace gclab::config {

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  std::size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

}  // namespace

std::optional<std::int64_t> parse_byte_size(const std::string& text) {
  const std::string s = trim(text);
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  const double number = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || !std::isfinite(number) || number < 0) return std::nullopt;
  const std::string unit = lower(trim(std::string(end)));
  double scale = 0;
  if (unit.empty() || unit == "b")
    scale = 1;
  else if (unit == "kib" || unit == "k")
    scale = 1024.0;
  else if (unit == "mib" || unit == "m")
    scale = 1024.0 * 1024;
  else if (unit == "gib" || unit == "g")
    scale = 1024.0 * 1024 * 1024;
  else if (unit == "tib" || unit == "t")
    scale = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kb")
    scale = 1e3;
  else if (unit == "mb")
    scale = 1e6;
  else if (unit == "gb")
    scale = 1e9;
  else if (unit == "tb")
    scale = 1e12;
  else
    return std::nullopt;
  const double bytes = std::round(number * scale);
  if (bytes > 9.0e18) return std::nullopt;
  return static_cast<std::int64_t>(bytes);
}

std::string format_bytes(std::int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (std::fabs(value) >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char buf[64];
  if (unit == 0)
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", value, units[unit]);
  return buf;
}

std::string format_bytes_exact(std::int64_t bytes) {
  const char* units[] = {"TiB", "GiB", "MiB", "KiB"};
  const std::int64_t scales[] = {1LL << 40, 1LL << 30, 1LL << 20, 1LL << 10};
  if (bytes > 0) {
    for (int i = 0; i < 4; ++i)
      if (bytes % scales[i] == 0) return std::to_string(bytes / scales[i]) + units[i];
  }
  return std::to_string(bytes);
}

}  // namespace gclab::config
