// FLUX.2's transformer as AI Toolkit trains it: its copy of Black Forest Labs' code
// (extensions_built_in/diffusion_models/flux2/src/model.py), in those names — no biases, one modulation
// Linear per stream kind shared by every block (double_stream_modulation_img / _txt, single_stream_modulation),
// SwiGLU MLPs at 3x the width, QK norms by BFL's own RMSNorm, RoPE over four axes of 32 (t, h, w, l) at
// theta 2000 in float32, no attention mask. The same function as diffusers' Flux2Transformer2DModel after
// diffusers' own key conversion (tests/reference/diffusers_flux2.py).
#include "model/families/bfl/blocks.h"

namespace gclab::model::flux2 {
namespace {

const bfl::BlockOptions kBlocks{/*bias=*/false, /*swiglu=*/true, /*functional_rms_norm=*/false,
                                /*joins_rope_tables=*/true};

// timestep_embedding (model.py:476-499): its frequencies made on t's device.
torch::Tensor embed_time(const torch::Tensor& t) {
  return bfl::timestep_embedding(t, 256, /*frequencies_on_cpu=*/false);
}

class Flux2Transformer : public DiffusionTransformer {
 public:
  Flux2Transformer(const ModelSpec& s, const torch::TensorOptions& o) : DiffusionTransformer(s) {
    const int64_t d = s.hidden, channels = s.latent_channels * s.patch * s.patch;
    auto linear = [&](const std::string& path, int64_t in, int64_t out) {
      return register_at(*this, path, Linear(LinearOptions(in, out).bias(false).tensor_options(o)));
    };
    img_in = linear("img_in", channels, d);
    time_in = {linear("time_in.in_layer", 256, d), linear("time_in.out_layer", d, d)};
    txt_in = linear("txt_in", s.text_dim, d);
    if (s.guidance_embed) guidance_in = {linear("guidance_in.in_layer", 256, d), linear("guidance_in.out_layer", d, d)};
    for (int i = 0; i < s.double_blocks; ++i)
      add_block("double_blocks." + std::to_string(i),
                std::make_shared<bfl::DoubleBlock>(d, s.heads, s.mlp_hidden, kBlocks, o));
    for (int i = 0; i < s.single_blocks; ++i)
      add_block("single_blocks." + std::to_string(i),
                std::make_shared<bfl::SingleBlock>(d, s.heads, s.mlp_hidden, kBlocks, o));
    mod_img = linear("double_stream_modulation_img.lin", d, 6 * d);
    mod_txt = linear("double_stream_modulation_txt.lin", d, 6 * d);
    mod_single = linear("single_stream_modulation.lin", d, 3 * d);
    final_mod = linear("final_layer.adaLN_modulation.1", d, 2 * d);
    final_linear = linear("final_layer.linear", d, channels);
  }

  torch::Tensor forward(const ModelInputs& in) override {
    const int64_t h = in.latents.size(2), w = in.latents.size(3), batch = in.latents.size(0);
    const auto dtype = in.latents.scalar_type();
    // Flux2Model.get_noise_prediction (flux2_model.py:440-452): the 0-1000 timestep in the model's dtype,
    // divided by 1000 there; the guidance (FLUX.2-dev's train.cfg_scale, or a preview's scale) in it too.
    const torch::Tensor t = (in.timestep.to(torch::kFloat) * 1000).to(dtype) / 1000;
    torch::Tensor vec = time_in.second(torch::silu(time_in.first(embed_time(t))));
    if (spec_.guidance_embed && !in.bypass_guidance) {
      TORCH_CHECK(in.guidance.defined(), spec_.preset, " needs a guidance value per sample");
      vec = vec + guidance_in.second(torch::silu(guidance_in.first(embed_time(in.guidance.to(dtype)))));
    }
    // Modulation (model.py:226-241): each Linear once on silu(vec), its output in 6 (3) chunks every block takes.
    const torch::Tensor silu_vec = torch::silu(vec);
    const torch::Tensor img_mods = mod_img(silu_vec).unflatten(-1, {6, spec_.hidden});
    const torch::Tensor txt_mods = mod_txt(silu_vec).unflatten(-1, {6, spec_.hidden});
    const torch::Tensor single_mods = mod_single(silu_vec).unflatten(-1, {3, spec_.hidden});
    // batched_prc_img: one token per latent pixel, ids (0, row, column, 0); each reference image's tokens
    // after them at t = 10 + 10 k (sampling.py:53-89), its own grid from 0; text ids (0, 0, 0, l).
    std::vector<torch::Tensor> parts = {in.latents.flatten(2).transpose(1, 2)};
    for (const auto& ref : in.reference_latents) parts.push_back(ref.flatten(2).transpose(1, 2));
    torch::Tensor img = img_in(parts.size() == 1 ? parts[0] : torch::cat(parts, 1));
    parts.clear();
    torch::Tensor txt = txt_in(in.text);
    const int64_t n_img = h * w, n_txt = txt.size(1);
    torch::Tensor ids = torch::zeros({n_txt + img.size(1), 4}, torch::kLong);
    ids.narrow(0, 0, n_txt).select(1, 3).copy_(torch::arange(n_txt));
    int64_t row = n_txt;
    auto grid = [&](int64_t time, int64_t gh, int64_t gw) {
      torch::Tensor g = ids.narrow(0, row, gh * gw);
      g.select(1, 0).fill_(time);
      g.select(1, 1).copy_(torch::arange(gh).repeat_interleave(gw));
      g.select(1, 2).copy_(torch::arange(gw).repeat({gh}));
      row += gh * gw;
    };
    grid(0, h, w);
    for (size_t k = 0; k < in.reference_latents.size(); ++k)
      grid(10 + 10 * static_cast<int64_t>(k), in.reference_latents[k].size(2), in.reference_latents[k].size(3));
    // The rotations in float32 from the int64 ids, per sample: the image's and the text's tables apart
    // (pe_x, pe_ctx), joined in each double block and once for the single blocks (model.py:161-196).
    // The ids on the device for the whole forward, as AI Toolkit's x_ids / ctx_ids; the host copy goes.
    torch::Tensor batched = ids.to(img.device()).unsqueeze(0).repeat({batch, 1, 1});
    ids.reset();
    const torch::Tensor pe_txt = bfl::rope_table(batched.narrow(1, 0, n_txt), spec_.rope_axes, spec_.rope_theta);
    const torch::Tensor pe_img =
        bfl::rope_table(batched.narrow(1, n_txt, img.size(1)), spec_.rope_axes, spec_.rope_theta);
    size_t b = 0;
    for (; b < static_cast<size_t>(spec_.double_blocks); ++b) {
      const Tensors out = call_block(b, {img, txt, img_mods, txt_mods, pe_img, pe_txt});
      img = out[0], txt = out[1];
    }
    torch::Tensor x = torch::cat({txt, img}, 1);
    const torch::Tensor pe = torch::cat({pe_txt, pe_img}, 2);
    for (; b < blocks().size(); ++b) x = call_block(b, {x, single_mods, pe})[0];
    img = x.narrow(1, n_txt, n_img);  // the noisy image's tokens (packed_noise_pred[:, :n])
    // LastLayer (model.py:258-279): shift, then scale.
    const auto ss = final_mod(silu_vec).unsqueeze(1).chunk(2, -1);
    img = final_linear(bfl::shift_scale(layer_norm(img), ss[0], ss[1]));
    return img.transpose(1, 2).unflatten(2, {h, w}).contiguous();  // scatter_ids: [B, C, h, w]
  }

 private:
  Linear img_in{nullptr}, txt_in{nullptr}, mod_img{nullptr}, mod_txt{nullptr}, mod_single{nullptr};
  Linear final_mod{nullptr}, final_linear{nullptr};
  std::pair<Linear, Linear> time_in{nullptr, nullptr}, guidance_in{nullptr, nullptr};
};

}  // namespace

std::shared_ptr<DiffusionTransformer> build_transformer(const ModelSpec& spec, const torch::TensorOptions& options) {
  return std::make_shared<Flux2Transformer>(spec, options);
}

}  // namespace gclab::model::flux2
