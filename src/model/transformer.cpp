#include "gclab/model/transformer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <stdexcept>

#include <unistd.h>

namespace gclab::model {

namespace {

// Two Linears with a SiLU between them (diffusers TimestepEmbedding / PixArtAlphaTextProjection with
// act_fn="silu", DiT's and Z-Image's t_embedder.mlp), registered at first_path and second_path.
struct TwoLayerMlp {
  Linear first{nullptr}, second{nullptr};
  TwoLayerMlp() = default;
  TwoLayerMlp(torch::nn::Module& owner, const std::string& first_path, const std::string& second_path, int64_t in,
              int64_t mid, int64_t out, const torch::TensorOptions& options)
      : first(register_at(owner, first_path, Linear(in, mid, true, options))),
        second(register_at(owner, second_path, Linear(mid, out, true, options))) {}
  torch::Tensor operator()(const torch::Tensor& x) { return second(torch::silu(first(x))); }
};

// A conv patch embedding (SD3 PatchEmbed.proj, DiT x_embedder.proj): a p x p kernel at stride p.
struct PatchConv {
  torch::Tensor weight, bias;
  int64_t patch = 2;
  PatchConv() = default;
  PatchConv(torch::nn::Module& owner, const std::string& path, int64_t in, int64_t out, int64_t p,
            const torch::TensorOptions& options)
      : patch(p) {
    auto& holder = holder_at(owner, path);
    const double bound = 1.0 / std::sqrt(static_cast<double>(in * p * p));
    weight = holder.register_parameter("weight", nn::uniform_parameter({out, in, p, p}, bound, options));
    bias = holder.register_parameter("bias", nn::uniform_parameter({out}, bound, options));
  }
  torch::Tensor operator()(const torch::Tensor& latents) {  // [B, C, H, W] -> [B, (H/p)(W/p), D]
    const torch::Tensor w = weight.scalar_type() == latents.scalar_type() ? weight : weight.to(latents.scalar_type());
    const torch::Tensor b = bias.scalar_type() == latents.scalar_type() ? bias : bias.to(latents.scalar_type());
    return at::conv2d(latents, w, b, {patch, patch}).flatten(2).transpose(1, 2);
  }
};

torch::Tensor ids_tensor(const std::vector<std::array<int64_t, 3>>& rows, const torch::Device& device) {
  torch::Tensor t = torch::empty({static_cast<int64_t>(rows.size()), 3}, torch::kLong);
  auto a = t.accessor<int64_t, 2>();
  for (size_t i = 0; i < rows.size(); ++i)
    for (int j = 0; j < 3; ++j) a[static_cast<int64_t>(i)][j] = rows[i][j];
  return t.to(device);
}

// Image token positions on a (frame, row, column) grid of h x w patches.
void add_image_ids(std::vector<std::array<int64_t, 3>>& ids, int64_t frame, int64_t h, int64_t w, int64_t row0 = 0,
                   int64_t col0 = 0) {
  for (int64_t r = 0; r < h; ++r)
    for (int64_t c = 0; c < w; ++c) ids.push_back({frame, row0 + r, col0 + c});
}

// AdaLayerNormContinuous as the output norm: LN(x) * (1 + scale) + shift, emb = Linear(SiLU(c)) = [scale | shift].
torch::Tensor norm_out(Linear& linear, const torch::Tensor& x, const torch::Tensor& c) {
  const auto ss = linear(torch::silu(c)).chunk(2, 1);
  return modulate(layer_norm(x), ss[1], ss[0]);
}

// ---- FLUX.1 / Flex (diffusers FluxTransformer2DModel) ----------------------------------------------

class FluxTransformer : public DiffusionTransformer {
 public:
  FluxTransformer(const ModelSpec& s, const torch::TensorOptions& o) : DiffusionTransformer(s) {
    const int64_t d = s.hidden, in = s.latent_channels * s.patch * s.patch + s.extra_input_features;
    x_embedder = register_module("x_embedder", Linear(in, d, true, o));
    timestep_embedder = TwoLayerMlp(*this, "time_text_embed.timestep_embedder.linear_1",
                                    "time_text_embed.timestep_embedder.linear_2", 256, d, d, o);
    if (s.guidance_embed)
      guidance_embedder = TwoLayerMlp(*this, "time_text_embed.guidance_embedder.linear_1",
                                      "time_text_embed.guidance_embedder.linear_2", 256, d, d, o);
    text_embedder = TwoLayerMlp(*this, "time_text_embed.text_embedder.linear_1",
                                "time_text_embed.text_embedder.linear_2", s.pooled_dim, d, d, o);
    context_embedder = register_module("context_embedder", Linear(s.text_dim, d, true, o));
    for (int i = 0; i < s.double_blocks; ++i)
      add_block("transformer_blocks." + std::to_string(i),
                std::make_shared<FluxDoubleBlock>(d, s.heads, s.mlp_hidden, o));
    for (int i = 0; i < s.single_blocks; ++i)
      add_block("single_transformer_blocks." + std::to_string(i),
                std::make_shared<FluxSingleBlock>(d, s.heads, s.mlp_hidden, o));
    norm_out_linear = register_at(*this, "norm_out.linear", Linear(d, 2 * d, true, o));
    proj_out = register_module("proj_out", Linear(d, s.patch * s.patch * s.out_channels, true, o));
  }

  torch::Tensor forward(const ModelInputs& in) override {
    const int64_t p = spec_.patch, h = in.latents.size(2), w = in.latents.size(3);
    torch::Tensor img = patchify(in.latents, p, /*channels_last=*/false);
    if (spec_.extra_input_features > 0)  // Flex.2: no inpainting or control input, zeros in their place
      img = torch::cat({img, torch::zeros({img.size(0), img.size(1), spec_.extra_input_features}, img.options())}, 2);
    img = x_embedder(img);
    torch::Tensor txt = context_embedder(in.text);
    // The conditioning vector: timestep (x1000), guidance (x1000, FLUX-dev), pooled CLIP text.
    torch::Tensor temb = timestep_embedder(timestep_embedding(in.timestep * 1000, 256).to(img.scalar_type()));
    if (spec_.guidance_embed && !in.bypass_guidance) {
      TORCH_CHECK(in.guidance.defined(), spec_.preset, " needs a guidance value per sample");
      temb = temb + guidance_embedder(timestep_embedding(in.guidance * 1000, 256).to(img.scalar_type()));
    }
    temb = temb + text_embedder(in.pooled);
    // Rotary positions: text tokens at 0, image tokens at (0, row, column) of the patch grid.
    std::vector<std::array<int64_t, 3>> ids(static_cast<size_t>(txt.size(1)), {0, 0, 0});
    add_image_ids(ids, 0, h / p, w / p);
    const auto [cos, sin] = rope_cos_sin(ids_tensor(ids, img.device()), spec_.rope_axes, spec_.rope_theta);
    size_t b = 0;
    for (; b < static_cast<size_t>(spec_.double_blocks); ++b) {
      const Tensors out = call_block(b, {img, txt, temb, cos, sin});
      img = out[0], txt = out[1];
    }
    torch::Tensor x = torch::cat({txt, img}, 1);
    for (; b < blocks().size(); ++b) x = call_block(b, {x, temb, cos, sin})[0];
    img = x.narrow(1, txt.size(1), img.size(1));
    return unpatchify(proj_out(norm_out(norm_out_linear, img, temb)), h, w, p, spec_.out_channels, false);
  }

 private:
  Linear x_embedder{nullptr}, context_embedder{nullptr}, norm_out_linear{nullptr}, proj_out{nullptr};
  TwoLayerMlp timestep_embedder, guidance_embedder, text_embedder;
};

// ---- Qwen-Image (diffusers QwenImageTransformer2DModel) --------------------------------------------

class QwenImageTransformer : public DiffusionTransformer {
 public:
  QwenImageTransformer(const ModelSpec& s, const torch::TensorOptions& o) : DiffusionTransformer(s) {
    const int64_t d = s.hidden;
    img_in = register_module("img_in", Linear(s.latent_channels * s.patch * s.patch, d, true, o));
    txt_norm = register_module("txt_norm", RMSNorm(s.text_dim, 1e-6, true, o));
    txt_in = register_module("txt_in", Linear(s.text_dim, d, true, o));
    timestep_embedder = TwoLayerMlp(*this, "time_text_embed.timestep_embedder.linear_1",
                                    "time_text_embed.timestep_embedder.linear_2", 256, d, d, o);
    for (int i = 0; i < s.double_blocks; ++i)
      add_block("transformer_blocks." + std::to_string(i),
                std::make_shared<QwenImageBlock>(d, s.heads, s.mlp_hidden, o));
    norm_out_linear = register_at(*this, "norm_out.linear", Linear(d, 2 * d, true, o));
    proj_out = register_module("proj_out", Linear(d, s.patch * s.patch * s.out_channels, true, o));
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
    const torch::Tensor temb = timestep_embedder(timestep_embedding(in.timestep * 1000, 256).to(img.scalar_type()));
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
      const torch::Tensor t0 = torch::zeros_like(in.timestep);
      extra = {ref.view({1, -1, 1}), timestep_embedder(timestep_embedding(t0, 256).to(img.scalar_type()))};
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

// ---- Z-Image (diffusers ZImageTransformer2DModel) --------------------------------------------------

class ZImageTransformer : public DiffusionTransformer {
 public:
  ZImageTransformer(const ModelSpec& s, const torch::TensorOptions& o) : DiffusionTransformer(s) {
    const int64_t d = s.hidden, patch_dim = s.latent_channels * s.patch * s.patch;
    x_embedder = register_at(*this, "all_x_embedder.2-1", Linear(patch_dim, d, true, o));
    final_linear = register_at(*this, "all_final_layer.2-1.linear", Linear(d, patch_dim, true, o));
    final_adaLN = register_at(*this, "all_final_layer.2-1.adaLN_modulation.1", Linear(s.adaln_dim, d, true, o));
    t_embedder = TwoLayerMlp(*this, "t_embedder.mlp.0", "t_embedder.mlp.2", 256, s.t_embed_mid, s.adaln_dim, o);
    cap_norm = register_at(*this, "cap_embedder.0", RMSNorm(s.text_dim, 1e-5, true, o));
    cap_linear = register_at(*this, "cap_embedder.1", Linear(s.text_dim, d, true, o));
    x_pad_token = register_parameter("x_pad_token", nn::normal_parameter({1, d}, 0.02, o));
    cap_pad_token = register_parameter("cap_pad_token", nn::normal_parameter({1, d}, 0.02, o));
    for (int i = 0; i < s.refiner_blocks; ++i)
      add_block("noise_refiner." + std::to_string(i),
                std::make_shared<ZImageBlock>(d, s.heads, s.mlp_hidden, s.adaln_dim, true, o));
    for (int i = 0; i < s.refiner_blocks; ++i)
      add_block("context_refiner." + std::to_string(i),
                std::make_shared<ZImageBlock>(d, s.heads, s.mlp_hidden, s.adaln_dim, false, o));
    for (int i = 0; i < s.single_blocks; ++i)
      add_block("layers." + std::to_string(i),
                std::make_shared<ZImageBlock>(d, s.heads, s.mlp_hidden, s.adaln_dim, true, o));
  }

  // gclab's flow convention in, Z-Image's out: the real model takes t = 1 - sigma and predicts x0 - noise
  // (its pipeline passes (1000 - t) / 1000 and negates the output), so the input is flipped here and the
  // prediction negated, and training and sampling see the velocity noise - x0 as for every family.
  torch::Tensor forward(const ModelInputs& in) override {
    const int64_t p = spec_.patch, h = in.latents.size(2), w = in.latents.size(3), gh = h / p, gw = w / p;
    const int64_t n_img = gh * gw, n_img_padded = padded(n_img), n_cap = in.text.size(1), n_cap_padded = padded(n_cap);
    torch::Tensor x = x_embedder(patchify(in.latents, p, /*channels_last=*/true));
    // Both sequences are padded to a multiple of 32 (SEQ_MULTI_OF) with their learned pad tokens.
    x = pad_with(x, x_pad_token, n_img_padded);
    torch::Tensor cap = pad_with(cap_linear(cap_norm(in.text)), cap_pad_token, n_cap_padded);
    const torch::Tensor adaln = t_embedder(timestep_embedding((1.0 - in.timestep) * 1000, 256).to(x.scalar_type()));
    // Positions: caption token j at (1 + j, 0, 0), its padding included; the image at frame
    // n_cap_padded + 1, (row, column); the image's padding at 0.
    std::vector<std::array<int64_t, 3>> cap_ids, img_ids;
    for (int64_t j = 0; j < n_cap_padded; ++j) cap_ids.push_back({1 + j, 0, 0});
    add_image_ids(img_ids, n_cap_padded + 1, gh, gw);
    img_ids.resize(static_cast<size_t>(n_img_padded), {0, 0, 0});
    const auto [img_cos, img_sin] = rope_cos_sin(ids_tensor(img_ids, x.device()), spec_.rope_axes, spec_.rope_theta);
    const auto [cap_cos, cap_sin] = rope_cos_sin(ids_tensor(cap_ids, x.device()), spec_.rope_axes, spec_.rope_theta);
    size_t b = 0;
    for (int i = 0; i < spec_.refiner_blocks; ++i, ++b) x = call_block(b, {x, adaln, img_cos, img_sin})[0];
    for (int i = 0; i < spec_.refiner_blocks; ++i, ++b) cap = call_block(b, {cap, cap_cos, cap_sin})[0];
    torch::Tensor unified = torch::cat({x, cap}, 1);
    const torch::Tensor cos = torch::cat({img_cos, cap_cos}, 0), sin = torch::cat({img_sin, cap_sin}, 0);
    for (; b < blocks().size(); ++b) unified = call_block(b, {unified, adaln, cos, sin})[0];
    // FinalLayer: LN(x) * (1 + adaLN(SiLU(c))), then the linear projection back to patches.
    const torch::Tensor scale = 1.0 + final_adaLN(torch::silu(adaln));
    torch::Tensor out = -final_linear(layer_norm(unified.narrow(1, 0, n_img)) * scale.unsqueeze(1));
    return unpatchify(out, h, w, p, spec_.out_channels, /*channels_last=*/true);
  }

 private:
  Linear x_embedder{nullptr}, final_linear{nullptr}, final_adaLN{nullptr}, cap_linear{nullptr};
  RMSNorm cap_norm{nullptr};
  TwoLayerMlp t_embedder;
  torch::Tensor x_pad_token, cap_pad_token;

  static int64_t padded(int64_t n) { return (n + 31) / 32 * 32; }
  // The sequence with `token` appended up to `length` tokens.
  static torch::Tensor pad_with(const torch::Tensor& seq, const torch::Tensor& token, int64_t length) {
    if (length == seq.size(1)) return seq;
    const auto pad = token.to(seq.scalar_type()).unsqueeze(0).expand({seq.size(0), length - seq.size(1), -1});
    return torch::cat({seq, pad}, 1);
  }
};

// ---- SD3.5 (diffusers SD3Transformer2DModel) -------------------------------------------------------

class SD3Transformer : public DiffusionTransformer {
 public:
  SD3Transformer(const ModelSpec& s, const torch::TensorOptions& o) : DiffusionTransformer(s) {
    const int64_t d = s.hidden;
    pos_embed = PatchConv(*this, "pos_embed.proj", s.latent_channels, d, s.patch, o);
    timestep_embedder = TwoLayerMlp(*this, "time_text_embed.timestep_embedder.linear_1",
                                    "time_text_embed.timestep_embedder.linear_2", 256, d, d, o);
    text_embedder = TwoLayerMlp(*this, "time_text_embed.text_embedder.linear_1",
                                "time_text_embed.text_embedder.linear_2", s.pooled_dim, d, d, o);
    context_embedder = register_module("context_embedder", Linear(s.text_dim, d, true, o));
    for (int i = 0; i < s.double_blocks; ++i)
      add_block("transformer_blocks." + std::to_string(i),
                std::make_shared<SD3JointBlock>(d, s.heads, s.mlp_hidden, i == s.double_blocks - 1, o));
    norm_out_linear = register_at(*this, "norm_out.linear", Linear(d, 2 * d, true, o));
    proj_out = register_module("proj_out", Linear(d, s.patch * s.patch * s.out_channels, true, o));
  }

  torch::Tensor forward(const ModelInputs& in) override {
    const int64_t p = spec_.patch, h = in.latents.size(2), w = in.latents.size(3), gh = h / p, gw = w / p;
    TORCH_CHECK(gh <= spec_.pos_embed_max && gw <= spec_.pos_embed_max, spec_.preset, ": a ", gh, "x", gw,
                " patch grid exceeds the position embedding's ", spec_.pos_embed_max);
    // PatchEmbed: the fixed sin-cos table of the largest grid, centre-cropped to this one.
    const double scale = static_cast<double>(spec_.pos_embed_max) / static_cast<double>(spec_.sd3_base_size);
    const torch::Tensor pos =
        sincos_2d(gh, gw, spec_.hidden, scale, (spec_.pos_embed_max - gh) / 2, (spec_.pos_embed_max - gw) / 2);
    torch::Tensor img = pos_embed(in.latents);
    img = img + pos.to(img.device(), img.scalar_type()).unsqueeze(0);
    torch::Tensor txt = context_embedder(in.text);
    const torch::Tensor temb =
        timestep_embedder(timestep_embedding(in.timestep * 1000, 256).to(img.scalar_type())) + text_embedder(in.pooled);
    for (size_t b = 0; b < blocks().size(); ++b) {
      const Tensors out = call_block(b, {img, txt, temb});
      img = out[0], txt = out[1];
    }
    return unpatchify(proj_out(norm_out(norm_out_linear, img, temb)), h, w, p, spec_.out_channels, true);
  }

 private:
  PatchConv pos_embed;
  TwoLayerMlp timestep_embedder, text_embedder;
  Linear context_embedder{nullptr}, norm_out_linear{nullptr}, proj_out{nullptr};
};

// ---- DiT (facebookresearch/DiT models.py) ----------------------------------------------------------

class DiTTransformer : public DiffusionTransformer {
 public:
  DiTTransformer(const ModelSpec& s, const torch::TensorOptions& o) : DiffusionTransformer(s) {
    const int64_t d = s.hidden;
    x_embedder = PatchConv(*this, "x_embedder.proj", s.latent_channels, d, s.patch, o);
    t_embedder = TwoLayerMlp(*this, "t_embedder.mlp.0", "t_embedder.mlp.2", 256, d, d, o);
    // One extra row: the "null" class that classifier-free guidance drops labels to.
    y_table = holder_at(*this, "y_embedder")
                  .register_parameter("embedding_table", nn::normal_parameter({s.num_classes + 1, d}, 0.02, o));
    for (int i = 0; i < s.single_blocks; ++i)
      add_block("blocks." + std::to_string(i), std::make_shared<DiTBlock>(d, s.heads, s.mlp_hidden, o));
    final_linear = register_at(*this, "final_layer.linear", Linear(d, s.patch * s.patch * s.out_channels, true, o));
    final_adaLN = register_at(*this, "final_layer.adaLN_modulation.1", Linear(d, 2 * d, true, o));
  }

  torch::Tensor forward(const ModelInputs& in) override {
    const int64_t p = spec_.patch, h = in.latents.size(2), w = in.latents.size(3);
    torch::Tensor x = x_embedder(in.latents);
    x = x + sincos_2d(h / p, w / p, spec_.hidden).to(x.device(), x.scalar_type()).unsqueeze(0);
    torch::Tensor labels = in.class_labels.defined() ? in.class_labels
                                                     : torch::full({x.size(0)}, spec_.num_classes,
                                                                   torch::dtype(torch::kLong).device(x.device()));
    const torch::Tensor c =
        t_embedder(timestep_embedding(in.timestep * 1000, 256).to(x.scalar_type())) + y_table.index_select(0, labels);
    for (size_t b = 0; b < blocks().size(); ++b) x = call_block(b, {x, c})[0];
    const auto ss = final_adaLN(torch::silu(c)).chunk(2, 1);  // shift, scale
    return unpatchify(final_linear(modulate(layer_norm(x), ss[0], ss[1])), h, w, p, spec_.out_channels, true);
  }

 private:
  PatchConv x_embedder;
  TwoLayerMlp t_embedder;
  torch::Tensor y_table;
  Linear final_linear{nullptr}, final_adaLN{nullptr};
};

}  // namespace

ModelInputs DiffusionTransformer::example_inputs(int64_t batch, int64_t height, int64_t width, int64_t n_text,
                                                 const torch::TensorOptions& options) const {
  ModelInputs in;
  const torch::TensorOptions f = options.has_dtype() ? options : options.dtype(torch::kFloat);
  in.latents = torch::randn({batch, spec_.latent_channels, height / 8, width / 8}, f);
  in.timestep = torch::rand({batch}, f);
  if (spec_.text_dim) {
    const int64_t t = n_text > 0 ? n_text : encoder_tokens(spec_, 16);
    in.text = torch::randn({batch, t, spec_.text_dim}, f);
  }
  if (spec_.pooled_dim) in.pooled = torch::randn({batch, spec_.pooled_dim}, f);
  if (spec_.guidance_embed) in.guidance = torch::full({batch}, 3.5, f);
  if (spec_.num_classes) in.class_labels = torch::randint(spec_.num_classes, {batch}, f.dtype(torch::kLong));
  return in;
}

std::shared_ptr<DiffusionTransformer> build_transformer(const ModelSpec& spec, const torch::TensorOptions& options) {
  if (spec.family == Family::flux) return std::make_shared<FluxTransformer>(spec, options);
  if (spec.family == Family::qwen_image) return std::make_shared<QwenImageTransformer>(spec, options);
  if (spec.family == Family::zimage) return std::make_shared<ZImageTransformer>(spec, options);
  if (spec.family == Family::sd3) return std::make_shared<SD3Transformer>(spec, options);
  if (spec.family == Family::dit) return std::make_shared<DiTTransformer>(spec, options);
  throw std::invalid_argument("no transformer for family '" + std::string(config::name_of(spec.family)) + "'");
}

void check_fits_in_host_memory(const ModelSpec& spec, const std::string& what) {
  const int64_t params = parameter_count(*build_transformer(spec, torch::TensorOptions().device(torch::kMeta)));
  const int64_t bytes = 4 * params;  // built in float32 before any conversion
  const int64_t physical = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  if (physical > 0 && bytes > physical / 2)
    throw std::invalid_argument(what + ": " + spec.preset + " (" + std::to_string(params) + " parameters, " +
                                std::to_string(bytes >> 30) + " GiB in float32) does not fit this machine's memory (" +
                                std::to_string(physical >> 30) +
                                " GiB); run it on a GPU (device: cuda), or use a tiny-* "
                                "preset; `gclab estimate` predicts its memory without building it");
}

int64_t parameter_count(const torch::nn::Module& model) {
  int64_t n = 0;
  for (const auto& p : model.parameters()) n += p.numel();
  return n;
}

int64_t trainable_parameter_count(const torch::nn::Module& model) {
  int64_t n = 0;
  for (const auto& p : model.parameters())
    if (p.requires_grad()) n += p.numel();
  return n;
}

}  // namespace gclab::model
