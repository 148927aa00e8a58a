// Reads an AI Toolkit config into ProcessConfig. The order is the order a reader of the file would
// reason in: guard the input, parse it, find the process, apply --set, substitute, read every block
// through its field list, derive AI Toolkit's implied values, then validate.
#include "gclab/config/loader.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <regex>
#include <set>
#include <sstream>
#include <type_traits>

#include "gclab/config/arch.h"
#include "gclab/config/byte_size.h"

namespace gclab::config {

namespace {

// ---------------------------------------------------------------------------------------------
// Input guards. yaml-cpp recurses once per nesting level and aliases share nodes, so a hostile or
// mangled file could overflow the stack or expand exponentially when walked; both are refused
// before anything walks the tree.
constexpr int kMaxNestingDepth = 64;
constexpr std::size_t kMaxNodesVisited = 200000;

// Deepest bracket/indentation nesting in the raw text, ignoring quoted strings and comments. An
// over-estimate is fine: real configs nest a handful of levels.
int raw_nesting_depth(const std::string& text) {
  int depth = 0, max_depth = 0;
  char quote = 0;
  bool comment = false;
  std::size_t indent = 0;
  bool at_line_start = true;
  int max_indent_levels = 0;
  for (char c : text) {
    if (c == '\n') {
      comment = false;
      at_line_start = true;
      indent = 0;
      if (quote == '\'' || quote == '"') continue;  // multi-line scalars are legal
      continue;
    }
    if (at_line_start) {
      if (c == ' ' || c == '-') {
        ++indent;
        continue;
      }
      at_line_start = false;
      max_indent_levels = std::max<int>(max_indent_levels, static_cast<int>(indent / 2));
    }
    if (comment) continue;
    if (quote) {
      if (c == quote) quote = 0;
      continue;
    }
    if (c == '#')
      comment = true;
    else if (c == '"' || c == '\'')
      quote = c;
    else if (c == '[' || c == '{')
      max_depth = std::max(max_depth, ++depth);
    else if ((c == ']' || c == '}') && depth > 0)
      --depth;
  }
  return std::max(max_depth, max_indent_levels);
}

// Walks the tree (through aliases) counting nodes; stops as soon as the budget is spent.
bool within_node_budget(const YAML::Node& node, std::size_t& visited, int depth = 0) {
  if (++visited > kMaxNodesVisited || depth > kMaxNestingDepth) return false;
  if (node.IsSequence()) {
    for (const auto& child : node)
      if (!within_node_budget(child, visited, depth + 1)) return false;
  } else if (node.IsMap()) {
    for (const auto& kv : node) {
      if (!within_node_budget(kv.first, visited, depth + 1)) return false;
      if (!within_node_budget(kv.second, visited, depth + 1)) return false;
    }
  }
  return true;
}

std::string line_of(const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  if (mark.is_null() || mark.line < 0) return "";
  return "line " + std::to_string(mark.line + 1);
}

std::string join(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }

std::string describe(const YAML::Node& node) {
  if (!node || node.IsNull()) return "nothing";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  std::string s = node.Scalar();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return "'" + s + "'";
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string nearest(const std::string& key, const std::set<std::string>& candidates) {
  std::string best;
  std::size_t best_distance = std::string::npos;
  for (const auto& c : candidates) {
    const std::size_t d = edit_distance(key, c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  const std::size_t allowed = std::max<std::size_t>(2, key.size() / 3);
  return best_distance <= allowed ? best : "";
}

// ---------------------------------------------------------------------------------------------
// Shared state of one load.
struct LoadContext {
  Diagnostics& diagnostics;
  std::vector<std::string>& ignored;
  SourceMap& source;
  std::vector<std::pair<std::string, std::string>> overridden;  // path prefix -> "--set a.b=c"

  std::string origin(const std::string& path, const YAML::Node& node) const {
    for (const auto& [prefix, text] : overridden)
      if (path == prefix || path.rfind(prefix + ".", 0) == 0 || path.rfind(prefix + "[", 0) == 0) return text;
    return line_of(node);
  }
  void error(const std::string& path, const YAML::Node& node, const std::string& message) {
    diagnostics.error(path, origin(path, node), message);
  }
};

// ---------------------------------------------------------------------------------------------
// Scalar conversion, strict: "1.5" is not an integer, "yes please" is not a bool.
std::optional<std::int64_t> to_integer(const std::string& s) {
  std::int64_t value = 0;
  const char* first = s.data();
  const char* last = s.data() + s.size();
  if (!s.empty() && s[0] == '+') ++first;
  auto [ptr, ec] = std::from_chars(first, last, value);
  if (ec == std::errc() && ptr == last) return value;
  // 1e3 and 2000.0 are whole numbers a user may write.
  char* end = nullptr;
  errno = 0;
  const double d = std::strtod(s.c_str(), &end);
  if (end == s.c_str() + s.size() && !s.empty() && errno == 0 && std::isfinite(d) && d == std::floor(d) &&
      std::fabs(d) < 9.0e18)
    return static_cast<std::int64_t>(d);
  return std::nullopt;
}

std::optional<double> to_real(const std::string& s) {
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double d = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || errno != 0 || !std::isfinite(d)) return std::nullopt;
  return d;
}

std::optional<bool> to_bool(const std::string& raw) {
  std::string s = raw;
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "true" || s == "yes" || s == "on") return true;
  if (s == "false" || s == "no" || s == "off") return false;
  return std::nullopt;
}

template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};
template <class T>
struct is_vector : std::false_type {};
template <class T>
struct is_vector<std::vector<T>> : std::true_type {};

class BlockReader;

// Reads one YAML value into `out`; reports and returns false when it cannot.
template <class T>
bool read_value(const YAML::Node& node, T& out, const std::string& path, LoadContext& ctx);

class BlockReader {
 public:
  BlockReader(const YAML::Node& map, std::string path, LoadContext& ctx)
      : map_(map), path_(std::move(path)), ctx_(ctx) {}

  template <class T>
  void operator()(const char* key, T& value) {
    known_.insert(key);
    const YAML::Node& map = map_;  // const lookup: never inserts the key it asks for
    const YAML::Node child = map[key];
    if (!child.IsDefined()) return;  // absent: AI Toolkit's default stays
    const std::string path = join(path_, key);
    ctx_.source.origin_by_path[path] = ctx_.origin(path, child);
    read_value(child, value, path, ctx_);
  }

  void ignore(std::initializer_list<const char*> keys) {
    for (const char* k : keys) ignored_.insert(k);
  }

  // Unknown keys: a warning naming the nearest known key. AI Toolkit keys gclab does not act on: listed.
  void finish() {
    std::set<std::string> seen;
    for (const auto& kv : map_) {
      if (!kv.first.IsScalar()) {
        ctx_.error(path_, kv.first, "keys must be plain names, found " + describe(kv.first));
        continue;
      }
      const std::string key = kv.first.Scalar();
      const std::string path = join(path_, key);
      if (!seen.insert(key).second) {
        ctx_.diagnostics.warning(path, ctx_.origin(path, kv.first),
                                 "appears twice in this block; the first value is used");
        continue;
      }
      if (known_.count(key)) continue;
      if (ignored_.count(key)) {
        ctx_.ignored.push_back(path);
        continue;
      }
      std::set<std::string> candidates = known_;
      candidates.insert(ignored_.begin(), ignored_.end());
      const std::string suggestion = nearest(key, candidates);
      ctx_.diagnostics.warning(path, ctx_.origin(path, kv.first),
                               "unknown key" + (suggestion.empty() ? std::string(", ignored")
                                                                   : ", ignored (did you mean '" + suggestion + "'?)"));
    }
  }

 private:
  YAML::Node map_;
  std::string path_;
  LoadContext& ctx_;
  std::set<std::string> known_;
  std::set<std::string> ignored_;
};

template <class T>
bool read_value(const YAML::Node& node, T& out, const std::string& path, LoadContext& ctx);

// The field types a YAML scalar gives.
template <class T>
inline constexpr bool is_scalar_field =
    std::is_same_v<T, bool> || std::is_integral_v<T> || std::is_floating_point_v<T> || std::is_enum_v<T> ||
    std::is_same_v<T, ckpt::CheckpointPolicy> || std::is_same_v<T, std::string> || std::is_same_v<T, ByteSize>;

template <class T>
bool read_scalar(const YAML::Node& node, T& out, const std::string& path, LoadContext& ctx) {
  if constexpr (std::is_same_v<T, bool>) {
    const auto v = node.IsScalar() ? to_bool(node.Scalar()) : std::nullopt;
    if (!v) {
      ctx.error(path, node, "expected true or false, got " + describe(node));
      return false;
    }
    out = *v;
    return true;
  } else if constexpr (std::is_integral_v<T>) {
    const auto v = node.IsScalar() ? to_integer(node.Scalar()) : std::nullopt;
    if (!v || *v < static_cast<std::int64_t>(std::numeric_limits<T>::min()) ||
        *v > static_cast<std::int64_t>(std::numeric_limits<T>::max())) {
      ctx.error(path, node, "expected a whole number, got " + describe(node));
      return false;
    }
    out = static_cast<T>(*v);
    return true;
  } else if constexpr (std::is_floating_point_v<T>) {
    const auto v = node.IsScalar() ? to_real(node.Scalar()) : std::nullopt;
    if (!v) {
      ctx.error(path, node, "expected a number, got " + describe(node));
      return false;
    }
    out = static_cast<T>(*v);
    return true;
  } else if constexpr (std::is_enum_v<T>) {
    const auto v = node.IsScalar() ? parse_choice<T>(node.Scalar()) : std::nullopt;
    if (!v) {
      ctx.error(path, node, describe(node) + " is not supported; use one of: " + choice_list<T>());
      return false;
    }
    out = *v;
    return true;
  } else if constexpr (std::is_same_v<T, ckpt::CheckpointPolicy>) {
    if (!node.IsScalar()) {
      ctx.error(path, node, "expected a checkpoint policy, got " + describe(node));
      return false;
    }
    try {
      out = ckpt::CheckpointPolicy::parse(node.Scalar());
    } catch (const std::invalid_argument& e) {
      ctx.error(path, node, e.what());
      return false;
    }
    return true;
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!node.IsScalar()) {
      ctx.error(path, node, "expected text, got " + describe(node));
      return false;
    }
    out = node.Scalar();
    return true;
  } else {
    static_assert(std::is_same_v<T, ByteSize>);
    if (node.IsNull()) {
      out.bytes = 0;
      return true;
    }
    std::string text = node.IsScalar() ? node.Scalar() : "";
    if (text == "none" || text == "off") text = "0";
    const auto v = node.IsScalar() ? parse_byte_size(text) : std::nullopt;
    if (!v) {
      ctx.error(path, node, "expected a size such as 24GiB, 24GB or a byte count, got " + describe(node));
      return false;
    }
    out.bytes = *v;
    return true;
  }
}

// A list; AI Toolkit also accepts one value for a list of one (`resolution: 512` for `[512]`).
template <class T>
bool read_sequence(const YAML::Node& node, T& out, const std::string& path, LoadContext& ctx) {
  using Item = typename T::value_type;
  T items;
  if (node.IsNull()) {
    out = items;
    return true;
  }
  if (!node.IsSequence()) {  // AI Toolkit accepts `resolution: 512` for `[512]`
    Item item{};
    if (!read_value(node, item, path, ctx)) return false;
    items.push_back(std::move(item));
    out = std::move(items);
    return true;
  }
  bool ok = true;
  std::size_t index = 0;
  for (const auto& child : node) {
    Item item{};
    const std::string item_path = path + "[" + std::to_string(index++) + "]";
    ctx.source.origin_by_path[item_path] = ctx.origin(item_path, child);
    ok = read_value(child, item, item_path, ctx) && ok;
    items.push_back(std::move(item));
  }
  out = std::move(items);
  return ok;
}

template <class T>
bool read_value(const YAML::Node& node, T& out, const std::string& path, LoadContext& ctx) {
  if constexpr (is_optional<T>::value) {
    if (node.IsNull()) {
      out.reset();
      return true;
    }
    typename T::value_type inner{};
    if (!read_value(node, inner, path, ctx)) return false;
    out = std::move(inner);
    return true;
  } else if constexpr (is_vector<T>::value) {
    return read_sequence(node, out, path, ctx);
  } else if constexpr (is_scalar_field<T>) {
    return read_scalar(node, out, path, ctx);
  } else {                           // a block with its own field list
    if (node.IsNull()) return true;  // `sample:` with nothing under it keeps the defaults
    if (!node.IsMap()) {
      ctx.error(path, node, "expected a block of keys, got " + describe(node));
      return false;
    }
    BlockReader reader(node, path, ctx);
    out.fields(reader);
    reader.finish();
    return true;
  }
}

// ---------------------------------------------------------------------------------------------
// --set overrides

struct PathStep {
  bool is_index = false;
  std::string key;
  std::size_t index = 0;
};

// "datasets.0.resolution" and "datasets[0].resolution" both name the same field.
std::optional<std::vector<PathStep>> parse_override_path(const std::string& path) {
  std::vector<PathStep> steps;
  std::string token;
  auto flush = [&]() -> bool {
    if (token.empty()) return false;
    PathStep step;
    if (std::all_of(token.begin(), token.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
      step.is_index = true;
      step.index = static_cast<std::size_t>(std::stoull(token));
    }
    step.key = token;
    steps.push_back(step);
    token.clear();
    return true;
  };
  for (std::size_t i = 0; i < path.size(); ++i) {
    const char c = path[i];
    if (c == '.') {
      if (!flush()) return std::nullopt;
    } else if (c == '[') {
      if (!token.empty() && !flush()) return std::nullopt;
      const std::size_t close = path.find(']', i);
      if (close == std::string::npos) return std::nullopt;
      token = path.substr(i + 1, close - i - 1);
      if (token.empty() ||
          !std::all_of(token.begin(), token.end(), [](char d) { return std::isdigit(static_cast<unsigned char>(d)); }))
        return std::nullopt;
      flush();
      i = close;
      if (i + 1 < path.size() && path[i + 1] == '.') ++i;
    } else {
      token += c;
    }
  }
  if (!token.empty()) flush();
  if (steps.empty()) return std::nullopt;
  return steps;
}

std::string canonical_path(const std::vector<PathStep>& steps) {
  std::string out;
  for (const auto& s : steps) {
    if (s.is_index)
      out += "[" + s.key + "]";
    else
      out += (out.empty() ? "" : ".") + s.key;
  }
  return out;
}

void apply_override(YAML::Node process, const std::string& text, LoadContext& ctx) {
  const std::string where = "--set " + text;
  const std::size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0) {
    ctx.diagnostics.error("", where, "expected PATH=VALUE, e.g. --set train.batch_size=4");
    return;
  }
  const auto steps = parse_override_path(text.substr(0, eq));
  if (!steps) {
    ctx.diagnostics.error("", where, "'" + text.substr(0, eq) + "' is not a field path (e.g. datasets.0.resolution)");
    return;
  }
  YAML::Node value;
  try {
    value = YAML::Load(text.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    ctx.diagnostics.error(canonical_path(*steps), where, "the value is not valid YAML: " + e.msg);
    return;
  }
  if (!value.IsDefined()) value = YAML::Node(YAML::NodeType::Null);

  // Walk to the parent, creating blocks that do not exist yet.
  YAML::Node parent;
  parent.reset(process);
  for (std::size_t i = 0; i + 1 < steps->size(); ++i) {
    const PathStep& step = (*steps)[i];
    const PathStep& next = (*steps)[i + 1];
    // yaml-cpp: `a = b` between nodes writes b's value INTO a; rebinding a handle is `a.reset(b)`.
    YAML::Node child;
    if (step.is_index) {
      if (!parent.IsSequence() || step.index >= parent.size()) {
        ctx.diagnostics.error(canonical_path(*steps), where, "index " + step.key + " is past the end of the list");
        return;
      }
      child.reset(parent[step.index]);
    } else {
      if (!parent.IsMap() && !parent.IsNull()) {
        ctx.diagnostics.error(canonical_path(*steps), where,
                              "'" + step.key + "' is inside a value that is not a block");
        return;
      }
      child.reset(parent[step.key]);
      if (!child.IsDefined() || child.IsNull()) {
        parent[step.key] = next.is_index ? YAML::Node(YAML::NodeType::Sequence) : YAML::Node(YAML::NodeType::Map);
        child.reset(parent[step.key]);
      }
    }
    parent.reset(child);
  }
  const PathStep& last = steps->back();
  if (last.is_index) {
    if (!parent.IsSequence() || last.index > parent.size()) {
      ctx.diagnostics.error(canonical_path(*steps), where, "index " + last.key + " is past the end of the list");
      return;
    }
    if (last.index == parent.size())
      parent.push_back(value);
    else
      parent[last.index] = value;
  } else {
    if (!parent.IsMap() && !parent.IsNull()) {
      ctx.diagnostics.error(canonical_path(*steps), where, "'" + last.key + "' is inside a value that is not a block");
      return;
    }
    parent[last.key] = value;
  }
  ctx.overridden.emplace_back(canonical_path(*steps), where);
}

// ---------------------------------------------------------------------------------------------
// [name] and ${ENV_VAR} substitution in every text value (AI Toolkit does both on the whole config).
void substitute(YAML::Node node, const std::string& name, const std::string& path, LoadContext& ctx) {
  if (node.IsMap()) {
    for (auto kv : node) {
      const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : "?";
      substitute(kv.second, name, join(path, key), ctx);
    }
    return;
  }
  if (node.IsSequence()) {
    std::size_t i = 0;
    for (auto child : node) substitute(child, name, path + "[" + std::to_string(i++) + "]", ctx);
    return;
  }
  if (!node.IsScalar()) return;
  std::string text = node.Scalar();
  if (text.find('[') == std::string::npos && text.find("${") == std::string::npos) return;
  std::string out;
  for (std::size_t i = 0; i < text.size();) {
    if (text.compare(i, 6, "[name]") == 0) {
      out += name;
      i += 6;
    } else if (text.compare(i, 2, "${") == 0) {
      const std::size_t close = text.find('}', i);
      const std::string var = close == std::string::npos ? "" : text.substr(i + 2, close - i - 2);
      const bool valid = !var.empty() && std::all_of(var.begin(), var.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
      });
      if (!valid) {
        out += text[i++];
        continue;
      }
      const char* value = std::getenv(var.c_str());
      if (!value) {
        ctx.error(path, node, "environment variable ${" + var + "} is not set");
        return;
      }
      out += value;
      i = close + 1;
    } else {
      out += text[i++];
    }
  }
  node = out;
}

// ---------------------------------------------------------------------------------------------
// Derived values: what AI Toolkit computes from what the user wrote.

class Validator {
 public:
  Validator(ProcessConfig& c, Diagnostics& d, const LoadOptions& o) : c_(c), d_(d), options_(o) {}

  void error(const std::string& path, const std::string& message) { d_.error(path, c_.source.where(path), message); }
  void warning(const std::string& path, const std::string& message) {
    d_.warning(path, c_.source.where(path), message);
  }
  bool given(const std::string& path) const { return c_.source.origin_by_path.count(path) > 0; }

  template <class T>
  void at_least(const std::string& path, T value, T minimum) {
    if (value < minimum) error(path, "must be at least " + std::to_string(minimum) + ", got " + std::to_string(value));
  }
  void run() {
    if (c_.name.empty()) error("name", "is required (AI Toolkit names the output folder and files after it)");
    if (c_.vram_cap.bytes < 0) error("vram_cap", "must not be negative");
    if (c_.host_cap.bytes < 0) error("host_cap", "must not be negative");
    resolve_arch();
    quantization();
    offloading();
    model_kwargs();
    network();
    save();
    datasets();
    train();
    sample();
  }

 private:
  void resolve_arch() {
    ModelConfig& m = c_.model;
    std::string arch = m.arch;
    std::string reason = "model.arch";
    if (const std::size_t colon = arch.find(':'); colon != std::string::npos)
      m.arch_tag = arch.substr(colon + 1), arch = arch.substr(0, colon);
    if (arch.empty()) {
      if (m.is_flux)
        arch = "flux", reason = "model.is_flux";
      else if (m.is_v3)
        arch = "sd3", reason = "model.is_v3";
      else if (m.is_lumina2)
        arch = "lumina2", reason = "model.is_lumina2";
      else if (m.name_or_path) {
        const auto guess =
            options_.infer_arch ? options_.infer_arch(*m.name_or_path) : infer_arch_from_name(*m.name_or_path);
        if (guess) arch = guess->arch, reason = guess->reason;
      }
    }
    if (arch.empty()) {
      error("model.arch",
            "is not set and cannot be inferred from model.name_or_path; AI Toolkit would assume sd1, which gclab "
            "does not model. Set model.arch (flux, flex1, flex2, qwen_image, zimage, sd3, dit, ...; the README lists "
            "them)");
      return;
    }
    m.arch = arch;
    c_.arch_from_legacy_switch = reason == "model.is_flux" || reason == "model.is_v3" || reason == "model.is_lumina2";
  }

  // model.qtype / qtype_te were read as QTypes (split_qtype_adapter took any adapter off first).
  void quantization() {
    ModelConfig& m = c_.model;
    if (m.text_encoder_bits != 16 && m.text_encoder_bits != 8 && m.text_encoder_bits != 4)
      error("model.text_encoder_bits", "must be 16, 8 or 4 (AI Toolkit's choices)");
    else if (m.text_encoder_bits != 16)
      warning("model.text_encoder_bits",
              "has no effect here: AI Toolkit applies it to PixArt's text encoder only (its ModelConfig: \"Only works "
              "with pixart currently\"); for this family use quantize_te / qtype_te");
    if (m.accuracy_recovery_adapter && !m.quantize)
      warning("model.accuracy_recovery_adapter",
              "is not used: model.quantize is false (AI Toolkit applies it while quantizing)");
  }

  // model.layer_offloading: shares in [0, 1]; the offloaded Linears must be frozen (a LoRA base): AI Toolkit
  // also streams a full fine-tune's gradients back to host memory, which gclab does not model.
  void offloading() {
    ModelConfig& m = c_.model;
    for (const std::string& path : offloading_qtypes(m))
      if (m.quantize || m.quantize_te.value_or(m.quantize))
        warning(path, "qfloat8 becomes float8 under model.layer_offloading, as AI Toolkit's ModelConfig makes it");
    for (const auto& [path, share] :
         {std::pair<std::string, double>{"model.layer_offloading_transformer_percent",
                                         m.layer_offloading_transformer_percent},
          {"model.layer_offloading_text_encoder_percent", m.layer_offloading_text_encoder_percent}})
      if (!(share >= 0.0 && share <= 1.0)) error(path, "must be a share between 0 and 1 (1 = every Linear)");
    if (m.layer_offloading && !c_.network && m.layer_offloading_transformer_percent > 0)
      error("model.layer_offloading",
            "offloads frozen weights: it needs a LoRA network (gclab does not model a full fine-tune's weights and "
            "gradients streamed to host memory)");
  }

  // model.model_kwargs: chances in [0, 1] (which arch reads them: model::check_config).
  void model_kwargs() {
    const ModelKwargs& k = c_.model.model_kwargs;
    for (const auto& [key, chance] :
         {std::pair<const char*, double>{"invert_inpaint_mask_chance", k.invert_inpaint_mask_chance},
          {"inpaint_dropout", k.inpaint_dropout},
          {"control_dropout", k.control_dropout},
          {"inpaint_random_chance", k.inpaint_random_chance}})
      if (!(chance >= 0.0 && chance <= 1.0))
        error(std::string("model.model_kwargs.") + key, "must be a chance in [0, 1]");
  }

  void network() {
    if (!c_.network) return;
    NetworkConfig& n = *c_.network;
    if (n.type != "lora") error("network.type", "'" + n.type + "' is not supported; gclab trains LoRA networks (lora)");
    if (!n.linear && n.rank) n.linear = n.rank;
    if (!n.linear) {
      error("network.linear", "is required for a LoRA network (its rank, e.g. 16)");
    } else {
      at_least("network.linear", *n.linear, 1);
    }
    if (!n.linear_alpha) n.linear_alpha = n.alpha;
    if (*n.linear_alpha <= 0) error("network.linear_alpha", "must be positive");
    if (n.dropout && (*n.dropout < 0 || *n.dropout >= 1)) error("network.dropout", "must be in [0, 1)");
  }

  void save() {
    SaveConfig& s = c_.save;
    at_least("save.save_every", s.save_every, 1);
    at_least("save.max_step_saves_to_keep", s.max_step_saves_to_keep, 0);
  }

  void datasets() {
    if (c_.datasets.empty()) warning("datasets", "no dataset given; `gclab train` needs at least one");
    // AI Toolkit caches every dataset's text or none (toolkit/config_modules.py:1494-1500: a ValueError);
    // train.cache_text_embeddings sets every dataset's flag first (jobs/process/BaseSDTrainProcess.py:153-155).
    if (c_.train.cache_text_embeddings)
      for (DatasetConfig& d : c_.datasets) d.cache_text_embeddings = true;
    const auto caches = [](const DatasetConfig& d) { return d.cache_text_embeddings; };
    const auto one = std::find_if(c_.datasets.begin(), c_.datasets.end(), caches);
    const auto other = std::find_if_not(c_.datasets.begin(), c_.datasets.end(), caches);
    if (one != c_.datasets.end() && other != c_.datasets.end())
      error("datasets[" + std::to_string(other - c_.datasets.begin()) + "].cache_text_embeddings",
            "is false while datasets[" + std::to_string(one - c_.datasets.begin()) +
                "] caches its text embeddings: AI Toolkit requires every dataset to cache them when one does (a "
                "ValueError there); set it on every dataset, or train.cache_text_embeddings: true");
    for (std::size_t i = 0; i < c_.datasets.size(); ++i) {
      DatasetConfig& d = c_.datasets[i];
      const std::string p = "datasets[" + std::to_string(i) + "]";
      if (!d.folder_path || d.folder_path->empty())
        error(p + ".folder_path", "is required (a folder of images)");
      else if (!std::filesystem::is_directory(*d.folder_path))
        warning(p + ".folder_path", "'" + *d.folder_path + "' is not a folder here; `gclab train` will refuse it");
      if (!d.caption_ext.empty() && d.caption_ext[0] != '.') d.caption_ext = "." + d.caption_ext;
      if (d.caption_dropout_rate < 0 || d.caption_dropout_rate > 1)
        error(p + ".caption_dropout_rate", "must be between 0 and 1, got " + std::to_string(d.caption_dropout_rate));
      if (d.mask_min_value < 0 || d.mask_min_value > 1)
        error(p + ".mask_min_value", "must be between 0 and 1, got " + std::to_string(d.mask_min_value));
      for (const auto& [key, folder] : {std::pair{".inpaint_path", d.inpaint_path}, {".mask_path", d.mask_path}})
        if (folder && !std::filesystem::is_directory(*folder))
          warning(p + key, "'" + *folder + "' is not a folder here; no image will find its file in it");
      at_least(p + ".num_repeats", d.num_repeats, 1);
      at_least(p + ".keep_tokens", d.keep_tokens, 0);
      if (d.control_transparent_color.size() != 3 ||
          std::any_of(d.control_transparent_color.begin(), d.control_transparent_color.end(),
                      [](int c) { return c < 0 || c > 255; }))
        error(p + ".control_transparent_color", "must be three values from 0 to 255 (an RGB colour)");
      at_least(p + ".num_frames", d.num_frames, 1);
      at_least(p + ".fps", d.fps, 1);
      if (d.batch_size) at_least(p + ".batch_size", *d.batch_size, 1);
      if (d.resolution.empty()) error(p + ".resolution", "must list at least one resolution");
      for (std::size_t r = 0; r < d.resolution.size(); ++r) {
        const std::string rp = p + ".resolution";
        const int res = d.resolution[r];
        if (res <= 0) {
          error(rp, "must be positive, got " + std::to_string(res));
        }
      }
    }
  }

  // optimizer_params the chosen optimizer takes (AI Toolkit passes them on as keyword arguments, and the
  // optimizer's constructor refuses any other with a TypeError).
  void optimizer_params(const TrainConfig& t) {
    const OptimizerParams& o = t.optimizer_params;
    struct Owned {
      const char* key;
      bool given;
      OptimizerKind owner;
    };
    const Owned owned[] = {{"relative_step", o.relative_step.has_value(), OptimizerKind::adafactor},
                           {"scale_parameter", o.scale_parameter.has_value(), OptimizerKind::adafactor},
                           {"warmup_init", o.warmup_init.has_value(), OptimizerKind::adafactor},
                           {"clip_threshold", o.clip_threshold.has_value(), OptimizerKind::adafactor},
                           {"decay_rate", o.decay_rate.has_value(), OptimizerKind::adafactor},
                           {"beta1", o.beta1.has_value(), OptimizerKind::adafactor},
                           {"d0", o.d0.has_value(), OptimizerKind::prodigy},
                           {"d_coef", o.d_coef.has_value(), OptimizerKind::prodigy},
                           {"growth_rate", o.growth_rate.has_value(), OptimizerKind::prodigy},
                           {"beta3", o.beta3.has_value(), OptimizerKind::prodigy},
                           {"use_bias_correction", o.use_bias_correction.has_value(), OptimizerKind::prodigy},
                           {"safeguard_warmup", o.safeguard_warmup.has_value(), OptimizerKind::prodigy},
                           {"decouple", o.decouple.has_value(), OptimizerKind::prodigy}};
    for (const auto& k : owned)
      if (k.given && k.owner != t.optimizer)
        error(std::string("train.optimizer_params.") + k.key, "is a parameter of " + std::string(name_of(k.owner)) +
                                                                  ", not of train.optimizer " +
                                                                  std::string(name_of(t.optimizer)));
    if (t.optimizer == OptimizerKind::adafactor) {
      if (given("train.optimizer_params.betas"))
        error("train.optimizer_params.betas", "adafactor takes beta1 (and decay_rate), not betas");
      // AI Toolkit always passes lr, and its Adafactor refuses lr with relative_step.
      if (o.relative_step.value_or(false))
        error("train.optimizer_params.relative_step",
              "true cannot be combined with train.lr (AI Toolkit's Adafactor refuses it too: \"Cannot combine manual "
              "`lr` and `relative_step=True` options\"); leave it false");
      if (o.warmup_init.value_or(false))
        error("train.optimizer_params.warmup_init", "true requires relative_step, which cannot be used with train.lr");
      if (o.beta1 && !(*o.beta1 >= 0 && *o.beta1 < 1)) error("train.optimizer_params.beta1", "must be in [0, 1)");
      if (o.clip_threshold && !(*o.clip_threshold > 0))
        error("train.optimizer_params.clip_threshold", "must be positive");
      if (o.decay_rate && !(*o.decay_rate < 0))
        error("train.optimizer_params.decay_rate", "must be negative (e.g. -0.8)");
    }
    if (t.optimizer == OptimizerKind::prodigy) {
      if (o.d0 && !(*o.d0 > 0)) error("train.optimizer_params.d0", "must be positive");
      if (o.d_coef && !(*o.d_coef > 0)) error("train.optimizer_params.d_coef", "must be positive");
      if (o.growth_rate && !(*o.growth_rate >= 1)) error("train.optimizer_params.growth_rate", "must be at least 1");
      if (o.beta3 && !(*o.beta3 >= 0 && *o.beta3 < 1)) error("train.optimizer_params.beta3", "must be in [0, 1)");
    }
  }

  void train() {
    TrainConfig& t = c_.train;
    at_least("train.batch_size", t.batch_size, 1);
    at_least("train.steps", t.steps, 1);
    if (!(t.lr > 0)) error("train.lr", "must be positive");
    if (t.dtype == DType::fp16)
      error("train.dtype", "fp16 training needs loss scaling, which gclab does not do; use bf16 (autocast) or fp32");
    if (t.optimizer_params.weight_decay < 0) error("train.optimizer_params.weight_decay", "must not be negative");
    if (t.optimizer_params.betas.size() != 2 || t.optimizer_params.betas[0] < 0 || t.optimizer_params.betas[0] >= 1 ||
        t.optimizer_params.betas[1] < 0 || t.optimizer_params.betas[1] >= 1)
      error("train.optimizer_params.betas", "must be two numbers in [0, 1), e.g. [0.9, 0.999]");
    if (!(t.optimizer_params.eps > 0)) error("train.optimizer_params.eps", "must be positive");
    // AI Toolkit (toolkit/lora_special.py) gives text encoders LoRA only on CLIPAttention / CLIPMLP modules:
    // CLIP-L (and bigG) for FLUX and SD3, nothing at all for Qwen-Image's and Z-Image's Qwen encoders; its
    // example configs set it false ("probably won't work with flux / qwen image"). gclab keeps every text
    // encoder frozen.
    if (t.train_text_encoder)
      error("train.train_text_encoder",
            "is not supported: gclab trains the transformer and keeps the text encoders frozen (AI Toolkit's LoRA "
            "for them reaches only CLIP's attention and MLP modules, and no module of the Qwen encoders); remove it "
            "or set it false");
    optimizer_params(t);
    const LrSchedulerParams& lp = t.lr_scheduler_params;
    if (lp.num_warmup_steps && *lp.num_warmup_steps < 0)
      error("train.lr_scheduler_params.num_warmup_steps", "must not be negative");
    if (lp.start_factor && !(*lp.start_factor > 0 && *lp.start_factor <= 1))  // torch LinearLR's own check
      error("train.lr_scheduler_params.start_factor", "must be in (0, 1]");
    if (lp.end_factor && !(*lp.end_factor >= 0 && *lp.end_factor <= 1))
      error("train.lr_scheduler_params.end_factor", "must be in [0, 1]");
    if (lp.cosine_decay_steps && *lp.cosine_decay_steps <= 0)
      error("train.lr_scheduler_params.cosine_decay_steps", "must be positive");
    // AI Toolkit hands lr_scheduler_params to the scheduler as keywords (toolkit/scheduler.py:11-49): cosine
    // is torch's CosineAnnealingLR (eta_min), linear LinearLR (start_factor, end_factor), constant ConstantLR,
    // constant_with_warmup diffusers' (num_warmup_steps). A key the scheduler does not take is a TypeError there
    // before the first step.
    const auto takes = [&](const char* key) {
      const std::string k = key;
      switch (t.lr_scheduler) {
        case LrScheduler::cosine:
          return k == "eta_min";
        case LrScheduler::linear:
          return k == "start_factor" || k == "end_factor";
        case LrScheduler::constant_with_warmup:
          return k == "num_warmup_steps";
        case LrScheduler::constant:
          return false;
      }
      return false;
    };
    for (const auto& [key, set] : {std::pair<const char*, bool>{"num_warmup_steps", lp.num_warmup_steps.has_value()},
                                   {"start_factor", lp.start_factor.has_value()},
                                   {"end_factor", lp.end_factor.has_value()},
                                   {"eta_min", lp.eta_min.has_value()},
                                   {"cosine_decay_steps", lp.cosine_decay_steps.has_value()}})
      if (set && !takes(key))
        error(std::string("train.lr_scheduler_params.") + key,
              std::string("is not a keyword of AI Toolkit's ") + std::string(name_of(t.lr_scheduler)) +
                  " schedule (torch's CosineAnnealingLR for cosine, LinearLR for linear, ConstantLR for constant: "
                  "its run fails with a TypeError); remove it" +
                  (std::string(key) == "num_warmup_steps" ? ", or use lr_scheduler: constant_with_warmup" : ""));
    if (given("train.noise_scheduler") && t.noise_scheduler != "flowmatch")
      warning("train.noise_scheduler",
              "gclab trains every model with flow matching; '" + t.noise_scheduler + "' is ignored");
    at_least("train.num_train_timesteps", t.num_train_timesteps, 2);
    at_least("train.next_sample_timesteps", t.next_sample_timesteps, 3);
    at_least("train.min_denoising_steps", t.min_denoising_steps, 0);
    at_least("train.switch_boundary_every", t.switch_boundary_every, 0);
    if (t.max_denoising_steps < t.min_denoising_steps)
      error("train.max_denoising_steps", "must not be below train.min_denoising_steps");
    at_least("train.gradient_accumulation", t.gradient_accumulation, 1);
    if (t.gradient_accumulation_steps != -1)
      at_least("train.gradient_accumulation_steps", t.gradient_accumulation_steps, 1);
    if (t.gradient_accumulation > 1 && t.gradient_accumulation_steps != 1)
      error("train.gradient_accumulation",
            "and train.gradient_accumulation_steps are mutually exclusive (as in AI Toolkit); keep one");
    if (t.max_grad_norm < 0) error("train.max_grad_norm", "must not be negative");
    if (t.max_grad_norm == 0 && t.optimizer != config::OptimizerKind::adafactor)
      warning("train.max_grad_norm",
              "is 0: every gradient is clipped to zero, as AI Toolkit's clip_grad_norm_ does (SDTrainer.py:2276-2283); "
              "nothing trains but weight decay. For no clipping, set a large value");
    if (t.ema_config.ema_decay < 0 || t.ema_config.ema_decay >= 1)
      error("train.ema_config.ema_decay", "must be in [0, 1)");
    // AI Toolkit's switch maps onto gclab's policy; an explicit policy wins, and a contradiction is said.
    using Kind = ckpt::CheckpointPolicy::Kind;
    if (!t.checkpoint_policy) {
      t.checkpoint_policy = t.gradient_checkpointing ? ckpt::CheckpointPolicy::full() : ckpt::CheckpointPolicy::off();
    } else if (given("train.gradient_checkpointing") && !t.gradient_checkpointing && t.policy().kind != Kind::Off) {
      warning("train.checkpoint_policy",
              "'" + t.policy().to_string() + "' overrides train.gradient_checkpointing: false");
    }
    t.gradient_checkpointing = t.policy().kind != Kind::Off;
  }

  // Inline flags in a sample prompt, as AI Toolkit reads them (config_modules.py, GenerateImageConfig.
  // _process_prompt_string, after sd-scripts): the prompt is cut at every "--"; the text before is the
  // prompt, each piece after is a flag and its value, which wins over the item's and the block's own.
  void prompt_flags(SampleItem& item, const std::string& path) {
    std::vector<std::string> pieces;
    std::string rest = item.prompt;
    for (std::size_t at; (at = rest.find("--")) != std::string::npos; rest = rest.substr(at + 2))
      pieces.push_back(rest.substr(0, at));
    pieces.push_back(rest);
    if (pieces.size() == 1) return;
    auto trim = [](std::string t) {
      const auto b = t.find_first_not_of(" \t\n"), e = t.find_last_not_of(" \t\n");
      return b == std::string::npos ? std::string() : t.substr(b, e - b + 1);
    };
    item.prompt = trim(pieces[0]);
    for (std::size_t k = 1; k < pieces.size(); ++k) {
      const std::string piece = trim(pieces[k]);
      const std::string flag = piece.substr(0, piece.find(' '));
      const std::string value = trim(piece.substr(flag.size()));
      const std::string where = path + ".prompt";
      auto number = [&](auto& out) {
        try {
          std::size_t used = 0;
          using T = typename std::decay_t<decltype(out)>::value_type;
          if constexpr (std::is_floating_point_v<T>)
            out = std::stod(value, &used);
          else
            out = static_cast<T>(std::stoll(value, &used));
          if (used != value.size()) throw std::invalid_argument(value);
        } catch (const std::exception&) {
          error(where, "--" + flag + " needs a number, got '" + value + "'");
        }
      };
      if (flag == "n") {
        item.neg = value;
      } else if (flag == "w") {
        number(item.width);
      } else if (flag == "h") {
        number(item.height);
      } else if (flag == "d" || flag == "seed") {
        number(item.prompt_seed);
      } else if (flag == "l" || flag == "cfg") {
        number(item.guidance_scale);
      } else if (flag == "s" || flag == "steps") {
        number(item.sample_steps);
      } else if (flag == "m" || flag == "network_multiplier") {
        number(item.network_multiplier);
      } else if (flag == "ctrl_img") {
        item.ctrl_img = value;
      } else if (flag == "ctrl_idx") {
        number(item.ctrl_idx);
      } else if (flag == "frames" || flag == "num_frames") {  // config_modules.py:1446-1451
        number(item.num_frames);
      } else if (flag == "fps") {
        number(item.fps);
      } else if (flag == "p2" || flag == "n2" || flag == "gr" || flag == "a" || flag == "ref" || flag == "ev" ||
                 flag == "extra_values") {
        warning(where, "--" + flag + " is an AI Toolkit prompt flag gclab does not act on (SDXL, adapters)");
      } else {
        warning(where, "--" + flag + " is not a prompt flag AI Toolkit knows; ignored, as AI Toolkit ignores it");
      }
    }
  }

  void sample() {
    if (!c_.sample) return;
    SampleConfig& s = *c_.sample;
    at_least("sample.sample_every", s.sample_every, 1);
    at_least("sample.sample_start_step", s.sample_start_step, 0);
    at_least("sample.width", s.width, 1);
    at_least("sample.height", s.height, 1);
    at_least("sample.sample_steps", s.sample_steps, 1);
    at_least("sample.num_frames", s.num_frames, 1);
    at_least("sample.fps", s.fps, 1);
    at_least("sample.vae_tile_size", s.vae_tile_size, 64);
    if (s.vae_tile_size % 8 != 0)
      error("sample.vae_tile_size",
            std::to_string(s.vae_tile_size) + " is not a multiple of 8 (the autoencoder's 8x down-sampling)");
    if (s.format != "jpg" && s.format != "png" && s.format != "webp")  // AI Toolkit's ImgExt (config_modules.py:13)
      error("sample.format", "'" + s.format + "' is not one of jpg, png, webp");
    // AI Toolkit: `prompts` is the legacy spelling of `samples` items; `samples` wins when both exist.
    if (s.samples.empty()) {
      for (const auto& p : s.prompts) {
        SampleItem item;
        item.prompt = p;
        s.samples.push_back(item);
      }
    }
    s.prompts.clear();
    for (std::size_t i = 0; i < s.samples.size(); ++i) {
      SampleItem& item = s.samples[i];
      const std::string p = "sample.samples[" + std::to_string(i) + "]";
      // AI Toolkit's sample(): with a trigger_word, "[trigger]" becomes it, never added where absent
      // (inject_trigger_into_prompt, add_if_not_present=False); without one the text stays. ("[name]", which
      // it replaces too, is already the config's name, as in AI Toolkit's config loading.)
      if (c_.trigger_word)
        for (std::size_t at; (at = item.prompt.find("[trigger]")) != std::string::npos;)
          item.prompt.replace(at, std::string("[trigger]").size(), *c_.trigger_word);
      prompt_flags(item, p);
      if (!item.width) item.width = s.width;
      if (!item.height) item.height = s.height;
      if (!item.neg) item.neg = s.neg;
      if (!item.guidance_scale) item.guidance_scale = s.guidance_scale;
      if (!item.sample_steps) item.sample_steps = s.sample_steps;
      if (!item.network_multiplier) item.network_multiplier = s.network_multiplier;
      at_least(p + ".width", *item.width, 1);
      at_least(p + ".height", *item.height, 1);
      at_least(p + ".sample_steps", *item.sample_steps, 1);
    }
  }

  ProcessConfig& c_;
  Diagnostics& d_;
  const LoadOptions& options_;
};

// When the YAML itself does not parse, the arch it names (if any) still tells the caller whether fixing
// it would lead anywhere.
std::string arch_named_in_text(const std::string& text) {
  static const std::regex arch_line(R"(^\s*arch:\s*['"]?([A-Za-z0-9_\-]+))");
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, arch_line)) return m[1];
  }
  return "";
}

// ---------------------------------------------------------------------------------------------
// Resolved YAML writer: the same field lists, written out.
void write_value(YAML::Emitter& out, const std::string& v) { out << YAML::DoubleQuoted << v; }
void write_value(YAML::Emitter& out, bool v) { out << (v ? "true" : "false"); }
void write_value(YAML::Emitter& out, double v) {
  // The shortest spelling that reads back to the same double (0.05, not 0.050000000000000003).
  std::string text;
  for (int precision = 6; precision <= 17; ++precision) {
    std::ostringstream s;
    s.precision(precision);
    s << v;
    text = s.str();
    if (std::strtod(text.c_str(), nullptr) == v) break;
  }
  // Keep it a float for readers that type by spelling (PyYAML reads 1e-04 as text without a dot).
  if (text.find_first_of(".eEn") == std::string::npos)
    text += ".0";
  else if (text.find('.') == std::string::npos && text.find('e') != std::string::npos) {
    const std::size_t e = text.find('e');
    text = text.substr(0, e) + ".0" + text.substr(e);
  }
  out << text;
}
void write_value(YAML::Emitter& out, const ByteSize& v) { out << format_bytes_exact(v.bytes); }
void write_value(YAML::Emitter& out, const ckpt::CheckpointPolicy& v) { out << YAML::DoubleQuoted << v.to_string(); }
template <class T>
std::enable_if_t<std::is_enum_v<T>> write_value(YAML::Emitter& out, T v) {
  out << YAML::DoubleQuoted << std::string(name_of(v));
}
template <class T>
std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>> write_value(YAML::Emitter& out, T v) {
  out << static_cast<long long>(v);
}
template <class T>
void write_value(YAML::Emitter& out, const std::optional<T>& v);
template <class T>
void write_value(YAML::Emitter& out, const std::vector<T>& v);

// A block with its own field list (written as a mapping); everything else is a value.
template <class T>
constexpr bool is_block_v =
    std::is_class_v<T> && !std::is_same_v<T, std::string> && !std::is_same_v<T, ByteSize> &&
    !std::is_same_v<T, ckpt::CheckpointPolicy> && !is_optional<T>::value && !is_vector<T>::value;

struct BlockWriter {
  YAML::Emitter& out;
  template <class T>
  void operator()(const char* key, const T& value) {
    out << YAML::Key << key << YAML::Value;
    if constexpr (is_block_v<T>) {
      out << YAML::BeginMap;
      const_cast<T&>(value).fields(*this);
      out << YAML::EndMap;
    } else {
      write_value(out, value);
    }
  }
  void ignore(std::initializer_list<const char*>) {}
};

template <class T>
void write_item(YAML::Emitter& out, const T& v) {
  if constexpr (is_block_v<T>) {
    BlockWriter w{out};
    out << YAML::BeginMap;
    const_cast<T&>(v).fields(w);
    out << YAML::EndMap;
  } else {
    write_value(out, v);
  }
}

template <class T>
void write_value(YAML::Emitter& out, const std::optional<T>& v) {
  if (v)
    write_item(out, *v);
  else
    out << YAML::Null;
}
template <class T>
void write_value(YAML::Emitter& out, const std::vector<T>& v) {
  const bool flow = std::is_arithmetic_v<T> || v.empty();
  out << (flow ? YAML::Flow : YAML::Block) << YAML::BeginSeq;
  for (const auto& item : v) write_item(out, item);
  out << YAML::EndSeq;
}

// model.qtype "qtype|ADAPTER": the accuracy-recovery adapter after the bar goes to
// model.accuracy_recovery_adapter and the qtype before it is read as a QType (AI Toolkit's ModelConfig splits
// it the same way). AI Toolkit reads no adapter for the text encoders: its qtype_te goes to the quantizer
// whole, and fails there.
void split_qtype_adapter(YAML::Node process, LoadContext& ctx) {
  YAML::Node model = process["model"];
  if (!model.IsMap()) return;
  if (const YAML::Node te = model["qtype_te"]; te.IsScalar() && te.Scalar().find('|') != std::string::npos) {
    ctx.error("model.qtype_te", te,
              "'" + te.Scalar() +
                  "': an accuracy-recovery adapter applies to the transformer only (model.qtype); AI Toolkit would "
                  "fail on this qtype");
    model.remove("qtype_te");
  }
  const YAML::Node qtype = model["qtype"];
  if (!qtype.IsScalar()) return;
  const std::string text = qtype.Scalar();
  const size_t bar = text.find('|');
  if (bar == std::string::npos) return;
  if (bar + 1 == text.size()) {
    ctx.error("model.qtype", qtype, "names no adapter after '|'");
    model.remove("qtype");
    return;
  }
  model["accuracy_recovery_adapter"] = text.substr(bar + 1);
  model["qtype"] = text.substr(0, bar);
}

}  // namespace

std::vector<std::string> offloading_qtypes(ModelConfig& m) {
  std::vector<std::string> changed;
  if (!m.layer_offloading) return changed;
  for (auto [path, qtype] : {std::pair<const char*, QType*>{"model.qtype", &m.qtype}, {"model.qtype_te", &m.qtype_te}})
    if (*qtype == QType::qfloat8) {
      *qtype = QType::float8;
      changed.emplace_back(path);
    }
  return changed;
}

std::string SourceMap::where(const std::string& path) const {
  // A value that was never written (a missing required key) is reported where its block was written.
  for (std::string p = path; !p.empty();) {
    const auto it = origin_by_path.find(p);
    if (it != origin_by_path.end()) return it->second;
    const std::size_t cut = p.find_last_of(".[");
    p = cut == std::string::npos ? "" : p.substr(0, cut);
  }
  return "";
}

namespace {

// The text's YAML root, a mapping; nothing where it is not one (the reason in result's diagnostics): its size,
// NUL bytes, its nesting, the YAML itself, what its aliases expand to.
std::optional<YAML::Node> parse_root(const std::string& text, const std::string& source_name,
                                     const LoadOptions& options, LoadResult& result) {
  Diagnostics& diag = result.diagnostics;
  if (text.size() > options.max_bytes) {
    diag.error("", source_name,
               "is " + std::to_string(text.size()) + " bytes; a config is at most " +
                   std::to_string(options.max_bytes) + " (is this the right file?)");
    return std::nullopt;
  }
  if (text.find('\0') != std::string::npos) {
    diag.error("", source_name, "contains NUL bytes; it is not a YAML text file");
    return std::nullopt;
  }
  if (raw_nesting_depth(text) > kMaxNestingDepth) {
    diag.error(
        "", source_name,
        "nests deeper than " + std::to_string(kMaxNestingDepth) + " levels; a training config is a few levels deep");
    return std::nullopt;
  }

  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    const std::string where = source_name + (e.mark.is_null() ? "" : ":" + std::to_string(e.mark.line + 1));
    diag.error("", where, "is not valid YAML: " + e.msg);
    result.arch_in_text = arch_named_in_text(text);
    return std::nullopt;
  } catch (const std::exception& e) {
    diag.error("", source_name, std::string("could not be read as YAML: ") + e.what());
    return std::nullopt;
  }
  std::size_t visited = 0;
  if (!within_node_budget(root, visited)) {
    diag.error("", source_name,
               "expands to more than " + std::to_string(kMaxNodesVisited) +
                   " values (deeply nested or aliases that multiply); refusing to read it");
    return std::nullopt;
  }
  if (!root.IsMap()) {
    diag.error("", source_name,
               "must be a YAML mapping with AI Toolkit's `job`/`config` keys or the "
               "blocks (`train`, `model`, `datasets`, ...) at the top level; got " +
                   describe(root));
    return std::nullopt;
  }
  return root;
}

// The process block: in AI Toolkit's shape (job / config {name, process: [...]} / meta) its first process,
// given the config's name and a vram_cap written beside `job`; else the root itself without `meta` and `job`.
// Nothing where config.process is not a list of blocks (said in diag).
std::optional<YAML::Node> process_block(const YAML::Node& root, Diagnostics& diag) {
  YAML::Node process;
  const YAML::Node config_block = root["config"];
  const bool aitk_shape = config_block.IsDefined() && config_block.IsMap() && config_block["process"].IsDefined();
  if (!aitk_shape) {
    process.reset(root);
    process.remove("meta");
    if (process["job"].IsDefined()) process.remove("job");
    return process;
  }
  for (const auto& kv : root) {
    const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : "";
    if (key == "job") {
      if (!kv.second.IsScalar() || kv.second.Scalar() != "extension")
        diag.warning("job", line_of(kv.second),
                     "gclab runs the `extension` job's first process; got " + describe(kv.second));
    } else if (key != "config" && key != "meta" && key != "vram_cap") {
      diag.warning(key, line_of(kv.first), "unknown top-level key, ignored");
    }
  }
  for (const auto& kv : config_block) {
    const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : "";
    if (key != "name" && key != "process") diag.warning("config." + key, line_of(kv.first), "unknown key, ignored");
  }
  const YAML::Node processes = config_block["process"];
  if (!processes.IsSequence() || processes.size() == 0 || !processes[0].IsMap()) {
    diag.error("config.process", line_of(processes), "must be a list with at least one process block");
    return std::nullopt;
  }
  if (processes.size() > 1)
    diag.warning("config.process", line_of(processes),
                 "has " + std::to_string(processes.size()) + " processes; gclab runs the first");
  process.reset(processes[0]);  // edited in place: a clone would lose the line numbers
  const YAML::Node name_node = config_block["name"];
  if (!process["name"].IsDefined() && name_node.IsDefined()) process["name"] = name_node;
  // vram_cap may stand beside `job` at the top of the file: it belongs to the whole run.
  if (root["vram_cap"].IsDefined() && !process["vram_cap"].IsDefined()) process["vram_cap"] = root["vram_cap"];
  return process;
}

// gclab: train.gradient_checkpointing: auto reads as checkpoint_policy: auto (AI Toolkit's key takes a bool;
// an explicit checkpoint_policy still wins).
void gradient_checkpointing_auto(YAML::Node process) {
  YAML::Node train = process["train"];
  if (!train.IsMap()) return;
  const YAML::Node gc = train["gradient_checkpointing"];
  if (!gc.IsScalar() || gc.Scalar() != "auto") return;
  train["gradient_checkpointing"] = true;
  if (!train["checkpoint_policy"].IsDefined()) train["checkpoint_policy"] = "auto";
}

}  // namespace

LoadResult load_config_text(const std::string& text, const std::string& source_name, const LoadOptions& options) {
  LoadResult result;
  Diagnostics& diag = result.diagnostics;
  const std::optional<YAML::Node> root = parse_root(text, source_name, options, result);
  if (!root) return result;
  ProcessConfig cfg;
  LoadContext ctx{diag, result.ignored, cfg.source, {}};
  try {
    YAML::Node meta;
    if ((*root)["meta"].IsDefined()) meta.reset((*root)["meta"]);
    const std::optional<YAML::Node> found = process_block(*root, diag);
    if (!found) return result;
    YAML::Node process = *found;
    std::string name;
    for (const auto& o : options.overrides) apply_override(process, o, ctx);
    if (diag.has_errors()) return result;

    if (process["name"].IsDefined() && process["name"].IsScalar()) name = process["name"].Scalar();
    substitute(process, name, "", ctx);
    if (meta.IsDefined()) substitute(meta, name, "meta", ctx);

    split_qtype_adapter(process, ctx);
    gradient_checkpointing_auto(process);
    read_value(process, cfg, "", ctx);
    if (meta.IsDefined() && !meta.IsNull()) {
      YAML::Emitter out;
      out << meta;
      cfg.meta_yaml = out.c_str();
    }
  } catch (const std::exception& e) {
    diag.error("", source_name, std::string("could not be read: ") + e.what());
    return result;
  }

  Validator(cfg, diag, options).run();
  if (!diag.has_errors())
    result.config = std::move(cfg);
  else
    result.as_read = std::move(cfg);
  return result;
}

LoadResult load_config_file(const std::string& path, const LoadOptions& options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    LoadResult result;
    result.diagnostics.error("", path, "cannot be opened (does the file exist and is it readable?)");
    return result;
  }
  std::string text;
  std::vector<char> buffer(1 << 16);
  while (in.read(buffer.data(), static_cast<std::streamsize>(buffer.size())) || in.gcount() > 0) {
    text.append(buffer.data(), static_cast<std::size_t>(in.gcount()));
    if (text.size() > options.max_bytes) break;
  }
  return load_config_text(text, path, options);
}

std::string to_yaml(const ProcessConfig& config) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  BlockWriter writer{out};
  const_cast<ProcessConfig&>(config).fields(writer);
  if (!config.meta_yaml.empty()) {
    out << YAML::Key << "meta" << YAML::Value << YAML::Load(config.meta_yaml);
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace gclab::config
