// The Wan transformer, diffusers' WanTransformer3DModel (transformer_wan.py) in its naming and layout: a
// Conv3d patch embedding (1, 2, 2) over frames x height x width, 3-D rotary positions (frame, row, column),
// blocks of self-attention, cross-attention to the text (and, Wan 2.1 I2V, to CLIP's image tokens through
// their own keys and values), a GELU(tanh) FFN, each modulated by its own scale_shift_table plus the global
// time projection — the LayerNorms and the modulation in float32, as the reference's FP32LayerNorm and
// `.float()` casts do — and the output norm modulated by the time embedding. Wan 2.2 TI2V's per-token
// timesteps ([B, S]) give per-token modulation.
#include <cmath>
#include <vector>

#include "gclab/nn/activation.h"
#include "gclab/nn/meta_kernels.h"
#include "model/transformer_parts.h"

namespace gclab::model::wan {
namespace {

constexpr double kEps = 1e-6;

// FP32LayerNorm with an affine weight and bias (norm2 under cross_attn_norm; the image embedder's norms):
// the input in float32, the result in the input's dtype.
struct AffineNorm {
  torch::Tensor weight, bias;
  double eps = kEps;
  AffineNorm() = default;
  AffineNorm(torch::nn::Module& owner, const std::string& path, int64_t dim, const torch::TensorOptions& o,
             double eps_ = kEps)
      : eps(eps_) {
    auto& holder = holder_at(owner, path);
    weight = holder.register_parameter("weight", torch::ones({dim}, o));
    bias = holder.register_parameter("bias", torch::zeros({dim}, o));
  }
  torch::Tensor operator()(const torch::Tensor& x) const {
    return nn::layer_norm(x.to(torch::kFloat), weight.to(torch::kFloat), bias.to(torch::kFloat), eps)
        .to(x.scalar_type());
  }
};

// torch.nn.RMSNorm over all heads (WanAttention's norm_q / norm_k / norm_added_k): at::rms_norm, the weight
// applied before the one rounding to the input's dtype (not diffusers' own RMSNorm, which rounds first).
struct AcrossHeadsNorm {
  torch::Tensor weight;
  AcrossHeadsNorm() = default;
  AcrossHeadsNorm(torch::nn::Module& owner, const std::string& path, int64_t dim, const torch::TensorOptions& o)
      : weight(holder_at(owner, path).register_parameter("weight", torch::ones({dim}, o))) {}
  torch::Tensor operator()(const torch::Tensor& x) const { return at::rms_norm(x, {x.size(-1)}, weight, kEps); }
};

// WanAttnProcessor's apply_rotary_emb: interleaved pairs rotated in x's dtype, as AI Toolkit runs it (its
// `.to(dtype)` after from_pretrained casts the rope buffers too): each product rounded, then the sum.
torch::Tensor rotate(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const torch::Tensor c = cos.to(x.scalar_type()).slice(-1, 0, std::nullopt, 2);
  const torch::Tensor s = sin.to(x.scalar_type()).slice(-1, 1, std::nullopt, 2);
  const torch::Tensor x1 = x.slice(-1, 0, std::nullopt, 2), x2 = x.slice(-1, 1, std::nullopt, 2);
  return torch::stack({x1 * c - x2 * s, x1 * s + x2 * c}, -1).flatten(-2);
}

// WanAttention with WanAttnProcessor: q, k, v and to_out.0 with biases, RMS norms over all heads at once
// (qk_norm "rms_norm_across_heads") before the heads are split; rotary positions on q and k for the
// self-attention. The cross-attention's keys come from the context; with added_kv (Wan 2.1 I2V) the
// context's first `image_tokens` rows are the image's, attended through add_k_proj / add_v_proj /
// norm_added_k, the two attentions' outputs summed before to_out.
class WanAttentionImpl : public torch::nn::Module {
 public:
  WanAttentionImpl(int64_t dim, int64_t heads, int64_t added_kv, const torch::TensorOptions& o) : heads_(heads) {
    to_q = register_module("to_q", Linear(LinearOptions(dim, dim).tensor_options(o)));
    to_k = register_module("to_k", Linear(LinearOptions(dim, dim).tensor_options(o)));
    to_v = register_module("to_v", Linear(LinearOptions(dim, dim).tensor_options(o)));
    to_out = register_at(*this, "to_out.0", Linear(LinearOptions(dim, dim).tensor_options(o)));
    norm_q = AcrossHeadsNorm(*this, "norm_q", dim, o);
    norm_k = AcrossHeadsNorm(*this, "norm_k", dim, o);
    if (added_kv > 0) {
      add_k_proj = register_module("add_k_proj", Linear(LinearOptions(added_kv, dim).tensor_options(o)));
      add_v_proj = register_module("add_v_proj", Linear(LinearOptions(added_kv, dim).tensor_options(o)));
      norm_added_k = AcrossHeadsNorm(*this, "norm_added_k", dim, o);
    }
  }
  // Self-attention: context undefined, cos/sin the positions. Cross-attention: the context rows.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& context, const torch::Tensor& cos,
                        const torch::Tensor& sin, int64_t image_tokens = 0) {
    // A tensor read for both k and v is read through one view: its gradient sums the two uses in the same
    // order whether the block is recomputed or not (checkpointing changes the gradients by not a bit).
    const torch::Tensor source = context.defined() ? context.view_as(context) : x;
    const torch::Tensor image = image_tokens > 0 ? source.narrow(1, 0, image_tokens) : torch::Tensor();
    const torch::Tensor text =
        image_tokens > 0 ? source.narrow(1, image_tokens, source.size(1) - image_tokens) : source;
    torch::Tensor q = split_heads(norm_q(to_q(x)), heads_);
    torch::Tensor k = split_heads(norm_k(to_k(text)), heads_);
    const torch::Tensor v = split_heads(to_v(text), heads_);
    if (cos.defined()) q = rotate(q, cos, sin), k = rotate(k, cos, sin);
    torch::Tensor out = merge_heads(nn::attention(q, k, v)).to(q.scalar_type());
    if (image.defined()) {
      const torch::Tensor ki = split_heads(norm_added_k(add_k_proj(image)), heads_);
      const torch::Tensor vi = split_heads(add_v_proj(image), heads_);
      out = merge_heads(nn::attention(q, ki, vi)).to(q.scalar_type()) + out;
    }
    return to_out(out);
  }
  std::vector<Linear> linears() const {
    std::vector<Linear> out = {to_q, to_k, to_v, to_out};
    if (add_k_proj) out.push_back(add_k_proj), out.push_back(add_v_proj);
    return out;
  }

 private:
  int64_t heads_;
  Linear to_q{nullptr}, to_k{nullptr}, to_v{nullptr}, to_out{nullptr}, add_k_proj{nullptr}, add_v_proj{nullptr};
  AcrossHeadsNorm norm_q, norm_k, norm_added_k;
};
TORCH_MODULE(WanAttention);

// The modulation of one block or of the output: `table` [1, n, D] plus the time projection, [B, n, D] or per
// token [B, S, n, D], split into its n rows, each [B, 1, D] or [B, S, D] — in `dtype`: float32 for a block
// (`scale_shift_table + temb.float()`), the model's for the output (its table and temb added as they are).
std::vector<torch::Tensor> modulation(const torch::Tensor& table, const torch::Tensor& e,
                                      torch::ScalarType dtype = torch::kFloat) {
  const int64_t n = table.size(1);
  if (e.dim() == 4) {
    std::vector<torch::Tensor> rows = (table.to(dtype).unsqueeze(0) + e.to(dtype)).chunk(n, 2);
    for (auto& r : rows) r = r.squeeze(2);
    return rows;
  }
  return (table.to(dtype) + e.to(dtype)).chunk(n, 1);
}

// LayerNorm without affine in float32, modulated, in x's dtype (norm1 / norm3 / norm_out).
torch::Tensor modulated_norm(const torch::Tensor& x, const torch::Tensor& shift, const torch::Tensor& scale) {
  return (layer_norm(x.to(torch::kFloat), kEps) * (1 + scale) + shift).to(x.scalar_type());
}

// WanTransformerBlock. Inputs {x, e (the time projection), context, cos, sin} -> {x}: the self- and
// cross-attention one sub-block, the FFN the other.
class WanBlock : public TransformerBlock {
 public:
  WanBlock(const ModelSpec& s, const torch::TensorOptions& o) : image_tokens_(s.image_embed_tokens) {
    const int64_t d = s.hidden;
    table = register_parameter("scale_shift_table", torch::randn({1, 6, d}, o).div_(std::sqrt(static_cast<double>(d))));
    attn1 = register_module("attn1", WanAttention(d, s.heads, 0, o));
    attn2 = register_module("attn2", WanAttention(d, s.heads, s.image_embed_dim > 0 ? d : 0, o));
    norm2 = AffineNorm(*this, "norm2", d, o);
    ffn = register_module("ffn", GeluFeedForward(d, s.mlp_hidden, o));
  }
  std::vector<Linear> modulation_linears() override { return {}; }  // the table is a parameter, no Linear
  Tensors forward_block(const Tensors& in, const SubBlockRunner& run) override {
    const torch::Tensor h =
        run(SubBlock::attn,
            [this](const Tensors& t) {
              const auto m = modulation(table, t[1]);
              const torch::Tensor& x = t[0];
              const torch::Tensor a = attn1->forward(modulated_norm(x, m[0], m[1]), torch::Tensor(), t[3], t[4]);
              const torch::Tensor y = (x.to(torch::kFloat) + a * m[2]).to(x.scalar_type());
              return Tensors{y + attn2->forward(norm2(y), t[2], torch::Tensor(), torch::Tensor(), image_tokens_)};
            },
            {in.at(0), in.at(1), in.at(2), in.at(3), in.at(4)})[0];
    return run(SubBlock::mlp,
               [this](const Tensors& t) {
                 const auto m = modulation(table, t[1]);
                 const torch::Tensor& x = t[0];
                 const torch::Tensor f = ffn(modulated_norm(x, m[3], m[4]));
                 return Tensors{(x.to(torch::kFloat) + f.to(torch::kFloat) * m[5]).to(x.scalar_type())};
               },
               {h, in.at(1)});
  }

 private:
  int64_t image_tokens_;
  torch::Tensor table;
  WanAttention attn1{nullptr}, attn2{nullptr};
  AffineNorm norm2;
  GeluFeedForward ffn{nullptr};
};

// WanImageEmbedding: CLIP's hidden states through FP32LayerNorm, FeedForward(gelu, mult 1), FP32LayerNorm (both
// norms at nn.LayerNorm's default eps, 1e-5).
struct ImageEmbedder {
  AffineNorm norm1, norm2;
  Linear proj{nullptr}, out{nullptr};
  ImageEmbedder() = default;
  ImageEmbedder(torch::nn::Module& owner, int64_t in, int64_t dim, const torch::TensorOptions& o)
      : norm1(owner, "condition_embedder.image_embedder.norm1", in, o, 1e-5),
        norm2(owner, "condition_embedder.image_embedder.norm2", dim, o, 1e-5),
        proj(register_at(owner, "condition_embedder.image_embedder.ff.net.0.proj",
                         Linear(LinearOptions(in, in).tensor_options(o)))),
        out(register_at(owner, "condition_embedder.image_embedder.ff.net.2",
                        Linear(LinearOptions(in, dim).tensor_options(o)))) {}
  torch::Tensor operator()(const torch::Tensor& x) {
    return norm2(out(nn::activate(nn::Activation::gelu, proj(norm1(x)))));
  }
};

class WanTransformer : public DiffusionTransformer {
 public:
  WanTransformer(const ModelSpec& s, const torch::TensorOptions& o) : DiffusionTransformer(s) {
    TORCH_CHECK(s.patch_frames == 1, "Wan patches each frame: patch_frames 1, got ", s.patch_frames);
    const int64_t d = s.hidden, in = s.latent_channels + s.condition_input_channels, p = s.patch;
    // nn.Conv3d(in, d, kernel = stride = (1, p, p)): its weight as stored, run as the matmul it is over each
    // frame's p x p patches (c, i, j order: the kernel's).
    auto& holder = holder_at(*this, "patch_embedding");
    const double bound = 1.0 / std::sqrt(static_cast<double>(in * p * p));
    patch_weight = holder.register_parameter("weight", nn::uniform_parameter({d, in, 1, p, p}, bound, o));
    patch_bias = holder.register_parameter("bias", nn::uniform_parameter({d}, bound, o));
    time_embedder = TwoLayerMlp(*this, "condition_embedder.time_embedder.linear_1",
                                "condition_embedder.time_embedder.linear_2", kFreqDim, d, d, o);
    time_proj = register_at(*this, "condition_embedder.time_proj", Linear(LinearOptions(d, 6 * d).tensor_options(o)));
    text_1 = register_at(*this, "condition_embedder.text_embedder.linear_1",
                         Linear(LinearOptions(s.text_dim, d).tensor_options(o)));
    text_2 =
        register_at(*this, "condition_embedder.text_embedder.linear_2", Linear(LinearOptions(d, d).tensor_options(o)));
    if (s.image_embed_dim > 0) image_embedder = ImageEmbedder(*this, s.image_embed_dim, d, o);
    for (int i = 0; i < s.single_blocks; ++i)
      add_block("blocks." + std::to_string(i), std::make_shared<WanBlock>(s, o));
    proj_out = register_module("proj_out", Linear(LinearOptions(d, p * p * s.out_channels).tensor_options(o)));
    out_table =
        register_parameter("scale_shift_table", torch::randn({1, 2, d}, o).div_(std::sqrt(static_cast<double>(d))));
  }

  // Latents [B, C, F, H, W] (with an image-to-video model's condition channels after them); timestep [B],
  // or [B, S] per token (Wan 2.2 TI2V), as t / 1000.
  torch::Tensor forward(const ModelInputs& in) override {
    torch::Tensor latents = in.latents;
    if (in.condition_channels.defined()) latents = torch::cat({latents, in.condition_channels.to(latents.dtype())}, 1);
    const int64_t b = latents.size(0), f = latents.size(2), h = latents.size(3), w = latents.size(4);
    const int64_t p = spec_.patch, c = latents.size(1), d = spec_.hidden;
    const torch::Tensor frames = latents.transpose(1, 2).flatten(0, 1);  // [B*F, C, H, W]
    const torch::Tensor weight = patch_weight.to(latents.scalar_type()).reshape({d, c * p * p});
    torch::Tensor x = nn::linear(patchify(frames, p, /*channels_last=*/false).reshape({b, -1, c * p * p}), weight,
                                 patch_bias.to(latents.scalar_type()));
    std::vector<std::array<int64_t, 3>> ids;
    for (int64_t t = 0; t < f; ++t) add_image_ids(ids, t, h / p, w / p);
    const auto [cos, sin] = rope_cos_sin(ids_tensor(ids, x.device()), spec_.rope_axes, spec_.rope_theta);
    // WanTimeTextImageEmbedding: the sinusoid of t (per token, flattened), the time embedder in the model's
    // dtype, its projection to the blocks' six rows; the text through PixArtAlphaTextProjection (gelu_tanh).
    const torch::Tensor t = in.timestep.reshape({-1}) * 1000;
    torch::Tensor temb = time_embedder(timestep_embedding(t, kFreqDim).to(x.scalar_type()));
    torch::Tensor e = time_proj(torch::silu(temb));
    if (in.timestep.dim() == 2) {
      temb = temb.unflatten(0, {b, in.timestep.size(1)});
      e = e.unflatten(0, {b, in.timestep.size(1)}).unflatten(2, {6, d});
    } else {
      e = e.unflatten(1, {6, d});
    }
    torch::Tensor context = text_2(nn::activate(nn::Activation::gelu_tanh, text_1(in.text.to(x.scalar_type()))));
    if (spec_.image_embed_dim > 0) {
      TORCH_CHECK(in.image_embeds.defined(), "Wan 2.1 image-to-video takes the image's CLIP tokens");
      context = torch::cat({image_embedder(in.image_embeds.to(x.scalar_type())), context}, 1);
    }
    for (size_t i = 0; i < blocks().size(); ++i) x = call_block(i, {x, e, context, cos, sin})[0];
    const auto ss = modulation(out_table, temb.dim() == 3 ? temb.unsqueeze(2) : temb.unsqueeze(1), temb.scalar_type());
    const torch::Tensor out = proj_out(modulated_norm(x, ss[0], ss[1]));
    // [B, F, H/p, W/p, 1, p, p, C] -> [B, C, F, H, W]
    return out.reshape({b, f, h / p, w / p, 1, p, p, spec_.out_channels})
        .permute({0, 7, 1, 4, 2, 5, 3, 6})
        .flatten(6, 7)
        .flatten(4, 5)
        .flatten(2, 3);
  }

 private:
  static constexpr int64_t kFreqDim = 256;
  torch::Tensor patch_weight, patch_bias, out_table;
  Linear time_proj{nullptr}, text_1{nullptr}, text_2{nullptr}, proj_out{nullptr};
  TwoLayerMlp time_embedder;
  ImageEmbedder image_embedder;
};

}  // namespace

std::shared_ptr<DiffusionTransformer> build_transformer(const ModelSpec& spec, const torch::TensorOptions& options) {
  return std::make_shared<WanTransformer>(spec, options);
}

}  // namespace gclab::model::wan
