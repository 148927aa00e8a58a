// Chroma's transformer as AI Toolkit trains it: its copy of the Black Forest Labs reference code
// (extensions_built_in/diffusion_models/chroma/src/model.py, layers.py, math.py), in those names — a fused
// `qkv` per stream, `linear1` / `linear2` in the single-stream blocks, QK norms' `scale` — the names of the
// single-file checkpoints it loads strictly and of the LoRA files it saves. FLUX.1's MMDiT with every
// per-block modulation Linear pruned away: one approximator network makes all the modulation vectors from
// the timestep, a zero guidance and each vector's index, under no_grad. The same function as diffusers'
// ChromaTransformer2DModel after diffusers' own key conversion (tests/interop/diffusers_chroma.py).
#include <array>

#include "model/families/bfl/blocks.h"

namespace gclab::model::chroma {
namespace {

// The approximator's depth (model.py chroma_params approximator_depth: 5; diffusers approximator_layers).
constexpr int kApproximatorDepth = 5;

// Every Linear has a bias; GELU-tanh MLPs; QK norms by F.rms_norm (layers.py:72-89, 442-444, 495-497, 632-634).
const bfl::BlockOptions kBlocks{/*bias=*/true, /*swiglu=*/false, /*functional_rms_norm=*/true};

class ChromaTransformer : public DiffusionTransformer {
 public:
  ChromaTransformer(const ModelSpec& s, const torch::TensorOptions& o) : DiffusionTransformer(s) {
    const int64_t d = s.hidden, packed = s.latent_channels * s.patch * s.patch, a = s.t_embed_mid;
    img_in = register_module("img_in", Linear(LinearOptions(packed, d).tensor_options(o)));
    in_proj = register_at(*this, "distilled_guidance_layer.in_proj",
                          Linear(LinearOptions(kApproximatorInput, a).tensor_options(o)));
    for (int i = 0; i < kApproximatorDepth; ++i) {
      const std::string p = "distilled_guidance_layer.layers." + std::to_string(i);
      layers.emplace_back(*this, p + ".in_layer", p + ".out_layer", a, a, a, o);
      norms.emplace_back(*this, "distilled_guidance_layer.norms." + std::to_string(i), a, true, o);
    }
    out_proj = register_at(*this, "distilled_guidance_layer.out_proj", Linear(LinearOptions(a, d).tensor_options(o)));
    txt_in = register_module("txt_in", Linear(LinearOptions(s.text_dim, d).tensor_options(o)));
    for (int i = 0; i < s.double_blocks; ++i)
      add_block("double_blocks." + std::to_string(i),
                std::make_shared<bfl::DoubleBlock>(d, s.heads, s.mlp_hidden, kBlocks, o));
    for (int i = 0; i < s.single_blocks; ++i)
      add_block("single_blocks." + std::to_string(i),
                std::make_shared<bfl::SingleBlock>(d, s.heads, s.mlp_hidden, kBlocks, o));
    final_linear = register_at(*this, "final_layer.linear", Linear(LinearOptions(d, packed).tensor_options(o)));
  }

  torch::Tensor forward(const ModelInputs& in) override {
    const int64_t p = spec_.patch, h = in.latents.size(2), w = in.latents.size(3);
    torch::Tensor img = img_in(patchify(in.latents, p, /*channels_last=*/false));
    torch::Tensor txt = txt_in(in.text);
    const int64_t n_img = img.size(1), n_txt = txt.size(1);
    const int64_t batch = img.size(0);
    const torch::Tensor mods = modulations(in.timestep, batch, img.scalar_type());
    // Text ids (0, 0, 0), image ids (0, row, column) as floats, per sample (chroma_model.py:321-342): the
    // rotations in float64, kept as float32 [B, 1, L, 64, 2, 2].
    std::vector<std::array<int64_t, 3>> ids(static_cast<size_t>(n_txt), {0, 0, 0});
    add_image_ids(ids, 0, h / p, w / p);
    const torch::Tensor pe =
        bfl::rope_table(ids_tensor(ids, img.device()).to(torch::kFloat).unsqueeze(0).repeat({batch, 1, 1}),
                        spec_.rope_axes, spec_.rope_theta);
    const torch::Tensor mask = attention_mask(in.text_mask, batch, n_txt, n_img, img.device(), img.scalar_type());
    const int64_t singles = 3 * spec_.single_blocks, doubles = spec_.double_blocks;
    size_t b = 0;
    for (; b < static_cast<size_t>(doubles); ++b) {  // distribute_modulations' slices (layers.py:92-174)
      const int64_t i = static_cast<int64_t>(b);
      const Tensors out = call_block(
          b, {img, txt, mods.narrow(1, singles + 6 * i, 6), mods.narrow(1, singles + 6 * (doubles + i), 6), pe, mask});
      img = out[0], txt = out[1];
    }
    torch::Tensor x = torch::cat({txt, img}, 1);
    for (; b < blocks().size(); ++b) {
      const int64_t i = static_cast<int64_t>(b) - doubles;
      x = call_block(b, {x, mods.narrow(1, 3 * i, 3), pe, mask})[0];
    }
    img = x.narrow(1, n_txt, n_img);
    const int64_t last = mods.size(1) - 2;  // LastLayer: shift, scale
    img = final_linear(bfl::shift_scale(layer_norm(img), mods.narrow(1, last, 1), mods.narrow(1, last + 1, 1)));
    return unpatchify(img, h, w, p, spec_.out_channels, false);
  }

 private:
  static constexpr int64_t kApproximatorInput = 64;  // 16 (timestep) + 16 (guidance) + 32 (the vector's index)

  // model.py:205-221, under no_grad: each of the 3·singles + 12·doubles + 2 vectors' input row is
  // [timestep_embedding(t, 16), timestep_embedding(0, 16), timestep_embedding(index, 32)] (each x1000 inside,
  // float32), cast to the weights' dtype (`dtype`: the model's, a quantized Linear's dequantized one — quanto's
  // QTensor reports it as its dtype), through the approximator: [B, rows, D].
  torch::Tensor modulations(const torch::Tensor& t, int64_t batch, torch::ScalarType dtype) {
    torch::NoGradGuard no_grad;
    const int64_t rows = 3 * spec_.single_blocks + 12 * spec_.double_blocks + 2;
    const auto f = torch::TensorOptions().dtype(torch::kFloat).device(t.device());
    const torch::Tensor tg = torch::cat({bfl::timestep_embedding(t.to(torch::kFloat), 16, /*frequencies_on_cpu=*/true),
                                         bfl::timestep_embedding(torch::zeros({batch}, f), 16, true)},
                                        1);
    const torch::Tensor index =  // the index embedding of int64 positions: float32, not cast back
        bfl::timestep_embedding(torch::arange(rows, f.dtype(torch::kLong)), 32, true)
            .unsqueeze(0)
            .repeat({batch, 1, 1});
    torch::Tensor x = torch::cat({tg.unsqueeze(1).repeat({1, rows, 1}), index}, -1).to(dtype);
    x = in_proj(x);
    for (size_t i = 0; i < layers.size(); ++i) x = x + layers[i](norms[i](x));
    return out_proj(x);
  }

  // model.py:227-250: the prompt's tokens and, after them, one padding token (modify_mask_to_attend_padding,
  // attn_padding 1), then every image token; the pairs (query, key) that are allowed in any sample of the
  // batch (txt_img_mask.float().T @ txt_img_mask.float(): a union over the batch), repeated to
  // [B, heads, L, L] as float32, then int32, then bool — each step a tensor of its own, as AI Toolkit's
  // chain holds them. `text_mask` [B, T] (undefined: every row a token) comes in the model's dtype
  // (get_noise_prediction casts it, chroma_model.py:358-360; a preview's PromptEmbeds.to, base_model.py:
  // 697-700), so its length is summed there: in bf16 a prompt of more than 256 tokens counts rounded, and the
  // token after the rounded count is unmasked, as modify_mask_to_attend_padding does (src/model.py:56-86).
  torch::Tensor attention_mask(const torch::Tensor& text_mask, int64_t batch, int64_t n_txt, int64_t n_img,
                               const torch::Device& device, torch::ScalarType dtype) const {
    torch::NoGradGuard no_grad;
    const auto f = torch::TensorOptions().dtype(torch::kFloat).device(device);
    torch::Tensor tokens = torch::ones({batch, n_txt + n_img}, f);
    if (text_mask.defined() && !device.is_meta()) {
      const torch::Tensor typed = text_mask.to(torch::kCPU, dtype);
      const torch::Tensor lengths = typed.sum(1).to(torch::kLong);
      torch::Tensor rows = typed.to(torch::kFloat);
      for (int64_t i = 0; i < batch; ++i)
        if (const int64_t n = lengths[i].item<int64_t>(); n < n_txt) rows[i][n] = 1;
      tokens.narrow(1, 0, n_txt).copy_(rows);
    }
    const torch::Tensor pairs = tokens.t().matmul(tokens);
    torch::Tensor repeated = pairs.unsqueeze(0).unsqueeze(0).repeat({batch, spec_.heads, 1, 1});
    torch::Tensor ints = repeated.to(torch::kInt);
    repeated.reset();
    return ints.to(torch::kBool);
  }

  Linear img_in{nullptr}, txt_in{nullptr}, in_proj{nullptr}, out_proj{nullptr}, final_linear{nullptr};
  std::vector<TwoLayerMlp> layers;
  std::vector<bfl::ScaleNorm> norms;
};

}  // namespace

std::shared_ptr<DiffusionTransformer> build_transformer(const ModelSpec& spec, const torch::TensorOptions& options) {
  return std::make_shared<ChromaTransformer>(spec, options);
}

}  // namespace gclab::model::chroma
