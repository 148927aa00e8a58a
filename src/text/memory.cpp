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
  return memory::inference_peak(o.cpu ? c10::kCPU : c10::kCUDA, std::forward<Run>(run));
}

// Each image's patches as the processor gives them (float32) with its grid_thw (on the CPU: the layout is
// read from its values), on meta.
std::vector<QwenVisionInput> meta_processed(const QwenVisionConfig& v, const std::vector<VisionGrid>& images) {
  const int64_t patch = v.in_channels * v.temporal_patch_size * v.patch_size * v.patch_size;
  std::vector<QwenVisionInput> out;
  for (const VisionGrid& g : images)
    out.push_back({torch::empty({g.rows * g.columns, patch}, torch::TensorOptions().device(torch::kMeta)),
                   torch::tensor({int64_t{1}, g.rows, g.columns}, torch::kLong).view({1, 3})});
  return out;
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
  const QwenVisionInput in = qwen_vl_batch(meta_processed(v, images), torch::kMeta, torch::kFloat);
  return walk(o, [&] { tower->forward(in); });
}

int64_t predicted_encode_bytes(const QwenLmConfig& c, int64_t batch, int64_t tokens, bool masked,
                               const EncodeMemoryOptions& o) {
  QwenLm model = meta_model<QwenLm>(c, o);
  const MetaInputs in(batch, tokens, masked);
  return walk(o, [&] { model->forward(in.ids, in.mask); });
}

}  // namespace gclab::text
