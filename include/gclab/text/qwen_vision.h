// What Qwen-Image's text encoder holds beyond its language model: transformers' Qwen2_5_VLForConditionalGeneration
// carries the Qwen2.5-VL vision tower (Qwen2_5_VisionTransformerPretrainedModel: a Conv3d patch embedding
// over 2x14x14 patches, 32 pre-norm blocks of windowed / full attention with a SwiGLU MLP, and the patch
// merger to the language model's width) and the LM head. AI Toolkit and diffusers load the whole model, so
// both are resident whenever the encoder is: 676,550,144 + 544,997,376 parameters beside the language
// model's 7,070,619,136 (8,292,166,656 in all, as transformers counts it). Built here at their real
// shapes, by transformers' names, for memory; the text path does not use them, and the tower's forward
// (the edit models' control images) is the next step.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "gclab/nn/layers.h"

namespace gclab::text {

struct QwenVisionConfig {
  int64_t depth = 32, hidden_size = 1280, intermediate_size = 3420, num_heads = 16, out_hidden_size = 3584;
  int64_t in_channels = 3, patch_size = 14, temporal_patch_size = 2, spatial_merge_size = 2;

  // Qwen2.5-VL-7B-Instruct's vision tower, as Qwen-Image ships it.
  static QwenVisionConfig qwen25_vl_7b() { return {}; }
  // The same code at CPU-test size (2 blocks of width 32), merging into a language model `out_hidden` wide.
  static QwenVisionConfig tiny(int64_t out_hidden);
};

class QwenVisionTowerImpl : public torch::nn::Module {
 public:
  QwenVisionTowerImpl(const QwenVisionConfig& config, const torch::TensorOptions& options = {});
  const QwenVisionConfig& config() const { return config_; }

 private:
  QwenVisionConfig config_;
  std::vector<std::shared_ptr<torch::nn::Module>> blocks_;
};
TORCH_MODULE(QwenVisionTower);

}  // namespace gclab::text
