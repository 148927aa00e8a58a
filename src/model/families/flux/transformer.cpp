// The FLUX.1 / Flex transformer (diffusers FluxTransformer2DModel).
#include <algorithm>
#include <array>

#include "gclab/nn/activation.h"
#include "model/transformer_parts.h"

namespace gclab::model::flux {
namespace {

// FLUX double-stream block (FluxTransformerBlock): norm1.linear / norm1_context.linear, ff / ff_context.
class FluxDoubleBlock : public DoubleStreamBlock {
 public:
  FluxDoubleBlock(int64_t dim, int64_t heads, int64_t mlp_hidden, const torch::TensorOptions& options)
      : DoubleStreamBlock(dim, heads, mlp_hidden, {"norm1.linear", "norm1_context.linear", "ff", "ff_context"},
                          options) {}
};

// FLUX single-stream block (FluxSingleTransformerBlock): attention and MLP in parallel on the joint
// sequence, proj_out over their concatenation. Inputs {x, temb, cos, sin} -> {x}.
class FluxSingleBlock : public TransformerBlock {
 public:
  std::vector<Linear> modulation_linears() override { return {norm_linear}; }
  FluxSingleBlock(int64_t dim, int64_t heads, int64_t mlp_hidden, const torch::TensorOptions& options);
  Tensors forward_block(const Tensors& inputs, const SubBlockRunner& run) override;

 private:
  Linear norm_linear{nullptr}, proj_mlp{nullptr}, proj_out{nullptr};
  SelfAttention attn{nullptr};
};

FluxSingleBlock::FluxSingleBlock(int64_t dim, int64_t heads, int64_t mlp_hidden, const torch::TensorOptions& options) {
  norm_linear = register_at(*this, "norm.linear", Linear(LinearOptions(dim, 3 * dim).tensor_options(options)));
  proj_mlp = register_module("proj_mlp", Linear(LinearOptions(dim, mlp_hidden).tensor_options(options)));
  proj_out = register_module("proj_out", Linear(LinearOptions(dim + mlp_hidden, dim).tensor_options(options)));
  attn = register_module("attn", SelfAttention(dim, heads, /*bias=*/true, /*out_proj=*/false, 1e-6, options));
}

Tensors FluxSingleBlock::forward_block(const Tensors& in, const SubBlockRunner& run) {
  const torch::Tensor& x = in.at(0);
  const auto m = chunks(norm_linear(torch::silu(in.at(1))), 3);  // AdaLayerNormZeroSingle: shift, scale, gate
  const torch::Tensor norm_x = modulate(layer_norm(x), m[0], m[1]);
  const torch::Tensor mlp_h =
      run(SubBlock::mlp,
          [this](const Tensors& t) { return Tensors{nn::activate(nn::Activation::gelu_tanh, proj_mlp(t[0]))}; },
          {norm_x})[0];
  const torch::Tensor attn_out =
      run(SubBlock::attn, [this](const Tensors& t) { return Tensors{attn(t[0], t[1], t[2])}; },
          {norm_x, in.at(2), in.at(3)})[0];
  return {x + m[2].unsqueeze(1) * proj_out(torch::cat({attn_out, mlp_h}, 2))};
}

class FluxTransformer : public DiffusionTransformer {
 public:
  FluxTransformer(const ModelSpec& s, const torch::TensorOptions& o) : DiffusionTransformer(s) {
    const int64_t d = s.hidden, in = s.latent_channels * s.patch * s.patch + s.extra_input_features;
    x_embedder = register_module("x_embedder", Linear(LinearOptions(in, d).tensor_options(o)));
    timestep_embedder = TwoLayerMlp(*this, "time_text_embed.timestep_embedder.linear_1",
                                    "time_text_embed.timestep_embedder.linear_2", 256, d, d, o);
    if (s.guidance_embed)
      guidance_embedder = TwoLayerMlp(*this, "time_text_embed.guidance_embedder.linear_1",
                                      "time_text_embed.guidance_embedder.linear_2", 256, d, d, o);
    text_embedder = TwoLayerMlp(*this, "time_text_embed.text_embedder.linear_1",
                                "time_text_embed.text_embedder.linear_2", s.pooled_dim, d, d, o);
    context_embedder = register_module("context_embedder", Linear(LinearOptions(s.text_dim, d).tensor_options(o)));
    for (int i = 0; i < s.double_blocks; ++i)
      add_block("transformer_blocks." + std::to_string(i),
                std::make_shared<FluxDoubleBlock>(d, s.heads, s.mlp_hidden, o));
    for (int i = 0; i < s.single_blocks; ++i)
      add_block("single_transformer_blocks." + std::to_string(i),
                std::make_shared<FluxSingleBlock>(d, s.heads, s.mlp_hidden, o));
    norm_out_linear = register_at(*this, "norm_out.linear", Linear(LinearOptions(d, 2 * d).tensor_options(o)));
    proj_out =
        register_module("proj_out", Linear(LinearOptions(d, s.patch * s.patch * s.out_channels).tensor_options(o)));
  }

  torch::Tensor forward(const ModelInputs& in) override {
    const int64_t p = spec_.patch, h = in.latents.size(2), w = in.latents.size(3);
    torch::Tensor img = patchify(in.latents, p, /*channels_last=*/false);
    if (in.condition_channels.defined()) {  // Flex.2's training inputs, packed as the latents are
      const torch::Tensor extra = patchify(in.condition_channels, p, /*channels_last=*/false);
      TORCH_CHECK(extra.size(2) == spec_.extra_input_features, spec_.preset, " takes ", spec_.extra_input_features,
                  " features beside the latents', got ", extra.size(2), " from ", in.condition_channels.size(1),
                  " condition channels");
      img = torch::cat({img, extra}, 2);
    } else if (spec_.extra_input_features > 0) {
      img = torch::cat({img, extra_inputs(img)}, 2);
    }
    // FLUX.1 Kontext: the reference image's packed latents after the noisy image's, at rotary index 1
    // (FluxKontextPipeline.prepare_latents: image_ids[..., 0] = 1; AI Toolkit's flux_kontext.py does the same).
    const int64_t n = img.size(1);
    if (!in.reference_latents.empty()) {  // the packed parts released once joined, as a plain image's input is
      std::vector<torch::Tensor> parts = {img};
      for (const auto& ref : in.reference_latents) parts.push_back(patchify(ref, p, /*channels_last=*/false));
      img = torch::cat(parts, 1);
    }
    img = x_embedder(img);
    torch::Tensor txt = context_embedder(in.text);
    // The conditioning vector: timestep (x1000), guidance (x1000, FLUX-dev), pooled CLIP text. Each is cast
    // to the latents' dtype before the x1000, as diffusers' FluxTransformer2DModel.forward does (in bf16 the
    // timestep is rounded twice: 0.85 becomes 852).
    const auto scaled = [&](const torch::Tensor& t) { return t.to(img.scalar_type()) * 1000; };
    torch::Tensor temb = timestep_embedder(timestep_embedding(scaled(in.timestep), 256).to(img.scalar_type()));
    if (spec_.guidance_embed && !in.bypass_guidance) {
      TORCH_CHECK(in.guidance.defined(), spec_.preset, " needs a guidance value per sample");
      temb = temb + guidance_embedder(timestep_embedding(scaled(in.guidance), 256).to(img.scalar_type()));
    }
    temb = temb + text_embedder(in.pooled);
    // Rotary positions: text tokens at 0, image tokens at (0, row, column) of the patch grid.
    std::vector<std::array<int64_t, 3>> ids(static_cast<size_t>(txt.size(1)), {0, 0, 0});
    add_image_ids(ids, 0, h / p, w / p);
    for (const auto& ref : in.reference_latents) add_image_ids(ids, 1, ref.size(2) / p, ref.size(3) / p);
    const auto [cos, sin] = rope_cos_sin(ids_tensor(ids, img.device()), spec_.rope_axes, spec_.rope_theta);
    size_t b = 0;
    for (; b < static_cast<size_t>(spec_.double_blocks); ++b) {
      const Tensors out = call_block(b, {img, txt, temb, cos, sin});
      img = out[0], txt = out[1];
    }
    torch::Tensor x = torch::cat({txt, img}, 1);
    for (; b < blocks().size(); ++b) x = call_block(b, {x, temb, cos, sin})[0];
    img = x.narrow(1, txt.size(1), n);  // the noisy image's tokens: the prediction (noise_pred[:, :latent_size])
    return unpatchify(proj_out(norm_out(norm_out_linear, img, temb)), h, w, p, spec_.out_channels, false);
  }

 private:
  // Flex.2's features beyond the latent's, packed as the latent is (2x2 pieces of each channel): an
  // inpainting latent, its one-channel mask and a control latent. Without an inpainting or control input
  // AI Toolkit feeds a zero latent, a mask of ones ("we are technically inpainting everything") and a zero
  // control (flex2.py:462-482). Another width (a user's config.json) gets zeros.
  torch::Tensor extra_inputs(const torch::Tensor& img) const {
    const int64_t latent = img.size(2), mask = spec_.patch * spec_.patch, extra = spec_.extra_input_features;
    torch::Tensor out = torch::zeros({img.size(0), img.size(1), extra}, img.options());
    if (extra == 2 * latent + mask) out.narrow(2, latent, mask).fill_(1);
    return out;
  }

  Linear x_embedder{nullptr}, context_embedder{nullptr}, norm_out_linear{nullptr}, proj_out{nullptr};
  TwoLayerMlp timestep_embedder, guidance_embedder, text_embedder;
};

}  // namespace

std::shared_ptr<DiffusionTransformer> build_transformer(const ModelSpec& spec, const torch::TensorOptions& options) {
  return std::make_shared<FluxTransformer>(spec, options);
}

}  // namespace gclab::model::flux
