// The Qwen2.5-VL vision tower, as transformers' Qwen2_5_VisionTransformerPretrainedModel computes it: the
// image cut into 2x14x14 patches (a still image repeated over the temporal patch), a Conv3d patch embedding,
// 32 pre-norm blocks of attention and a SwiGLU MLP — windowed attention (112-pixel windows, 64 patches)
// except the full-attention blocks 7, 15, 23 and 31, 2D rotary positions over (row, column) — and the patch
// merger (2x2 patches -> one token of the language model's width). Qwen-Image's text encoder
// (Qwen2_5_VLForConditionalGeneration) holds it beside the language model; the edit pipelines pass their
// control image through it, and the language model reads its tokens in place of the prompt's <|image_pad|>
// run (text::QwenLm, multimodal rotary positions). 676,550,144 parameters at the 7B's shape.
// The image processor's side (Qwen2VLImageProcessor: smart_resize, CLIP normalization, the patch order) is
// qwen_vl_image_input.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "gclab/nn/layers.h"

namespace gclab::text {

struct QwenVisionConfig {
  int64_t depth = 32, hidden_size = 1280, intermediate_size = 3420, num_heads = 16, out_hidden_size = 3584;
  int64_t in_channels = 3, patch_size = 14, temporal_patch_size = 2, spatial_merge_size = 2;
  int64_t window_size = 112;  // pixels per attention window's side
  std::vector<int64_t> fullatt_block_indexes{7, 15, 23, 31};
  double rope_theta = 10000.0;

  // Qwen2.5-VL-7B-Instruct's vision tower, as Qwen-Image ships it.
  static QwenVisionConfig qwen25_vl_7b() { return {}; }
  // The same code at CPU-test size (2 blocks of width 32, the second full attention), merging into a
  // language model `out_hidden` wide.
  static QwenVisionConfig tiny(int64_t out_hidden);
};

// The image processor's pixel limits in Qwen2.5-VL-7B-Instruct's preprocessor_config.json (min_pixels,
// max_pixels), as Qwen-Image ships it.
constexpr int64_t kQwenVlMinPixels = 3136, kQwenVlMaxPixels = 12845056;

// One or more images as the tower takes them (Qwen2VLImageProcessor's output): `pixel_values` [patches,
// C * temporal_patch * patch * patch] in the processor's patch order, `grid_thw` [images, 3] int64 (frames,
// rows, columns of patches).
struct QwenVisionInput {
  torch::Tensor pixel_values, grid_thw;
  // The language model tokens the images become (<|image_pad|> per image): rows * columns / merge^2.
  std::vector<int64_t> tokens_per_image(int64_t spatial_merge_size) const;
};

// Qwen2VLImageProcessor's smart_resize: the height and width nearest (h, w) that are multiples of `factor`
// (patch * merge = 28) with an area within [min_pixels, max_pixels] and the aspect kept. Throws
// std::invalid_argument for an aspect above 200 or an empty image.
std::pair<int64_t, int64_t> qwen_vl_smart_resize(int64_t height, int64_t width, int64_t factor = 28,
                                                 int64_t min_pixels = 56 * 56, int64_t max_pixels = 28 * 28 * 1280);

// Qwen2VLImageProcessor on one image [3, H, W] with values in [0, 1]: resized to smart_resize's size
// (bicubic, antialiased, on uint8 levels: within one level of PIL's — the one step that is not bit-exact), normalized
// with CLIP's mean and std, repeated over the temporal patch, and cut into patches in the processor's order.
// On the CPU (memory::to_cpu, CpuWork: a meta image is walked as the CPU work of the device the walk stands for).
QwenVisionInput qwen_vl_image_input(const torch::Tensor& image, const QwenVisionConfig& config,
                                    int64_t min_pixels = kQwenVlMinPixels, int64_t max_pixels = kQwenVlMaxPixels);

// The processor's images side by side, as the processor batches them: their patches concatenated, then on
// `device` in `dtype` (the encoder's: memory::to_device), with their grids.
QwenVisionInput qwen_vl_batch(const std::vector<QwenVisionInput>& images, const torch::Device& device,
                              torch::ScalarType dtype);

// The size AI Toolkit resizes an edit model's control image ([.., H, W]) to before the processor
// (qwen_image_edit.py / qwen_image_edit_plus.py get_prompt_embeds: `area` at the image's aspect, sides
// rounded to multiples of 32 as the diffusers pipelines' calculate_dimensions, bilinear). The Plus model's
// code computes the width from the height-over-width ratio, so its condition image comes out with the
// aspect transposed (a square one is unchanged); gclab does the same. Returns (height, width).
std::pair<int64_t, int64_t> qwen_edit_condition_size(int64_t height, int64_t width, int64_t area, bool plus);
// The language-model tokens an image of this size becomes: smart_resize at Qwen2.5-VL-7B-Instruct's limits,
// then one token per merge block.
int64_t qwen_vl_image_tokens(int64_t height, int64_t width, const QwenVisionConfig& config);

class QwenVisionTowerImpl : public torch::nn::Module {
 public:
  QwenVisionTowerImpl(const QwenVisionConfig& config, const torch::TensorOptions& options = {});
  // The merged tokens [sum over images of rows * columns / merge^2, out_hidden_size], image after image, in
  // the language model's row-major order (what get_image_features' pooler_output concatenates).
  torch::Tensor forward(const QwenVisionInput& input);
  const QwenVisionConfig& config() const { return config_; }

 private:
  QwenVisionConfig config_;
  struct Block;
  std::vector<std::shared_ptr<Block>> blocks_;
  torch::Tensor patch_weight_;
  nn::RMSNorm merger_norm_{nullptr};
  nn::Linear merger_in_{nullptr}, merger_out_{nullptr};
};
TORCH_MODULE(QwenVisionTower);

// Loads the tower's weights from a transformers folder or file of the whole model: `visual.*` (the
// published Qwen-Image text_encoder) or `model.visual.*` (transformers 5's save_pretrained). Returns the
// names in the file the tower does not use.
std::vector<std::string> load_qwen_vision_weights(QwenVisionTowerImpl& tower, const std::filesystem::path& path);

}  // namespace gclab::text
