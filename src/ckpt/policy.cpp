#include "gclab/ckpt/policy.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <sstream>
#include <stdexcept>

namespace gclab::ckpt {

namespace {

const char* kGrammar =
    "use off, full, every:N, first:K, blocks:[i,j,...], selective:attn, selective:mlp, selective:ops, offload, "
    "budget:BYTES "
    "(e.g. budget:20GiB), auto, auto:MARGIN (auto:2GiB, auto:10%) or modes:[MODE,...] (one per block: none, full, "
    "offload, attn, mlp, ops; full*4 for four)";

[[noreturn]] void fail(const std::string& text, const std::string& why) {
  throw std::invalid_argument("checkpoint policy '" + text + "': " + why + "; " + kGrammar);
}

int parse_count(const std::string& text, const std::string& digits, int minimum) {
  if (digits.empty() ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }) ||
      digits.size() > 9)
    fail(text, "'" + digits + "' is not a whole number");
  const int value = std::stoi(digits);
  if (value < minimum) fail(text, "the number must be at least " + std::to_string(minimum));
  return value;
}

// Bytes with binary (KiB..TiB) or decimal (KB..TB) units; no dependency on gclab's config part.
std::int64_t parse_bytes(const std::string& text, const std::string& value) {
  char* end = nullptr;
  const double number = std::strtod(value.c_str(), &end);
  if (end == value.c_str() || !(number > 0) || !std::isfinite(number)) fail(text, "'" + value + "' is not a size");
  std::string unit(end);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::pair<const char*, double> units[] = {
      {"", 1},     {"b", 1},    {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0},
      {"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9},     {"tb", 1e12}};
  for (const auto& [name, scale] : units)
    if (unit == name) return static_cast<std::int64_t>(std::llround(number * scale));
  fail(text, "unknown unit '" + unit + "'");
}

// modes:[full*2,none,attn]'s list.
std::vector<BlockMode> parse_modes(const std::string& text, const std::string& arg) {
  if (arg.size() < 3 || arg.front() != '[' || arg.back() != ']')
    fail(text, "modes takes a list like [full*2,none,attn]");
  const std::string inner = arg.substr(1, arg.size() - 2);
  std::vector<BlockMode> modes;
  std::size_t start = 0;
  while (start <= inner.size()) {
    const std::size_t comma = inner.find(',', start);
    const std::string item = inner.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const std::size_t star = item.find('*');
    const std::string name = item.substr(0, star);
    const int count = star == std::string::npos ? 1 : parse_count(text, item.substr(star + 1), 1);
    std::optional<BlockMode> mode;
    for (BlockMode m : {BlockMode::None, BlockMode::Full, BlockMode::Offload, BlockMode::SelectiveAttn,
                        BlockMode::SelectiveMlp, BlockMode::SelectiveOps})
      if (name == short_name(m)) mode = m;
    if (!mode) fail(text, "'" + name + "' is not a block mode (none, full, offload, attn, mlp, ops)");
    if (modes.size() + static_cast<std::size_t>(count) > 100000) fail(text, "too many blocks");
    modes.insert(modes.end(), static_cast<std::size_t>(count), *mode);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return modes;
}

// auto's margin: a size, or a percentage of the cap below 100.
void parse_margin(const std::string& text, const std::string& arg, CheckpointPolicy& p) {
  if (arg.empty()) return;
  if (arg.back() != '%') {
    p.margin_bytes = parse_bytes(text, arg);
    return;
  }
  char* end = nullptr;
  const std::string number = arg.substr(0, arg.size() - 1);
  const double percent = std::strtod(number.c_str(), &end);
  if (number.empty() || *end != '\0' || !(percent >= 0) || !(percent < 100))
    fail(text, "'" + arg + "' is not a percentage of the cap below 100%");
  p.margin_fraction = percent / 100;
}

}  // namespace

std::string short_name(BlockMode mode) {
  switch (mode) {
    case BlockMode::SelectiveAttn:
      return "attn";
    case BlockMode::SelectiveMlp:
      return "mlp";
    case BlockMode::SelectiveOps:
      return "ops";
    default:
      return to_string(mode);
  }
}

const char* to_string(BlockMode mode) {
  switch (mode) {
    case BlockMode::None:
      return "none";
    case BlockMode::Full:
      return "full";
    case BlockMode::Offload:
      return "offload";
    case BlockMode::SelectiveAttn:
      return "selective:attn";
    case BlockMode::SelectiveMlp:
      return "selective:mlp";
    case BlockMode::SelectiveOps:
      return "selective:ops";
  }
  return "?";
}

CheckpointPolicy CheckpointPolicy::only_blocks(std::vector<int> blocks) {
  std::sort(blocks.begin(), blocks.end());
  blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
  CheckpointPolicy p = blocks.empty() ? off() : of(Kind::Blocks);
  p.blocks = std::move(blocks);
  return p;
}

CheckpointPolicy CheckpointPolicy::per_block(std::vector<BlockMode> modes) {
  auto all = [&](BlockMode m) { return std::all_of(modes.begin(), modes.end(), [&](BlockMode x) { return x == m; }); };
  if (all(BlockMode::None)) return off();
  if (all(BlockMode::Full)) return full();
  CheckpointPolicy p = of(Kind::Modes);
  p.modes = std::move(modes);
  return p;
}

std::int64_t CheckpointPolicy::margin_of(std::int64_t cap_bytes) const {
  if (margin_bytes >= 0) return margin_bytes;
  const double fraction = margin_fraction >= 0 ? margin_fraction : kAutoMarginFraction;
  return static_cast<std::int64_t>(std::llround(fraction * static_cast<double>(cap_bytes)));
}

CheckpointPolicy CheckpointPolicy::parse(const std::string& text) {
  std::string s;
  for (char c : text)
    if (!std::isspace(static_cast<unsigned char>(c))) s += c;
  CheckpointPolicy p;
  const std::size_t colon = s.find(':');
  const std::string head = s.substr(0, colon);
  const std::string arg = colon == std::string::npos ? "" : s.substr(colon + 1);
  const bool has_arg = colon != std::string::npos;
  if ((head == "off" || head == "none" || head == "full" || head == "offload") && has_arg)
    fail(text, "'" + head + "' takes no argument");
  if (head == "off" || head == "none")
    p.kind = Kind::Off;
  else if (head == "full")
    p.kind = Kind::Full;
  else if (head == "offload")
    p.kind = Kind::Offload;
  else if (head == "every")
    p.kind = Kind::EveryN, p.n = parse_count(text, arg, 1);
  else if (head == "first")
    p.kind = Kind::FirstK, p.n = parse_count(text, arg, 0);
  else if (head == "selective") {
    if (arg == "attn")
      p.kind = Kind::SelectiveAttn;
    else if (arg == "mlp")
      p.kind = Kind::SelectiveMlp;
    else if (arg == "ops")
      p.kind = Kind::SelectiveOps;
    else
      fail(text, "selective takes attn, mlp or ops");
  } else if (head == "budget") {
    p.kind = Kind::Budget;
    p.budget_bytes = parse_bytes(text, arg);
  } else if (head == "auto") {
    p.kind = Kind::Auto;
    parse_margin(text, arg, p);
  } else if (head == "modes") {
    p = per_block(parse_modes(text, arg));
  } else if (head == "blocks") {
    if (arg.size() < 2 || arg.front() != '[' || arg.back() != ']') fail(text, "blocks takes a list like [0,2,5]");
    p.kind = Kind::Blocks;
    const std::string inner = arg.substr(1, arg.size() - 2);
    std::size_t start = 0;
    while (start <= inner.size() && !inner.empty()) {
      const std::size_t comma = inner.find(',', start);
      p.blocks.push_back(parse_count(text, inner.substr(start, comma - start), 0));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    std::sort(p.blocks.begin(), p.blocks.end());
    p.blocks.erase(std::unique(p.blocks.begin(), p.blocks.end()), p.blocks.end());
  } else {
    fail(text, "unknown policy");
  }
  return p;
}

std::string CheckpointPolicy::to_string() const {
  switch (kind) {
    case Kind::Off:
      return "off";
    case Kind::Full:
      return "full";
    case Kind::Offload:
      return "offload";
    case Kind::EveryN:
      return "every:" + std::to_string(n);
    case Kind::FirstK:
      return "first:" + std::to_string(n);
    case Kind::SelectiveAttn:
      return "selective:attn";
    case Kind::SelectiveMlp:
      return "selective:mlp";
    case Kind::SelectiveOps:
      return "selective:ops";
    case Kind::Budget:
      return "budget:" + std::to_string(budget_bytes);
    case Kind::Auto:
      if (margin_bytes >= 0) return "auto:" + std::to_string(margin_bytes);
      if (margin_fraction >= 0) {
        std::ostringstream percent;
        percent << margin_fraction * 100 << "%";
        return "auto:" + percent.str();
      }
      return "auto";
    case Kind::Modes: {
      std::string out = "modes:[";
      for (std::size_t i = 0; i < modes.size();) {
        std::size_t j = i;
        while (j < modes.size() && modes[j] == modes[i]) ++j;
        out += (i ? "," : "") + short_name(modes[i]) + (j - i > 1 ? "*" + std::to_string(j - i) : "");
        i = j;
      }
      return out + "]";
    }
    case Kind::Blocks: {
      std::string out = "blocks:[";
      for (std::size_t i = 0; i < blocks.size(); ++i) out += (i ? "," : "") + std::to_string(blocks[i]);
      return out + "]";
    }
  }
  return "?";
}

BlockMode CheckpointPolicy::mode_for(int index, int num_blocks) const {
  switch (kind) {
    case Kind::Off:
      return BlockMode::None;
    case Kind::Full:
      return BlockMode::Full;
    case Kind::Offload:
      return BlockMode::Offload;
    // every:N checkpoints blocks 0, N, 2N, ... (torchtitan's selective "every N layers" counts the same way)
    case Kind::EveryN:
      return index % n == 0 ? BlockMode::Full : BlockMode::None;
    case Kind::FirstK:
      return index < n ? BlockMode::Full : BlockMode::None;
    case Kind::Blocks:
      return std::binary_search(blocks.begin(), blocks.end(), index) ? BlockMode::Full : BlockMode::None;
    case Kind::SelectiveAttn:
      return BlockMode::SelectiveAttn;
    case Kind::SelectiveMlp:
      return BlockMode::SelectiveMlp;
    case Kind::SelectiveOps:
      return BlockMode::SelectiveOps;
    case Kind::Modes:
      if (static_cast<int>(modes.size()) != num_blocks)
        throw std::invalid_argument("checkpoint policy '" + to_string() + "' names " + std::to_string(modes.size()) +
                                    " blocks; the model has " + std::to_string(num_blocks));
      return modes[static_cast<std::size_t>(index)];
    case Kind::Budget:
    case Kind::Auto:
      throw std::logic_error("checkpoint policy '" + to_string() +
                             "' is resolved from the walk (select_blocks_for_budget, MemoryModel::auto_plan) first");
  }
  return BlockMode::None;
}

std::vector<int> select_blocks_for_budget(const std::vector<std::int64_t>& activation_bytes,
                                          const std::vector<std::int64_t>& input_bytes, std::int64_t budget_bytes) {
  if (activation_bytes.size() != input_bytes.size())
    throw std::invalid_argument("select_blocks_for_budget: one input size per block is needed");
  std::int64_t kept = std::accumulate(activation_bytes.begin(), activation_bytes.end(), std::int64_t{0});
  std::vector<int> order(activation_bytes.size());
  std::iota(order.begin(), order.end(), 0);
  // Largest saving first; ties by index so the choice is stable.
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return activation_bytes[a] - input_bytes[a] > activation_bytes[b] - input_bytes[b];
  });
  std::vector<int> chosen;
  for (int i : order) {
    if (kept <= budget_bytes) break;
    if (activation_bytes[i] <= input_bytes[i]) continue;  // checkpointing it saves nothing
    kept -= activation_bytes[i] - input_bytes[i];
    chosen.push_back(i);
  }
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

}  // namespace gclab::ckpt
