// QwenImagePipeline's prompt encoding (diffusers pipeline_qwenimage.py _get_qwen_prompt_embeds): the prompt in
// its chat template, Qwen2.5-VL's last hidden states with the template's 34 prefix tokens dropped, up to
// max_sequence_length (1024) rows after them, the mask passed. The edit pipelines (pipeline_qwenimage_edit.py,
// _edit_plus.py) use their own template — its 64 prefix tokens dropped, the prompt not cut — with each control
// image read through the vision tower (the Plus template numbering them "Picture i: ").
#include <stdexcept>

#include "gclab/text/pipeline.h"

namespace gclab::model::qwen_image {
namespace {

// QwenImagePipeline.prompt_template_encode up to the prompt; prompt_template_encode_start_idx = 34 rows, the
// prefix's tokens under Qwen's tokenizer (and under the hashing stand-in's split).
constexpr int64_t kImageDrop = 34;
constexpr const char* kImagePrefix =
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, spatial "
    "relationships of the objects and background:<|im_end|>\n<|im_start|>user\n";
// QwenImageEditPipeline's / QwenImageEditPlusPipeline's prompt_template_encode up to the user's turn (its
// prompt_template_encode_start_idx = 64 tokens, dropped).
constexpr int64_t kEditDrop = 64;
constexpr const char* kEditPrefix =
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, objects, "
    "background), then explain how the user's text instruction should alter or modify the image. Generate a new "
    "image that meets the user's requirements while maintaining consistency with the original input where "
    "appropriate.<|im_end|>\n<|im_start|>user\n";

class QwenImageText final : public text::OneEncoderPipeline {
 public:
  QwenImageText() : OneEncoderPipeline(config::TextEncoderKind::qwen25_vl) {}
  std::vector<text::PipelineCall> calls(const std::vector<const text::TextEncoderBase*>& e,
                                        const text::PipelineTarget& t) const override {
    if (t.condition_area <= 0)
      return {text::PipelineCall()
                  .template_around(kImagePrefix, text::kQwenChatAssistant)
                  .max_length(t.max_tokens + kImageDrop)
                  .mask(true)
                  .drop(kImageDrop)};
    if (!e[0]->takes_images())
      throw std::runtime_error("an edit model's text encoder needs Qwen2.5-VL's vision tower (vision_config)");
    // The edit pipelines do not cut the prompt (the processor pads, it does not truncate).
    return {text::PipelineCall()
                .template_around(kEditPrefix, text::kQwenChatAssistant)
                .mask(true)
                .drop(kEditDrop)
                .condition_area(t.condition_area)
                .numbered(t.numbered_conditions)};
  }
};

}  // namespace

std::shared_ptr<const text::TextPipeline> text_pipeline() { return std::make_shared<QwenImageText>(); }

}  // namespace gclab::model::qwen_image
