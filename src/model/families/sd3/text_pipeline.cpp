// StableDiffusion3Pipeline's prompt encoding (diffusers pipeline_stable_diffusion_3.py encode_prompt): CLIP-L's
// and bigG's penultimate hidden states over 77 padded tokens side by side, zero-padded to T5's width, then
// T5-XXL's rows (max_sequence_length 256): 333 rows; the pooled vector is both CLIPs' projected pooled
// outputs side by side.
#include <stdexcept>

#include "gclab/text/pipeline.h"

namespace gclab::model::sd3 {
namespace {

class Sd3Text final : public text::TextPipeline {
 public:
  std::vector<config::TextEncoderKind> encoders() const override {
    using K = config::TextEncoderKind;
    return {K::clip_l_projected, K::clip_g_projected, K::t5_xxl};
  }
  std::vector<text::TinyWidths> tiny_widths(const text::PipelineTarget& t) const override {
    int64_t clip = std::min<int64_t>(32, t.text_width / 2);
    if (clip >= 4) clip -= clip % 4;
    return {{clip, t.pooled_width / 2}, {clip, t.pooled_width - t.pooled_width / 2}, {t.text_width, 0}};
  }
  bool composes(const std::vector<text::TinyWidths>& w, const text::PipelineTarget& t) const override {
    return w[2].hidden == t.text_width && w[0].hidden + w[1].hidden <= t.text_width &&
           w[0].projection + w[1].projection == t.pooled_width;
  }
  std::vector<text::PipelineCall> calls(const std::vector<const text::TextEncoderBase*>& e,
                                        const text::PipelineTarget& t) const override {
    const int64_t clip = e[0]->max_positions();
    if (t.max_tokens <= clip)
      throw std::runtime_error("the transformer takes " + std::to_string(t.max_tokens) +
                               " text rows, not more than CLIP's " + std::to_string(clip) + ": no room for T5's");
    return {text::PipelineCall().max_length(clip).pad(true),
            text::PipelineCall().max_length(e[1]->max_positions()).pad(true),
            text::PipelineCall().max_length(t.max_tokens - clip).pad(true)};
  }
  int64_t fixed_rows(const text::PipelineTarget& t) const override { return t.max_tokens; }
  text::PromptEmbedding compose(const std::vector<text::EncodedText>& e, const std::vector<int64_t>&,
                                const std::vector<text::PipelineCall>&, const text::PipelineTarget& t) const override {
    text::PromptEmbedding out;
    out.pooled = torch::cat({e[0].pooled, e[1].pooled}, -1);
    torch::Tensor clip = torch::cat({e[0].hidden_states, e[1].hidden_states}, -1);
    clip = torch::constant_pad_nd(clip, {0, t.text_width - clip.size(-1)});
    out.text = torch::cat({clip, e[2].hidden_states}, 1);
    return out;
  }
};

}  // namespace

std::shared_ptr<const text::TextPipeline> text_pipeline() { return std::make_shared<Sd3Text>(); }

}  // namespace gclab::model::sd3
