// ZImagePipeline's prompt encoding (diffusers pipeline_z_image.py _encode_prompt): the prompt in Qwen3's chat
// template (one user turn, add_generation_prompt, enable_thinking adding nothing after it), padded to
// max_sequence_length (512) with the mask passed, hidden_states[-2] at the real tokens only.
#include "gclab/text/pipeline.h"

namespace gclab::model::zimage {
namespace {

class ZImageText final : public text::OneEncoderPipeline {
 public:
  ZImageText() : OneEncoderPipeline(config::TextEncoderKind::qwen3) {}
  std::vector<text::PipelineCall> calls(const std::vector<const text::TextEncoderBase*>&,
                                        const text::PipelineTarget& t) const override {
    return {text::PipelineCall()
                .template_around(text::kQwenChatUser, text::kQwenChatAssistant)
                .max_length(t.max_tokens)
                .pad(true)
                .mask(true)};
  }
};

}  // namespace

std::shared_ptr<const text::TextPipeline> text_pipeline() { return std::make_shared<ZImageText>(); }

}  // namespace gclab::model::zimage
