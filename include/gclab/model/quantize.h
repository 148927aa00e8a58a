// The transformer's frozen base weights as AI Toolkit's quantize_model stores them (toolkit/util/quantize.py):
// the one place model.quantize / qtype / accuracy_recovery_adapter become weight storage, for the run, the
// meta builds behind estimate / check / the OOM report, `gclab forward` and the model summary alike.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gclab/config/config.h"
#include "gclab/model/transformer.h"

namespace gclab::model {

// How a qtype (model.qtype / qtype_te) stores a Linear weight: qfloat8, float8 and
// int8 as their libraries do (quant/scaled.h); uint2 ... uint7 packed (quant/uintx.h); nullopt for uint8, which AI
// Toolkit leaves unquantized (torchao 0.10's uint8 path raised before touching the module, and its own
// reproduction keeps refusing it: toolkit/util/uintx_quant.py).
std::optional<WeightStorage> quantized_storage(config::QType qtype);

// The rank of a recovery adapter built at random: ostris/accuracy_recovery_adapters' README ("the sweet
// spot ... for Qwen-Image is 3 bit quantization with a rank 16 adapter").
constexpr int64_t kRecoveryAdapterRank = 16;

struct BaseQuantization {
  int quantized = 0;         // Linears stored as model.qtype
  int kept = 0;              // Linears left in their dtype by the arch's exclusions (quantization_filter)
  int adapters = 0;          // Linears with an accuracy-recovery adapter
  int64_t adapter_rank = 0;  // 0 without one
  int64_t adapter_bytes = 0;
  bool adapter_from_file = false;
  std::string adapter;  // model.accuracy_recovery_adapter as given
  // What quantizing held above the unquantized model (its highest: one Linear's quantization on top of
  // what the earlier ones freed, the adapters included) and what it left: a load's memory walk.
  nn::StorageChange memory;
};

// Whether a Linear of this module name is quantized under `filter` (the family's quantization_filter, registry.h):
// named by no exclude pattern and, when there are include patterns, by one of them (fnmatch, as
// toolkit/util/quantize.py:165-175 matches them).
bool quantized_by(const config::QuantizeKwargs& filter, const std::string& module);

// Applies model.quantize to a built transformer (nothing when it is false), as AI Toolkit's quantize_model:
//  - without an accuracy-recovery adapter, every Linear the arch quantizes (quantized_by its
//    quantization_filter: model.quantize_kwargs, or Z-Image's own exclusions) as model.qtype (the blocks
//    one by one, then the extras: embedders, norm_out, proj_out);
//  - with one, the adapter is a frozen LoRA (scale 1: AI Toolkit sets its alpha to its rank) beside each
//    Linear it names, those Linears stored as model.qtype, every other Linear quantized as "uint8", which
//    leaves it in its dtype. The adapter is the file when the path exists (PEFT / AI Toolkit naming, any
//    rank; its matrices in the base's dtype); otherwise — a Hub name, which gclab does not fetch — it is
//    built at rank kRecoveryAdapterRank on the Linears of the blocks (the Linears AI Toolkit's LoRA network
//    reaches, which its adapters are trained on) with a zero up-projection: its memory is exact, its
//    effect none.
// Call it before the trained LoRA is added and before weights are loaded (a quantized Linear quantizes
// what it loads). Throws std::runtime_error for an adapter file that does not fit the model.
BaseQuantization quantize_base(DiffusionTransformer& model, const config::ModelConfig& config);

// How AI Toolkit's loader stores each text encoder's Linear weights, slot by slot (nullopt: left in its
// dtype): the family's TextEncoderQuantization (model/family.h) applied to the model block.
std::vector<std::optional<WeightStorage>> text_encoder_storage(const config::ModelConfig& config,
                                                               const ModelSpec& spec);
// The same as words for the log and `check`: "T5-XXL's Linears as qfloat8", "the training dtype".
std::string describe_text_encoder_storage(const config::ModelConfig& config, const ModelSpec& spec);

// One line for the log: what quantize_base did.
std::string describe(const BaseQuantization& q, const config::ModelConfig& config);

}  // namespace gclab::model
