// The phases of a run whose memory peaks gclab records and predicts (docs/memory-model.md): the meter keys
// its peaks by them, and a prediction names the same values, so predicted and measured stand side by side.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace gclab::memory {

// `cache`: filling the latent and text caches before the first step (AI Toolkit's device states while it
// caches: the transformer off the device).
enum class Phase { setup, cache, data, text, forward, backward, optimizer, sample, save };
inline constexpr std::array<Phase, 9> kPhases = {Phase::setup,     Phase::cache,   Phase::data,
                                                 Phase::text,      Phase::forward, Phase::backward,
                                                 Phase::optimizer, Phase::sample,  Phase::save};
// "setup", "data", ... as the metrics and reports write them.
const char* phase_name(Phase phase);
std::optional<Phase> parse_phase(std::string_view name);

// Per-phase bytes keyed by phase_name, as metrics.jsonl, memory.json and the reports write them.
inline std::map<std::string, std::int64_t> by_phase_name(const std::map<Phase, std::int64_t>& bytes) {
  std::map<std::string, std::int64_t> out;
  for (const auto& [phase, b] : bytes) out[phase_name(phase)] = b;
  return out;
}

}  // namespace gclab::memory
