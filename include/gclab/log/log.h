// gclab's logging: one line per message to stderr, levelled, through spdlog.
//
// Why a facade instead of including spdlog everywhere: the LibTorch wheel ships its own fmt (v12) in
// its include directory, and Debian's spdlog is built against Debian's fmt (v9). A translation unit that
// sees both fails to compile, so spdlog is included in exactly one file (src/log/log.cpp), compiled
// without LibTorch's include paths, and every other file logs through these functions.
#pragma once

#include <string>

namespace gclab::log {

enum class Level { Trace, Debug, Info, Warn, Error, Off };

// "trace" | "debug" | "info" | "warn" | "error" | "off"; false for anything else.
bool set_level(const std::string& name);
void set_level(Level level);
bool enabled(Level level);

void trace(const std::string& message);
void debug(const std::string& message);
void info(const std::string& message);
void warn(const std::string& message);
void error(const std::string& message);

// Raises the level to at least `level` while it lives, then restores the one before (a meta-device build
// that predicts a run says nothing the run will not say itself).
class QuietScope {
 public:
  explicit QuietScope(Level level = Level::Error);
  ~QuietScope();
  QuietScope(const QuietScope&) = delete;
  QuietScope& operator=(const QuietScope&) = delete;

 private:
  int previous_;
};

// Also appends every message to `path` (a run's log.txt), with timestamps; false if it cannot be opened.
bool add_file(const std::string& path);
// Which process speaks ("rank 1 of 2"): the terminal's lines begin with it (data parallelism: the ranks share a
// terminal). Call before add_file; empty: none.
void set_source(const std::string& name);
// Stops writing to every file added with add_file.
void remove_files();

}  // namespace gclab::log
