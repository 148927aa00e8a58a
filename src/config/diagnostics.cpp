#include "gclab/config/diagnostics.h"

namespace gclab::config {

std::string Diagnostic::format() const {
  std::string text = severity == Severity::Error ? "error: " : "warning: ";
  if (!path.empty()) {
    text += path;
    if (!origin.empty()) text += " (" + origin + ")";
    text += ": ";
  } else if (!origin.empty()) {
    text += origin + ": ";
  }
  return text + message;
}

void Diagnostics::error(std::string path, std::string origin, std::string message) {
  items_.push_back({Severity::Error, std::move(path), std::move(origin), std::move(message)});
}

void Diagnostics::warning(std::string path, std::string origin, std::string message) {
  items_.push_back({Severity::Warning, std::move(path), std::move(origin), std::move(message)});
}

bool Diagnostics::has_errors() const {
  for (const auto& d : items_)
    if (d.severity == Severity::Error) return true;
  return false;
}

static std::vector<Diagnostic> with_severity(const std::vector<Diagnostic>& items, Severity severity) {
  std::vector<Diagnostic> out;
  for (const auto& d : items)
    if (d.severity == severity) out.push_back(d);
  return out;
}

std::vector<Diagnostic> Diagnostics::errors() const { return with_severity(items_, Severity::Error); }
std::vector<Diagnostic> Diagnostics::warnings() const { return with_severity(items_, Severity::Warning); }

bool Diagnostics::mentions(const std::string& text) const {
  for (const auto& d : items_)
    if (d.format().find(text) != std::string::npos) return true;
  return false;
}

}  // namespace gclab::config
