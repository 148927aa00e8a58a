#include "gclab/log/log.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <algorithm>

namespace gclab::log {

namespace {

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> instance = [] {
    auto l = spdlog::stderr_color_mt("gclab");
    l->set_pattern("%^%l%$: %v");
    return l;
  }();
  return *instance;
}

spdlog::level::level_enum to_spdlog(Level level) {
  switch (level) {
    case Level::Trace:
      return spdlog::level::trace;
    case Level::Debug:
      return spdlog::level::debug;
    case Level::Info:
      return spdlog::level::info;
    case Level::Warn:
      return spdlog::level::warn;
    case Level::Error:
      return spdlog::level::err;
    case Level::Off:
      return spdlog::level::off;
  }
  return spdlog::level::info;
}

}  // namespace

bool set_level(const std::string& name) {
  static const std::pair<const char*, Level> names[] = {{"trace", Level::Trace}, {"debug", Level::Debug},
                                                        {"info", Level::Info},   {"warn", Level::Warn},
                                                        {"error", Level::Error}, {"off", Level::Off}};
  for (const auto& [n, level] : names) {
    if (name == n) {
      set_level(level);
      return true;
    }
  }
  return false;
}

void set_level(Level level) { logger().set_level(to_spdlog(level)); }
bool enabled(Level level) { return logger().should_log(to_spdlog(level)); }

QuietScope::QuietScope(Level level) : previous_(static_cast<int>(logger().level())) {
  if (static_cast<int>(to_spdlog(level)) > previous_) logger().set_level(to_spdlog(level));
}
QuietScope::~QuietScope() { logger().set_level(static_cast<spdlog::level::level_enum>(previous_)); }

void trace(const std::string& message) { logger().log(spdlog::level::trace, "{}", message); }
void debug(const std::string& message) { logger().log(spdlog::level::debug, "{}", message); }
void info(const std::string& message) { logger().log(spdlog::level::info, "{}", message); }
void warn(const std::string& message) { logger().log(spdlog::level::warn, "{}", message); }
void error(const std::string& message) { logger().log(spdlog::level::err, "{}", message); }

}  // namespace gclab::log

namespace gclab::log {

bool add_file(const std::string& path) {
  try {
    auto sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, /*truncate=*/false);
    sink->set_pattern("[%Y-%m-%d %H:%M:%S] %l: %v");
    logger().sinks().push_back(sink);
    logger().flush_on(spdlog::level::info);
    return true;
  } catch (const spdlog::spdlog_ex&) {
    return false;
  }
}

void set_source(const std::string& name) {
  logger().set_pattern(name.empty() ? "%^%l%$: %v" : "[" + name + "] %^%l%$: %v");
}

void remove_files() {
  auto& sinks = logger().sinks();
  sinks.erase(std::remove_if(sinks.begin(), sinks.end(),
                             [](const spdlog::sink_ptr& s) {
                               return std::dynamic_pointer_cast<spdlog::sinks::basic_file_sink_mt>(s) != nullptr;
                             }),
              sinks.end());
}

}  // namespace gclab::log
