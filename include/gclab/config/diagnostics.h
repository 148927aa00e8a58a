// Diagnostics: what the config loader found wrong or worth saying, each tied to a field path and,
// when the value came from a file, to its YAML line, so the user can go straight to it.
#pragma once

#include <string>
#include <vector>

namespace gclab::config {

enum class Severity { Warning, Error };

struct Diagnostic {
  Severity severity = Severity::Error;
  std::string path;     // field path inside the process, e.g. "datasets[0].resolution"
  std::string origin;   // "line 42", "--set train.batch_size=0", or empty when unknown
  std::string message;  // what is wrong and what to do, in the user's words

  // "error: train.batch_size (line 42): must be at least 1, got 0"
  std::string format() const;
};

class Diagnostics {
 public:
  void error(std::string path, std::string origin, std::string message);
  void warning(std::string path, std::string origin, std::string message);

  bool has_errors() const;
  const std::vector<Diagnostic>& all() const { return items_; }
  std::vector<Diagnostic> errors() const;
  std::vector<Diagnostic> warnings() const;
  // True when some diagnostic's formatted text contains `text`; tests and callers use it to ask
  // "was this reported?" without depending on the exact wording around it.
  bool mentions(const std::string& text) const;

 private:
  std::vector<Diagnostic> items_;
};

}  // namespace gclab::config
