#include "gclab/text/memory.h"

#include <stdexcept>
#include <string>

#include "gclab/memory/meta_count.h"
#include "gclab/nn/layers.h"

namespace gclab::text {

namespace {

torch::TensorOptions meta_options(const EncodeMemoryOptions& o) {
  return torch::TensorOptions().device(torch::kMeta).dtype(o.dtype);
}

// The encoder of `config` on the meta device, its Linears qfloat8 when quantize_te asks it.
template <class Model, class Config>
Model meta_model(const Config& config, const EncodeMemoryOptions& o) {
  Model model(config, meta_options(o));
  if (o.quantized_linears)
    for (auto& [name, linear] : nn::named_linears(*model)) linear->set_weight_storage(nn::WeightStorage::QFloat8);
  return model;
}

// The caller's inputs on meta (made before the count): ids [batch, tokens] and, when masked, the mask.
struct MetaInputs {
  torch::Tensor ids, mask;
  MetaInputs(int64_t batch, int64_t tokens, bool masked) {
    const auto o = torch::TensorOptions().device(torch::kMeta).dtype(torch::kLong);
    ids = torch::empty({batch, tokens}, o);
    if (masked) mask = torch::empty({batch, tokens}, o);
  }
};

// The peak of `run` above what was live when it started, walked on meta for the options' device.
template <class Run>
int64_t walk(const EncodeMemoryOptions& o, Run&& run) {
  torch::NoGradGuard no_grad;
  memory::MetaCount count(o.cpu ? c10::kCPU : c10::kCUDA);
  run();
  return count.peak();
}

// The patches of `images` as the processor gives them (float32, on the walk's device) and their grid_thw
// (on the CPU: the layout is read from its values).
QwenVisionInput meta_patches(const QwenVisionConfig& v, const std::vector<VisionGrid>& images) {
  int64_t patches = 0;
  torch::Tensor grid = torch::empty({static_cast<int64_t>(images.size()), 3}, torch::kLong);
  for (size_t i = 0; i < images.size(); ++i) {
    patches += images[i].rows * images[i].columns;
    grid[static_cast<int64_t>(i)][0] = 1, grid[static_cast<int64_t>(i)][1] = images[i].rows;
    grid[static_cast<int64_t>(i)][2] = images[i].columns;
  }
  const int64_t patch = v.in_channels * v.temporal_patch_size * v.patch_size * v.patch_size;
  return {torch::empty({patches, patch}, torch::TensorOptions().device(torch::kMeta)), grid};
}

}  // namespace

int64_t predicted_encode_bytes(const ClipTextConfig& c, int64_t batch, int64_t tokens, bool masked,
                               const EncodeMemoryOptions& o) {
  ClipTextModel model = meta_model<ClipTextModel>(c, o);
  const MetaInputs in(batch, tokens, masked);
  return walk(o, [&] { model->forward(in.ids, in.mask); });
}

int64_t predicted_encode_bytes(const T5Config& c, int64_t batch, int64_t tokens, bool masked,
                               const EncodeMemoryOptions& o) {
  T5Encoder model = meta_model<T5Encoder>(c, o);
  const MetaInputs in(batch, tokens, masked);
  return walk(o, [&] { model->forward(in.ids, in.mask); });
}

int64_t predicted_vision_bytes(const QwenVisionConfig& v, const std::vector<VisionGrid>& images,
                               const EncodeMemoryOptions& o) {
  QwenVisionTower tower(v, meta_options(o));
  const QwenVisionInput in = meta_patches(v, images);
  return walk(o, [&] { tower->forward(in); });
}

int64_t predicted_encode_bytes(const QwenLmConfig& c, int64_t batch, int64_t tokens, bool masked,
                               const EncodeMemoryOptions& o, const std::vector<VisionGrid>& images,
                               const QwenVisionConfig* vision) {
  QwenLm model = meta_model<QwenLm>(c, o);
  if (!vision && c.vision) vision = &*c.vision;
  if (images.empty() || !vision) {
    const MetaInputs in(batch, tokens, masked);
    return walk(o, [&] { model->forward(in.ids, in.mask); });
  }
  // The images' tokens where a prompt puts them: after the first token, one run per image (their values
  // place the multimodal positions, so the ids are the CPU's).
  QwenVisionConfig v = *vision;
  v.out_hidden_size = c.hidden_size;
  QwenVisionTower tower(v, meta_options(o));
  torch::Tensor ids = torch::zeros({batch, tokens}, torch::kLong);
  int64_t at = 1;
  for (const VisionGrid& g : images) {
    const int64_t n = g.rows * g.columns / (v.spatial_merge_size * v.spatial_merge_size);
    if (at + n > tokens)
      throw std::invalid_argument(std::to_string(tokens) + " tokens cannot hold the images' " +
                                  std::to_string(at + n - 1) + " image tokens");
    ids[0].slice(0, at, at + n).fill_(c.image_token_id);
    at += n + 1;
  }
  const torch::Tensor mask = masked ? torch::ones({batch, tokens}, torch::kLong) : torch::Tensor();
  return walk(o, [&] {
    const QwenVisionInput patches = meta_patches(v, images);
    qwen_forward_with_images(*model, *tower, ids, mask, patches);
  });
}

}  // namespace gclab::text
