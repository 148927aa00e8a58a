// The FLUX.2 pipelines' prompt encoding as AI Toolkit's flux2/src/pipeline.py runs it (and diffusers'
// Flux2KleinPipeline._get_qwen3_prompt_embeds): the prompt in the decoder's chat template, padded to 512
// tokens with the mask passed to the decoder, its hidden states after three layers stacked per token
// ([layer a | layer b | layer c]), every one of the 512 rows handed to the transformer (no mask after it).
// klein: Qwen3 (4B for klein 4B, 8B for klein 9B), one user turn, add_generation_prompt, enable_thinking off
// (the template's empty think block after the assistant's turn opens), layers 9 / 18 / 27.
// dev: Mistral-Small-3.1's language model, a system turn with BFL's message then the user's (pipeline.py:
// 36-37, 73-126; no generation prompt), "[IMG]" taken out of the prompt first, layers 10 / 20 / 30.
#include <algorithm>

#include "gclab/text/pipeline.h"

namespace gclab::model::flux2 {
namespace {

constexpr int64_t kLayers = 3;

class StackedLayers final : public text::OneEncoderPipeline {
 public:
  StackedLayers(config::TextEncoderKind kind, std::vector<int64_t> layers, int64_t preset_depth, std::string prefix,
                std::string suffix, std::string removed = "")
      : OneEncoderPipeline(kind),
        layers_(std::move(layers)),
        depth_(preset_depth),
        prefix_(std::move(prefix)),
        suffix_(std::move(suffix)),
        removed_(std::move(removed)) {}
  // format_input: `prompt.replace("[IMG]", "")` (Pixtral's image token, which truncation would miscount).
  std::string clean(const std::string& prompt) const override {
    if (removed_.empty()) return prompt;
    std::string out = prompt;
    for (size_t at = out.find(removed_); at != std::string::npos; at = out.find(removed_, at))
      out.erase(at, removed_.size());
    return out;
  }
  std::vector<text::TinyWidths> tiny_widths(const text::PipelineTarget& t) const override {
    return {{t.text_width / kLayers, 0}};
  }
  bool composes(const std::vector<text::TinyWidths>& built, const text::PipelineTarget& t) const override {
    return built[0].hidden * kLayers == t.text_width;
  }
  // A CPU-test decoder without the pipeline's layers takes the layers at the same fractions of its depth.
  std::vector<text::PipelineCall> calls(const std::vector<const text::TextEncoderBase*>& e,
                                        const text::PipelineTarget& t) const override {
    std::vector<int64_t> layers = layers_;
    const int64_t depth = e[0]->layer_count();
    if (depth < layers.back())
      for (int64_t& k : layers) k = std::max<int64_t>(1, k * depth / depth_);
    return {text::PipelineCall()
                .template_around(prefix_, suffix_)
                .max_length(t.max_tokens)
                .pad(true)
                .mask(true)
                .hidden_layers(layers)
                .lm_logits(true)};  // the whole Mistral3ForConditionalGeneration / Qwen3ForCausalLM
  }
  int64_t fixed_rows(const text::PipelineTarget& t) const override { return t.max_tokens; }
  // Every row, padding included (pipeline.py: `return prompt_embeds, None`).
  text::PromptEmbedding compose(const std::vector<text::EncodedText>& e, const std::vector<int64_t>&,
                                const std::vector<text::PipelineCall>&, const text::PipelineTarget&) const override {
    return {e.back().hidden_states, {}, {}};
  }

 private:
  std::vector<int64_t> layers_;
  int64_t depth_;
  std::string prefix_, suffix_, removed_;
};

// pipeline.py's SYSTEM_MESSAGE (with its line break), as diffusers' Flux2Pipeline has it too.
constexpr const char* kDevSystemMessage =
    "You are an AI that reasons about image descriptions. You give structured responses focusing on object "
    "relationships, object\nattribution and actions without speculation.";

}  // namespace

std::shared_ptr<const text::TextPipeline> klein_text_pipeline(bool nine_b) {
  // Qwen3's chat template with enable_thinking=False: "<think>\n\n</think>\n\n" after the assistant's turn.
  return std::make_shared<StackedLayers>(nine_b ? config::TextEncoderKind::qwen3_8b : config::TextEncoderKind::qwen3,
                                         std::vector<int64_t>{9, 18, 27}, 36, text::kQwenChatUser,
                                         std::string(text::kQwenChatAssistant) + "<think>\n\n</think>\n\n");
}

std::shared_ptr<const text::TextPipeline> dev_text_pipeline() {
  // Mistral-Small-3.1's chat template (its tokenizer's v7 "tekken" format) on [system, user] without a
  // generation prompt: <s>[SYSTEM_PROMPT]...[/SYSTEM_PROMPT][INST]...[/INST].
  return std::make_shared<StackedLayers>(
      config::TextEncoderKind::mistral3, std::vector<int64_t>{10, 20, 30}, 40,
      std::string("<s>[SYSTEM_PROMPT]") + kDevSystemMessage + "[/SYSTEM_PROMPT][INST]", "[/INST]", "[IMG]");
}

}  // namespace gclab::model::flux2
