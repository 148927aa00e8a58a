// The test tree's video family (issue 47): a tiny text-to-video transformer built as diffusers'
// WanTransformer3DModel is — a 3-D patch embedding (1, 2, 2) over frames x height x width, 3-D rotary
// positions (frame, row, column), self-attention, cross-attention to the text, a GELU(tanh) FFN, a global
// time projection plus each block's own modulation table — with its own text pipeline (T5, the padding rows
// zeroed as WanPipeline's _get_t5_prompt_embeds does), its own guidance rule (classifier-free guidance in
// two forwards, as WanPipeline runs the conditional and unconditional passes) and a causal video
// autoencoder (Qwen-Image's, which encodes 1 + 4k frames to 1 + k latent frames as the Wan 2.1 VAE it derives
// from). It is this folder and one registration line (tests/families/registry.cpp); nothing in src/ names it,
// and reel_test.cpp (here too) trains it on clips, previews several frames, estimates and fits it.
#include "reel/reel.h"

#include <nlohmann/json.hpp>

#include "gclab/config/user_error.h"
#include "gclab/nn/meta_kernels.h"
#include "gclab/vae/qwen_image_vae.h"
#include "model/transformer_parts.h"

namespace gclab::model::reel {
namespace {

const Family kReelId("reel");

// LayerNorm with an affine weight and bias (Wan's norm2 before the cross-attention: cross_attn_norm).
struct AffineNorm {
  torch::Tensor weight, bias;
  AffineNorm() = default;
  AffineNorm(torch::nn::Module& owner, const std::string& path, int64_t dim, const torch::TensorOptions& o) {
    auto& holder = holder_at(owner, path);
    weight = holder.register_parameter("weight", torch::ones({dim}, o));
    bias = holder.register_parameter("bias", torch::zeros({dim}, o));
  }
  torch::Tensor operator()(const torch::Tensor& x) const {
    return nn::layer_norm(x, weight.to(x.scalar_type()), bias.to(x.scalar_type()), 1e-6);
  }
};

// Attention from the video tokens to the text (Wan's attn2): q from x, k and v from the text, RMS QK-norms.
class CrossAttentionImpl : public torch::nn::Module {
 public:
  CrossAttentionImpl(int64_t dim, int64_t heads, const torch::TensorOptions& o) : heads_(heads) {
    to_q = register_at(*this, "to_q", Linear(LinearOptions(dim, dim).tensor_options(o)));
    to_k = register_at(*this, "to_k", Linear(LinearOptions(dim, dim).tensor_options(o)));
    to_v = register_at(*this, "to_v", Linear(LinearOptions(dim, dim).tensor_options(o)));
    to_out = register_at(*this, "to_out.0", Linear(LinearOptions(dim, dim).tensor_options(o)));
    norm_q = register_module("norm_q", RMSNorm(dim, 1e-6, true, o));
    norm_k = register_module("norm_k", RMSNorm(dim, 1e-6, true, o));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& text) {
    // The text's one use in the block: k's and v's gradients meet at this view, so the text's gradient sums
    // the blocks' in the same order whether a block is checkpointed (its recompute returns one sum) or not —
    // checkpointing changes the gradients by not a bit.
    const torch::Tensor context = text.view_as(text);
    const torch::Tensor q = split_heads(norm_q(to_q(x)), heads_);
    const torch::Tensor k = split_heads(norm_k(to_k(context)), heads_);
    const torch::Tensor v = split_heads(to_v(context), heads_);
    return to_out(merge_heads(nn::attention(q, k, v)).to(x.scalar_type()));
  }

 private:
  int64_t heads_;
  Linear to_q{nullptr}, to_k{nullptr}, to_v{nullptr}, to_out{nullptr};
  RMSNorm norm_q{nullptr}, norm_k{nullptr};
};
TORCH_MODULE(CrossAttention);

// Wan's block: its scale_shift_table [1, 6, D] plus the time projection [B, 6, D] give shift, scale and gate
// for the self-attention and for the FFN; the cross-attention runs on its own affine-normed input.
// Inputs {x, e (the time projection), text, cos, sin} -> {x}.
class ReelBlock : public TransformerBlock {
 public:
  ReelBlock(int64_t dim, int64_t heads, int64_t ffn, const torch::TensorOptions& o) {
    table = register_parameter("scale_shift_table", torch::randn({1, 6, dim}, o) / std::sqrt(static_cast<double>(dim)));
    attn1 = register_module("attn1", SelfAttention(dim, heads, /*bias=*/true, /*out_proj=*/true, 1e-6, o));
    attn2 = register_module("attn2", CrossAttention(dim, heads, o));
    norm2 = AffineNorm(*this, "norm2", dim, o);
    ffn_ = register_module("ffn", GeluFeedForward(dim, ffn, o));
  }
  std::vector<Linear> modulation_linears() override { return {}; }  // the table is a parameter, no Linear
  Tensors forward_block(const Tensors& in, const SubBlockRunner& run) override {
    const torch::Tensor mod = (table.to(in[1].scalar_type()) + in[1]);
    const torch::Tensor h = run(SubBlock::attn,
                                [this](const Tensors& t) {
                                  const auto m = t[1].chunk(6, 1);  // each [B, 1, D]
                                  const torch::Tensor a = attn1(layer_norm(t[0]) * (1 + m[1]) + m[0], t[3], t[4]);
                                  const torch::Tensor x = t[0] + a * m[2];
                                  return Tensors{x + attn2(norm2(x), t[2])};
                                },
                                {in.at(0), mod, in.at(2), in.at(3), in.at(4)})[0];
    return run(SubBlock::mlp,
               [this](const Tensors& t) {
                 const auto m = t[1].chunk(6, 1);
                 return Tensors{t[0] + ffn_(layer_norm(t[0]) * (1 + m[4]) + m[3]) * m[5]};
               },
               {h, mod});
  }

 private:
  torch::Tensor table;
  SelfAttention attn1{nullptr};
  CrossAttention attn2{nullptr};
  AffineNorm norm2;
  GeluFeedForward ffn_{nullptr};
};

class ReelTransformer : public DiffusionTransformer {
 public:
  ReelTransformer(const ModelSpec& s, const torch::TensorOptions& o) : DiffusionTransformer(s) {
    // Wan's Conv3d patch embedding with kernel = stride = (1, p, p), as the matmul it is over each frame's
    // p x p patches (c, i, j order: the kernel's).
    TORCH_CHECK(s.patch_frames == 1, "the reel family patches each frame: patch_frames 1, got ", s.patch_frames);
    const int64_t d = s.hidden, cell = s.patch * s.patch;
    patch_embedding =
        register_at(*this, "patch_embedding", Linear(LinearOptions(cell * s.latent_channels, d).tensor_options(o)));
    time_embedder = TwoLayerMlp(*this, "condition_embedder.time_embedder.linear_1",
                                "condition_embedder.time_embedder.linear_2", 256, d, d, o);
    time_proj = register_at(*this, "condition_embedder.time_proj", Linear(LinearOptions(d, 6 * d).tensor_options(o)));
    text_1 = register_at(*this, "condition_embedder.text_embedder.linear_1",
                         Linear(LinearOptions(s.text_dim, d).tensor_options(o)));
    text_2 =
        register_at(*this, "condition_embedder.text_embedder.linear_2", Linear(LinearOptions(d, d).tensor_options(o)));
    for (int i = 0; i < s.single_blocks; ++i)
      add_block("blocks." + std::to_string(i), std::make_shared<ReelBlock>(d, s.heads, s.mlp_hidden, o));
    out_table = register_parameter("scale_shift_table", torch::randn({1, 2, d}, o) / std::sqrt(static_cast<double>(d)));
    proj_out = register_at(*this, "proj_out", Linear(LinearOptions(d, cell * s.out_channels).tensor_options(o)));
  }

  // Latents [B, C, F, H, W] (F latent frames): each frame cut into p x p patches, the frames' tokens one
  // sequence in (frame, row, column) order, each token rotated by its three positions.
  torch::Tensor forward(const ModelInputs& in) override {
    const int64_t b = in.latents.size(0), f = in.latents.size(2), h = in.latents.size(3), w = in.latents.size(4);
    const int64_t p = spec_.patch, c = spec_.latent_channels;
    const torch::Tensor frames = in.latents.transpose(1, 2).flatten(0, 1);  // [B*F, C, H, W]
    torch::Tensor x = patch_embedding(patchify(frames, p, /*channels_last=*/false).reshape({b, -1, c * p * p}));
    std::vector<std::array<int64_t, 3>> ids;
    for (int64_t t = 0; t < f; ++t) add_image_ids(ids, t, h / p, w / p);
    const auto [cos, sin] = rope_cos_sin(ids_tensor(ids, x.device()), spec_.rope_axes, spec_.rope_theta);
    const torch::Tensor temb = time_embedder(timestep_embedding(in.timestep * 1000, 256).to(x.scalar_type()));
    const torch::Tensor e = time_proj(torch::silu(temb)).unflatten(1, {6, spec_.hidden});  // [B, 6, D]
    const torch::Tensor text =
        text_2(torch::gelu(text_1(in.text.to(x.scalar_type())), "tanh"));  // PixArtAlphaTextProjection
    for (size_t i = 0; i < blocks().size(); ++i) x = call_block(i, {x, e, text, cos, sin})[0];
    const auto ss = (out_table.to(x.scalar_type()) + temb.unsqueeze(1)).chunk(2, 1);  // shift, scale
    torch::Tensor out = proj_out(layer_norm(x) * (1 + ss[1]) + ss[0]);
    out = unpatchify(out.reshape({b * f, -1, out.size(-1)}), h, w, p, spec_.out_channels, /*channels_last=*/false);
    return out.unflatten(0, {b, f}).transpose(1, 2);
  }

 private:
  Linear patch_embedding{nullptr}, time_proj{nullptr}, text_1{nullptr}, text_2{nullptr}, proj_out{nullptr};
  TwoLayerMlp time_embedder;
  torch::Tensor out_table;
};

// Its text pipeline: T5 on the bare caption, cut and padded to the text length with the mask passed; the
// real tokens' rows kept and the rest zeros (WanPipeline._get_t5_prompt_embeds: u[:v], then new_zeros up to
// max_sequence_length) — every prompt the same length.
class ReelText final : public text::ZeroPaddedPipeline {
 public:
  ReelText() : ZeroPaddedPipeline(config::TextEncoderKind::t5_xxl) {}
};

// Its guidance: classifier-free guidance above 1, the conditional and unconditional passes as two forwards
// of one sample (WanPipeline's two transformer calls a step): half the activations of a batch of two.
class ReelGuidance final : public Guidance {
 public:
  bool one_batch() const override { return false; }
};

ModelSpec tiny_reel() {
  ModelSpec s;
  s.preset = "tiny-reel";
  s.family = kReelId;
  s.tiny = true;
  s.hidden = 64, s.heads = 2, s.head_dim = 32, s.mlp_hidden = 128;
  s.single_blocks = 3;
  s.latent_channels = 16, s.out_channels = 16, s.patch = 2, s.patch_frames = 1;
  s.latent_spatial = 8, s.latent_temporal = 4;  // the causal video autoencoder: 1 + 4k frames -> 1 + k
  s.rope_axes = {8, 12, 12};                    // frame, row, column: the head's 32
  s.text_dim = 64, s.max_text_tokens = 16;
  s.divisibility = 16, s.preview_divisibility = 16;
  return s;
}

class Reel final : public ModelFamily {
 public:
  Family id() const override { return kReelId; }
  std::shared_ptr<DiffusionTransformer> build_transformer(const ModelSpec& spec,
                                                          const torch::TensorOptions& options) const override {
    return std::make_shared<ReelTransformer>(spec, options);
  }
  std::string describe_blocks(const ModelSpec& s) const override {
    return std::to_string(s.single_blocks) + " video (self + cross attention)";
  }
  std::vector<ArchFacts> archs() const override {
    return {{"tiny-reel",
             kReelId,
             "tiny-reel",
             true,
             "",
             "",
             TransformerLoading::on_device_unless_low_vram,
             {"Reel-Video"}}};
  }
  std::vector<ModelSpec> presets() const override { return {tiny_reel()}; }

  vae::AutoencoderConfig autoencoder(const ModelSpec&) const override { return vae::QwenImageVaeConfig::tiny(); }
  std::shared_ptr<const text::TextPipeline> text_pipeline() const override { return std::make_shared<ReelText>(); }
  std::shared_ptr<const Guidance> preview_guidance(const ModelSpec&, bool) const override {
    return std::make_shared<ReelGuidance>();
  }

  int64_t encoder_tokens(const ModelSpec& spec, int64_t) const override { return spec.max_text_tokens; }
  int64_t sequence_rows(const ModelSpec& spec, int64_t) const override { return spec.max_text_tokens; }
  int64_t text_tokens(const ModelSpec&, int64_t) const override { return 0; }  // cross-attended, not in the sequence

  std::string diffusers_class() const override { return "ReelTransformer3DModel"; }
  nlohmann::ordered_json diffusers_config(const ModelSpec& s) const override {
    return {{"_class_name", "ReelTransformer3DModel"},
            {"num_attention_heads", s.heads},
            {"attention_head_dim", s.head_dim},
            {"num_layers", s.single_blocks},
            {"ffn_dim", s.mlp_hidden},
            {"text_dim", s.text_dim},
            {"in_channels", s.latent_channels},
            {"patch_size", {s.patch_frames, s.patch, s.patch}}};
  }
  void read_diffusers_config(ModelSpec& s, const nlohmann::json& c) const override {
    using families_shared::config_int;
    s.heads = config_int(c, "num_attention_heads", s.heads);
    s.head_dim = config_int(c, "attention_head_dim", s.head_dim);
    s.hidden = s.heads * s.head_dim;
    s.single_blocks = static_cast<int>(config_int(c, "num_layers", s.single_blocks));
    s.mlp_hidden = config_int(c, "ffn_dim", s.mlp_hidden);
    s.text_dim = config_int(c, "text_dim", s.text_dim);
    s.latent_channels = s.out_channels = config_int(c, "in_channels", s.latent_channels);
    if (c.contains("patch_size")) {
      const auto p = c.at("patch_size").get<std::vector<int64_t>>();
      if (p.size() != 3 || p[0] != 1 || p[1] != p[2])
        throw UserError("patch_size must be [1, p, p] (each frame patched alone), got " + c.at("patch_size").dump());
      s.patch_frames = p[0], s.patch = p[1];
    }
  }
  void read_tensor_shapes(ModelSpec&, const TensorShapes& t) const override {
    throw UserError(t.file() + ": the reel family reads its shape from a config.json only");
  }
};

}  // namespace

const ModelFamily& reel_family() {
  static const Reel family;
  return family;
}

}  // namespace gclab::model::reel
