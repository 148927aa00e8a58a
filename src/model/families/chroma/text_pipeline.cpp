// ChromaModel.get_prompt_embeds (extensions_built_in/diffusion_models/chroma/chroma_model.py:381-417): T5-XXL
// alone on the prompt padded to 512 tokens and called without its attention mask (as FluxPipeline calls it;
// diffusers' ChromaPipeline passes the mask, AI Toolkit does not), every row handed to the transformer with
// the tokenizer's attention mask beside them, which the transformer reads (transformer.cpp).
#include <algorithm>

#include "gclab/text/pipeline.h"

namespace gclab::model::chroma {
namespace {

class ChromaText final : public text::OneEncoderPipeline {
 public:
  ChromaText() : OneEncoderPipeline(config::TextEncoderKind::t5_xxl) {}
  std::vector<text::PipelineCall> calls(const std::vector<const text::TextEncoderBase*>&,
                                        const text::PipelineTarget& t) const override {
    return {text::PipelineCall().max_length(t.max_tokens).pad(true)};
  }
  int64_t fixed_rows(const text::PipelineTarget& t) const override { return t.max_tokens; }
  text::PromptEmbedding compose(const std::vector<text::EncodedText>& e, const std::vector<int64_t>& valid,
                                const std::vector<text::PipelineCall>& calls,
                                const text::PipelineTarget& t) const override {
    text::PromptEmbedding out = TextPipeline::compose(e, valid, calls, t);
    const int64_t rows = out.text.size(1);
    out.mask = torch::zeros({1, rows}, out.text.options().dtype(torch::kLong));
    if (!out.mask.is_meta()) out.mask.narrow(1, 0, std::min(valid.back(), rows)).fill_(1);
    return out;
  }
};

}  // namespace

std::shared_ptr<const text::TextPipeline> text_pipeline() { return std::make_shared<ChromaText>(); }

}  // namespace gclab::model::chroma
