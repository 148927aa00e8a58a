// Loading an AI Toolkit config: YAML file -> ProcessConfig, with --set overrides, [name] and ${ENV}
// substitution, AI Toolkit's defaults and derived values, and validation that names the field and line.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "gclab/config/arch.h"
#include "gclab/config/config.h"
#include "gclab/config/diagnostics.h"

namespace gclab::config {

struct LoadOptions {
  // "train.batch_size=4", "datasets.0.resolution=[512,1024]", "vram_cap=24GiB": a path inside the
  // process, '=' and a YAML value. Applied in order, after the file is read and before validation.
  std::vector<std::string> overrides;
  // Largest accepted input. Configs are a few KiB; this only stops a wrong file from being parsed.
  std::size_t max_bytes = 4u << 20;
  // How a model.name_or_path names its arch when neither model.arch nor a legacy switch does: the model
  // registry's names (model::load_config_* set it to model::infer_arch_from_name); unset, only the archs
  // gclab does not model are known (config::infer_arch_from_name).
  std::function<std::optional<ArchGuess>(const std::string&)> infer_arch;
};

struct LoadResult {
  std::optional<ProcessConfig> config;  // set whenever there are no errors
  Diagnostics diagnostics;
  std::vector<std::string> ignored;  // AI Toolkit keys present in the file that gclab does not act on
  std::string arch_in_text;          // when the YAML does not parse: the `arch:` its text names, if any
  // The config as read and validated even when it has errors, so that higher parts' checks
  // (model::check_config) report theirs in the same pass. Use `config` to run anything.
  std::optional<ProcessConfig> as_read;

  bool ok() const { return config.has_value() && !diagnostics.has_errors(); }
};

LoadResult load_config_file(const std::string& path, const LoadOptions& options = {});
// `source_name` only appears in messages (a file name, or "<string>").
LoadResult load_config_text(const std::string& text, const std::string& source_name, const LoadOptions& options = {});

// The resolved config in gclab's plain (top-level) shape; load_config_text reads it back to the same
// ProcessConfig.
std::string to_yaml(const ProcessConfig& config);

// AI Toolkit's ModelConfig (toolkit/config_modules.py:713-717): under layer_offloading a qfloat8 qtype (and
// qtype_te) becomes torchao's float8. Applied when a config is read and to any config changed to offload
// (the OOM advice); returns the paths it changed.
std::vector<std::string> offloading_qtypes(ModelConfig& model);

}  // namespace gclab::config
