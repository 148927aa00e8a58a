#include "gclab/model/quantize.h"

#include <fnmatch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <stdexcept>

#include "gclab/config/byte_size.h"
#include "gclab/model/family.h"
#include "gclab/model/lora.h"
#include "gclab/model/registry.h"

namespace gclab::model {

std::optional<WeightStorage> quantized_storage(config::QType qtype) {
  switch (qtype) {
    case config::QType::qfloat8:
      return WeightStorage::QFloat8;
    case config::QType::float8:
      return WeightStorage::Float8;
    case config::QType::int8:
      return WeightStorage::Int8;
    case config::QType::uint8:
      return std::nullopt;
    default:
      return nn::parse_weight_storage(std::string(config::name_of(qtype)));
  }
}

bool quantized_by(const config::QuantizeKwargs& filter, const std::string& module) {
  auto named = [&](const std::vector<std::string>& patterns) {
    return std::any_of(patterns.begin(), patterns.end(),
                       [&](const std::string& p) { return ::fnmatch(p.c_str(), module.c_str(), 0) == 0; });
  };
  return !named(filter.exclude) && (filter.include.empty() || named(filter.include));
}

BaseQuantization quantize_base(DiffusionTransformer& model, const config::ModelConfig& config) {
  BaseQuantization q;
  if (!config.quantize) return q;
  const std::optional<WeightStorage> storage = quantized_storage(config.qtype);
  const config::QuantizeKwargs filter = family_of(model.spec().family).quantization_filter(config);
  std::vector<std::pair<std::string, Linear>> linears;
  for (auto& [path, linear] : named_linears(model)) {
    if (quantized_by(filter, path))
      linears.emplace_back(path, linear);
    else
      ++q.kept;
  }
  torch::NoGradGuard no_grad;
  if (!config.accuracy_recovery_adapter) {
    if (storage) {
      q.memory = nn::store_weights(linears, *storage);
      for (auto& [path, linear] : linears) q.quantized += linear->weight_storage() == *storage;
    }
    return q;
  }
  q.adapter = *config.accuracy_recovery_adapter;
  std::error_code ec;
  const std::filesystem::path file(q.adapter);
  q.adapter_from_file = std::filesystem::is_regular_file(file, ec);
  std::map<std::string, LoraFileModule> adapters;
  if (q.adapter_from_file) {
    adapters = read_lora_file(model, file).modules;
  } else {
    std::set<std::string> in_blocks;
    for (size_t b = 0; b < model.blocks().size(); ++b)
      for (auto& [path, linear] : named_linears(*model.blocks()[b]))
        in_blocks.insert(model.block_names()[b] + "." + path);
    for (auto& [path, linear] : linears) {
      if (!in_blocks.count(path)) continue;
      const auto o = linear->weight.options();
      const auto shape = linear->weight_shape();
      const double bound = 1.0 / std::sqrt(static_cast<double>(shape[1]));
      LoraFileModule& a = adapters[path];
      a.down = o.device().is_meta() ? torch::empty({kRecoveryAdapterRank, shape[1]}, o)
                                    : torch::empty({kRecoveryAdapterRank, shape[1]}, o).uniform_(-bound, bound);
      a.up = torch::zeros({shape[0], kRecoveryAdapterRank}, o);
    }
  }
  // Every adapter's matrices are held from here on (a file's in its own dtype; a conversion to the base's
  // is a copy this walk does not count), before the first Linear is quantized.
  int64_t held = 0;
  for (const auto& [path, a] : adapters) held += static_cast<int64_t>(a.down.nbytes() + a.up.nbytes());
  q.memory.add({held, held});
  for (auto& [path, linear] : linears) {
    const auto it = adapters.find(path);
    if (it == adapters.end()) continue;  // "uint8": left in its dtype
    const auto dtype = linear->weight.scalar_type();
    linear->add_recovery_adapter(it->second.down.to(dtype), it->second.up.to(dtype), 1.0);
    q.adapter_rank = std::max(q.adapter_rank, it->second.down.size(0));
    const int64_t adapter_bytes = static_cast<int64_t>(it->second.down.numel() + it->second.up.numel()) *
                                  static_cast<int64_t>(c10::elementSize(dtype));
    q.adapter_bytes += adapter_bytes;
    ++q.adapters;
    if (storage) {
      q.memory.add(nn::store_weight(*linear, *storage));
      q.quantized += linear->weight_storage() == *storage;
    }
  }
  return q;
}

std::vector<std::optional<WeightStorage>> text_encoder_storage(const config::ModelConfig& config,
                                                               const ModelSpec& spec) {
  const std::vector<config::TextEncoderKind> kinds = text_encoders(spec);
  const TextEncoderQuantization rule = text_encoder_quantization(spec);
  std::vector<std::optional<WeightStorage>> out(kinds.size());
  if (!(rule.under_quantize ? config.quantize : config.quantize_te.value_or(config.quantize))) return out;
  const std::optional<WeightStorage> storage = quantized_storage(rule.as_qtype_te ? config.qtype_te : config.qtype);
  for (size_t i = 0; i < kinds.size(); ++i)
    if (!rule.t5_only || kinds[i] == config::TextEncoderKind::t5_xxl) out[i] = storage;
  return out;
}

std::string describe_text_encoder_storage(const config::ModelConfig& config, const ModelSpec& spec) {
  const auto storage = text_encoder_storage(config, spec);
  const std::vector<config::TextEncoderKind> kinds = text_encoders(spec);
  std::string out;
  for (size_t i = 0; i < storage.size(); ++i)
    if (storage[i])
      out += (out.empty() ? "" : ", ") + std::string(config::name_of(kinds[i])) + "'s Linears as " +
             nn::to_string(*storage[i]);
  return out.empty() ? "the training dtype" : out;
}

std::string describe(const BaseQuantization& q, const config::ModelConfig& config) {
  if (!config.quantize) return "base weights unquantized (model.quantize: false)";
  std::string s = std::to_string(q.quantized) + " Linears stored as " + std::string(config::name_of(config.qtype));
  if (q.kept > 0) s += " (" + std::to_string(q.kept) + " left in their dtype by the arch's exclusions)";
  if (q.quantized == 0)
    s = "no Linear quantized (" + std::string(config::name_of(config.qtype)) +
        " leaves weights in their dtype, as in AI Toolkit)";
  if (q.adapter.empty()) return s;
  s += "; accuracy-recovery adapter on " + std::to_string(q.adapters) + " of them, rank " +
       std::to_string(q.adapter_rank) + ", " + config::format_bytes(q.adapter_bytes) + " (" +
       (q.adapter_from_file ? "loaded from " + q.adapter
                            : "'" + q.adapter + "' is not a local file (gclab fetches nothing): built at rank " +
                                  std::to_string(kRecoveryAdapterRank) +
                                  " on the blocks' Linears with a zero up-projection — its memory is exact, its "
                                  "correction none") +
       "); the other Linears stay in their dtype (AI Toolkit quantizes them as uint8, a no-op)";
  return s;
}

}  // namespace gclab::model
