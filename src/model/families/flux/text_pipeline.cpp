// FluxPipeline's prompt encoding (FLUX.1 and Flex): T5-XXL's last hidden states over max_sequence_length
// tokens padded to it (dev and Flex 512, schnell 256; no attention mask), CLIP-L's pooled output over its
// 77 padded tokens (diffusers pipeline_flux.py _get_t5_prompt_embeds, _get_clip_prompt_embeds).
#include "gclab/text/pipeline.h"

namespace gclab::model::flux {
namespace {

class FluxText final : public text::TextPipeline {
 public:
  std::vector<config::TextEncoderKind> encoders() const override {
    return {config::TextEncoderKind::clip_l, config::TextEncoderKind::t5_xxl};
  }
  std::vector<text::TinyWidths> tiny_widths(const text::PipelineTarget& t) const override {
    return {{t.pooled_width, 0}, {t.text_width, 0}};
  }
  bool composes(const std::vector<text::TinyWidths>& w, const text::PipelineTarget& t) const override {
    return w[1].hidden == t.text_width && w[0].projection == t.pooled_width;
  }
  std::vector<text::PipelineCall> calls(const std::vector<const text::TextEncoderBase*>& e,
                                        const text::PipelineTarget& t) const override {
    return {text::PipelineCall().max_length(e[0]->max_positions()).pad(true),
            text::PipelineCall().max_length(t.max_tokens).pad(true)};
  }
  int64_t fixed_rows(const text::PipelineTarget& t) const override { return t.max_tokens; }
};

}  // namespace

std::shared_ptr<const text::TextPipeline> text_pipeline() { return std::make_shared<FluxText>(); }

}  // namespace gclab::model::flux
