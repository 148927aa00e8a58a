// The Qwen-Image transformer (diffusers QwenImageTransformer2DModel), reference images appended for the edit models.
#include <algorithm>
#include <array>

#include "model/transformer_parts.h"

namespace gclab::model::qwen_image {
namespace {

// Qwen-Image double-stream block (QwenImageTransformerBlock): img_mod.1 / txt_mod.1 (a Linear after a
// SiLU), img_mlp / txt_mlp.
class QwenImageBlock : public DoubleStreamBlock {
 public:
  QwenImageBlock(int64_t dim, int64_t heads, int64_t mlp_hidden, const torch::TensorOptions& options)
      : DoubleStreamBlock(dim, heads, mlp_hidden, {"img_mod.1", "txt_mod.1", "img_mlp", "txt_mlp"}, options) {}
};

// QwenTimestepProjEmbeddings' time_proj: diffusers' Timesteps(256, flip_sin_to_cos, shift 0, scale 1000)
// (embeddings.get_timestep_embedding; transformer_qwenimage.py's own copy of it, which would round the
// frequencies to the timestep's dtype, is never called): the scale applied after t x frequencies, in
// float32, on the timestep the model rounded to its dtype.
torch::Tensor qwen_timestep_embedding(const torch::Tensor& t) {
  const int64_t half = 128;
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(t.device());
  const torch::Tensor freqs = torch::exp(-std::log(10000.0) * torch::arange(half, f32) / half);
  const torch::Tensor args = 1000 * (t.to(torch::kFloat).unsqueeze(1) * freqs.unsqueeze(0));
  return torch::cat({torch::cos(args), torch::sin(args)}, -1);
}

class QwenImageTransformer : public DiffusionTransformer {
 public:
  QwenImageTransformer(const ModelSpec& s, const torch::TensorOptions& o) : DiffusionTransformer(s) {
    const int64_t d = s.hidden;
    img_in =
        register_module("img_in", Linear(LinearOptions(s.latent_channels * s.patch * s.patch, d).tensor_options(o)));
    txt_norm = register_module("txt_norm", RMSNorm(s.text_dim, 1e-6, true, o));
    txt_in = register_module("txt_in", Linear(LinearOptions(s.text_dim, d).tensor_options(o)));
    timestep_embedder = TwoLayerMlp(*this, "time_text_embed.timestep_embedder.linear_1",
                                    "time_text_embed.timestep_embedder.linear_2", 256, d, d, o);
    for (int i = 0; i < s.double_blocks; ++i)
      add_block("transformer_blocks." + std::to_string(i),
                std::make_shared<QwenImageBlock>(d, s.heads, s.mlp_hidden, o));
    norm_out_linear = register_at(*this, "norm_out.linear", Linear(LinearOptions(d, 2 * d).tensor_options(o)));
    proj_out =
        register_module("proj_out", Linear(LinearOptions(d, s.patch * s.patch * s.out_channels).tensor_options(o)));
  }

  torch::Tensor forward(const ModelInputs& in) override {
    const int64_t p = spec_.patch, h = in.latents.size(2), w = in.latents.size(3);
    // The noisy image's tokens, then each reference image's (edit models), as frames 0, 1, 2, ...
    std::vector<torch::Tensor> parts = {patchify(in.latents, p, false)};
    std::vector<std::array<int64_t, 3>> shapes = {{0, h / p, w / p}};
    for (size_t r = 0; r < in.reference_latents.size(); ++r) {
      const auto& ref = in.reference_latents[r];
      parts.push_back(patchify(ref, p, false));
      shapes.push_back({static_cast<int64_t>(r + 1), ref.size(2) / p, ref.size(3) / p});
    }
    torch::Tensor img = img_in(torch::cat(parts, 1));
    torch::Tensor txt = txt_in(txt_norm(in.text));
    const torch::Tensor t = in.timestep.to(img.scalar_type());  // QwenImageTransformer2DModel.forward's cast
    const torch::Tensor temb = timestep_embedder(qwen_timestep_embedding(t).to(img.scalar_type()));
    // QwenEmbedRope with scale_rope: rows and columns centred on 0; text continues after the largest
    // half-side, on all three axes.
    std::vector<std::array<int64_t, 3>> ids;
    int64_t text_start = 0;
    for (const auto& [frame, gh, gw] : shapes) text_start = std::max({text_start, gh / 2, gw / 2});
    for (int64_t j = 0; j < txt.size(1); ++j) ids.push_back({text_start + j, text_start + j, text_start + j});
    for (const auto& [frame, gh, gw] : shapes) add_image_ids(ids, frame, gh, gw, -(gh - gh / 2), -(gw - gw / 2));
    torch::Tensor id_tensor = ids_tensor(ids, img.device());
    // Frequencies of negative positions: the reference uses the table's tail for them, the same angles.
    const auto [cos, sin] = rope_cos_sin(id_tensor, spec_.rope_axes, spec_.rope_theta);
    const int64_t n = (h / p) * (w / p);
    Tensors extra;  // zero_cond_t: which tokens are the references', and the embedding of t = 0
    if (spec_.zero_cond_t && img.size(1) > n) {
      const torch::Tensor ref = torch::arange(img.size(1), torch::TensorOptions().device(img.device())) >= n;
      const torch::Tensor t0 = torch::zeros_like(t);
      extra = {ref.view({1, -1, 1}), timestep_embedder(qwen_timestep_embedding(t0).to(img.scalar_type()))};
    }
    for (size_t b = 0; b < blocks().size(); ++b) {
      Tensors block_in = {img, txt, temb, cos, sin};
      block_in.insert(block_in.end(), extra.begin(), extra.end());
      const Tensors out = call_block(b, block_in);
      img = out[0], txt = out[1];
    }
    img = img.narrow(1, 0, n);
    return unpatchify(proj_out(norm_out(norm_out_linear, img, temb)), h, w, p, spec_.out_channels, false);
  }

 private:
  Linear img_in{nullptr}, txt_in{nullptr}, norm_out_linear{nullptr}, proj_out{nullptr};
  RMSNorm txt_norm{nullptr};
  TwoLayerMlp timestep_embedder;
};

}  // namespace

std::shared_ptr<DiffusionTransformer> build_transformer(const ModelSpec& spec, const torch::TensorOptions& options) {
  return std::make_shared<QwenImageTransformer>(spec, options);
}

}  // namespace gclab::model::qwen_image
