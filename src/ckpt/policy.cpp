#include "gclab/ckpt/policy.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <stdexcept>

namespace gclab::ckpt {

namespace {

const char* kGrammar =
    "use off, full, every:N, first:K, blocks:[i,j,...], selective:attn, selective:mlp, offload or budget:BYTES "
    "(e.g. budget:20GiB)";

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

}  // namespace

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
    else
      fail(text, "selective takes attn or mlp");
  } else if (head == "budget") {
    p.kind = Kind::Budget;
    p.budget_bytes = parse_bytes(text, arg);
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
    case Kind::Budget:
      return "budget:" + std::to_string(budget_bytes);
    case Kind::Blocks: {
      std::string out = "blocks:[";
      for (std::size_t i = 0; i < blocks.size(); ++i) out += (i ? "," : "") + std::to_string(blocks[i]);
      return out + "]";
    }
  }
  return "?";
}

BlockMode CheckpointPolicy::mode_for(int index, int num_blocks) const {
  (void)num_blocks;
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
    case Kind::Budget:
      throw std::logic_error("a budget policy is resolved from measurements (select_blocks_for_budget) first");
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
