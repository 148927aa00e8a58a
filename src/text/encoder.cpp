#include "gclab/text/encoder.h"

#include <algorithm>
#include <functional>
#include <stdexcept>

#include "gclab/io/safetensors.h"
#include "gclab/memory/meta_count.h"
#include "gclab/nn/layers.h"
#include "gclab/text/clip.h"
#include "gclab/text/qwen_lm.h"
#include "gclab/text/t5.h"

namespace gclab::text {

namespace {

using Kind = config::TextEncoderKind;

torch::TensorOptions meta_options(c10::ScalarType dtype) {
  return torch::TensorOptions().device(torch::kMeta).dtype(dtype);
}

class ClipEncoder : public TextEncoderBase {
 public:
  ClipEncoder(Kind kind, const ClipTextConfig& c, const torch::TensorOptions& options)
      : kind_(kind), model_(register_module("model", ClipTextModel(c, options))) {}
  // FLUX.1 takes CLIP-L's pooled output only; SD3 the penultimate hidden states and the projected pooled one.
  EncodedText encode(const torch::Tensor& ids, const torch::Tensor& mask) override {
    ClipTextOutput o = model_->forward(ids, mask);
    if (kind_ == Kind::clip_l) return {{}, o.pooled};
    return {o.penultimate, o.text_embeds};
  }
  Kind kind() const override { return kind_; }
  int64_t max_positions() const override { return model_->config().max_position_embeddings; }
  int64_t vocab_size() const override { return model_->config().vocab_size; }
  int64_t hidden_width() const override { return kind_ == Kind::clip_l ? 0 : model_->config().hidden_size; }
  int64_t pooled_width() const override {
    return kind_ == Kind::clip_l ? model_->config().hidden_size : model_->config().projection_dim;
  }
  std::shared_ptr<TextEncoderBase> meta_twin(c10::ScalarType dtype) const override {
    return std::make_shared<ClipEncoder>(kind_, model_->config(), meta_options(dtype));
  }
  ClipTextModelImpl& model() { return *model_; }

 private:
  Kind kind_;
  ClipTextModel model_;
};

class T5 : public TextEncoderBase {
 public:
  T5(Kind kind, const T5Config& c, const torch::TensorOptions& options)
      : kind_(kind), model_(register_module("model", T5Encoder(c, options))) {}
  EncodedText encode(const torch::Tensor& ids, const torch::Tensor& mask) override {
    return {model_->forward(ids, mask), {}};
  }
  Kind kind() const override { return kind_; }
  int64_t max_positions() const override { return 512; }
  int64_t vocab_size() const override { return model_->config().vocab_size; }
  int64_t hidden_width() const override { return model_->config().d_model; }
  int64_t pooled_width() const override { return 0; }
  std::shared_ptr<TextEncoderBase> meta_twin(c10::ScalarType dtype) const override {
    return std::make_shared<T5>(kind_, model_->config(), meta_options(dtype));
  }
  T5EncoderImpl& model() { return *model_; }

 private:
  Kind kind_;
  T5Encoder model_;
};

// Qwen-Image takes Qwen2.5-VL's last hidden states (after the final norm; the pipeline then drops the chat
// template's 34 prefix tokens); Z-Image takes Qwen3's hidden_states[-2].
class QwenEncoder : public TextEncoderBase {
 public:
  QwenEncoder(Kind kind, const QwenLmConfig& c, const torch::TensorOptions& options)
      : kind_(kind), model_(register_module("model", QwenLm(c, options))) {
    // Held as the checkpoint's model holds them: the vision tower runs for the edit models' control images;
    // Mistral3's Pixtral tower and the LM head never run (memory only).
    if (c.vision) {
      QwenVisionConfig v = *c.vision;
      v.out_hidden_size = c.hidden_size;
      visual_ = register_module("visual", QwenVisionTower(v, options));
    }
    if (c.pixtral) register_module("resident", pixtral_resident(*c.pixtral, c.hidden_size, options));
    if (c.lm_head)
      lm_head_ = register_module(
          "lm_head", nn::Linear(nn::LinearOptions(c.hidden_size, c.vocab_size).bias(false).tensor_options(options)));
  }
  EncodedText encode(const torch::Tensor& ids, const torch::Tensor& mask) override {
    return {pick(model_->forward(ids, mask)), {}};
  }
  bool takes_images() const override { return !visual_.is_empty(); }
  int64_t image_token_id() const override { return takes_images() ? model_->config().image_token_id : -1; }
  const QwenVisionConfig* vision_config() const override { return takes_images() ? &visual_->config() : nullptr; }
  // Qwen2_5_VLModel.forward with pixel_values: the tower's tokens scattered into the embeddings where the
  // image tokens are, and get_rope_index's positions.
  EncodedText encode_with_images(const torch::Tensor& ids, const torch::Tensor& mask,
                                 const QwenVisionInput& images) override {
    if (!takes_images()) return TextEncoderBase::encode_with_images(ids, mask, images);
    return {pick(qwen_forward_with_images(*model_, *visual_, ids, mask, images)), {}};
  }
  // All the hidden states kept to the end, as output_hidden_states keeps them; the asked ones stacked. With
  // lm_logits (PipelineCall::lm_logits) the causal-LM class's logits over every row (logits_to_keep 0) are made
  // while those states are held, and dropped (the untied head, else the tied embedding).
  EncodedText encode_layers(const torch::Tensor& ids, const torch::Tensor& mask, const std::vector<int64_t>& layers,
                            bool lm_logits) override {
    const QwenLmOutput o = model_->forward(ids, mask, /*keep_hidden_states=*/true);
    if (lm_logits && lm_head_.is_empty())
      model_->tied_logits(o.last_hidden_state);
    else if (lm_logits)
      lm_head_->forward(o.last_hidden_state);
    std::vector<torch::Tensor> picked;
    for (const int64_t k : layers) {
      if (k < 0 || k >= static_cast<int64_t>(o.hidden_states.size()))
        throw std::invalid_argument("hidden state " + std::to_string(k) + " of a " +
                                    std::to_string(o.hidden_states.size() - 1) + "-layer decoder");
      picked.push_back(o.hidden_states[static_cast<size_t>(k)]);
    }
    const torch::Tensor stacked = torch::stack(picked, 1);  // [B, k, T, D]
    const int64_t b = stacked.size(0), t = stacked.size(2);
    return {stacked.permute({0, 2, 1, 3}).reshape({b, t, -1}), {}};
  }
  int64_t layer_count() const override { return model_->config().num_hidden_layers; }
  Kind kind() const override { return kind_; }
  // Qwen-Image: tokenizer_max_length 1024 after the 34 template tokens; Z-Image, FLUX.2: max_sequence_length 512.
  int64_t max_positions() const override { return kind_ == Kind::qwen25_vl ? 1024 + 34 : 512; }
  int64_t vocab_size() const override { return model_->config().vocab_size; }
  int64_t hidden_width() const override { return model_->config().hidden_size; }
  int64_t pooled_width() const override { return 0; }
  std::shared_ptr<TextEncoderBase> meta_twin(c10::ScalarType dtype) const override {
    return std::make_shared<QwenEncoder>(kind_, model_->config(), meta_options(dtype));
  }
  QwenLmImpl& model() { return *model_; }
  QwenVisionTower& tower() { return visual_; }
  // What the checkpoint holds beside the language model and its vision tower, never run: Mistral3's Pixtral
  // tower and projector, the LM head; each with the names its files store it under (transformers 5's,
  // then the published files').
  using StoredAs = std::function<std::vector<std::string>(const std::string&)>;
  std::vector<std::pair<std::shared_ptr<torch::nn::Module>, StoredAs>> held_parts() {
    std::vector<std::pair<std::shared_ptr<torch::nn::Module>, StoredAs>> out;
    for (const auto& item : named_children()) {
      if (item.key() == "resident")
        out.emplace_back(item.value(), [](const std::string& n) { return std::vector<std::string>{"model." + n}; });
      if (item.key() == "lm_head")
        out.emplace_back(item.value(), [](const std::string& n) {
          return std::vector<std::string>{"lm_head." + n, "language_model.lm_head." + n};
        });
    }
    return out;
  }

 private:
  torch::Tensor pick(const QwenLmOutput& o) const {
    return kind_ == Kind::qwen25_vl ? o.last_hidden_state : o.penultimate;
  }
  Kind kind_;
  QwenLm model_;
  QwenVisionTower visual_{nullptr};
  nn::Linear lm_head_{nullptr};
};

}  // namespace

int64_t predicted_encode_bytes(const TextEncoderBase& encoder, int64_t batch, int64_t tokens, bool masked,
                               const EncodeMemoryOptions& options) {
  const std::shared_ptr<TextEncoderBase> twin = encoder.meta_twin(options.dtype);
  if (options.quantized_linears) nn::store_weights(nn::named_linears(*twin), nn::WeightStorage::QFloat8);
  const auto meta = torch::TensorOptions().device(torch::kMeta).dtype(torch::kLong);
  const torch::Tensor ids = torch::empty({batch, tokens}, meta);
  const torch::Tensor mask = masked ? torch::empty({batch, tokens}, meta) : torch::Tensor();
  return memory::inference_peak(options.cpu ? c10::kCPU : c10::kCUDA, [&] { twin->encode(ids, mask); });
}

EncodedText TextEncoderBase::encode_with_images(const torch::Tensor&, const torch::Tensor&, const QwenVisionInput&) {
  throw std::invalid_argument(std::string(config::name_of(kind())) + " does not read images");
}

EncodedText TextEncoderBase::encode_layers(const torch::Tensor&, const torch::Tensor&, const std::vector<int64_t>&,
                                           bool) {
  throw std::invalid_argument(std::string(config::name_of(kind())) + " does not give its hidden states by layer");
}

TinyWidths preset_widths(Kind kind) {
  switch (kind) {
    case Kind::clip_l:
      return {0, ClipTextConfig::clip_l().hidden_size};
    case Kind::clip_l_projected:
      return {ClipTextConfig::clip_l(true).hidden_size, ClipTextConfig::clip_l(true).projection_dim};
    case Kind::clip_g_projected:
      return {ClipTextConfig::clip_g().hidden_size, ClipTextConfig::clip_g().projection_dim};
    case Kind::t5_xxl:
    case Kind::umt5_xxl:
      return {T5Config::xxl().d_model, 0};
    case Kind::qwen25_vl:
      return {QwenLmConfig::qwen25_vl_7b().hidden_size, 0};
    case Kind::qwen3:
      return {QwenLmConfig::qwen3_4b().hidden_size, 0};
    case Kind::qwen3_8b:
      return {QwenLmConfig::qwen3_8b().hidden_size, 0};
    case Kind::mistral3:
      return {QwenLmConfig::mistral_small_31().hidden_size, 0};
  }
  return {};
}

LoadedTextEncoder build_text_encoder(Kind kind, bool tiny, const std::filesystem::path& folder,
                                     const torch::TensorOptions& options, bool load_weights, const TinyWidths& widths,
                                     bool vision_tower) {
  std::error_code ec;
  const bool has_config = !folder.empty() && std::filesystem::is_regular_file(folder / "config.json", ec);
  LoadedTextEncoder out;
  // A folder with a config.json and no weights: that shape, random weights (as a transformer folder).
  out.random = folder.empty() || !load_weights || io::find_weights(folder, io::transformers_weight_files()).empty();
  switch (kind) {
    case Kind::clip_l:
    case Kind::clip_l_projected:
    case Kind::clip_g_projected: {
      ClipTextConfig c = kind == Kind::clip_g_projected ? ClipTextConfig::clip_g()
                                                        : ClipTextConfig::clip_l(kind == Kind::clip_l_projected);
      if (tiny) {
        c = ClipTextConfig::tiny(c);
        if (widths.hidden > 0) {
          c.hidden_size = widths.hidden, c.intermediate_size = 2 * widths.hidden;
          c.num_attention_heads = widths.hidden % 4 == 0 ? 4 : 1;
        }
        if (widths.projection > 0) c.projection_dim = widths.projection;
      }
      if (has_config) c = ClipTextConfig::from_json_file(folder / "config.json");
      if (kind != Kind::clip_l && !c.with_projection)
        throw std::runtime_error(folder.string() + ": a CLIPTextModel without the projection SD3 uses");
      auto e = std::make_shared<ClipEncoder>(kind, c, options);
      if (!out.random) out.unused = load_clip_text_weights(e->model(), folder);
      out.encoder = e;
      break;
    }
    case Kind::t5_xxl:
    case Kind::umt5_xxl: {
      const bool umt5 = kind == Kind::umt5_xxl;
      T5Config c = umt5 ? T5Config::umt5_xxl() : T5Config::xxl();
      if (tiny) c = T5Config::tiny(), c.bias_per_layer = umt5;
      if (tiny && widths.hidden > 0) c.d_model = widths.hidden, c.d_ff = 2 * widths.hidden;
      if (has_config) c = T5Config::from_json_file(folder / "config.json");
      if (c.bias_per_layer != umt5)
        throw std::runtime_error(folder.string() + ": not the " + std::string(config::name_of(kind)) + " model");
      auto e = std::make_shared<T5>(kind, c, options);
      if (!out.random) out.unused = load_t5_weights(e->model(), folder);
      out.encoder = e;
      break;
    }
    case Kind::qwen25_vl:
    case Kind::qwen3:
    case Kind::qwen3_8b:
    case Kind::mistral3: {
      QwenLmConfig c = kind == Kind::qwen3      ? QwenLmConfig::qwen3_4b()
                       : kind == Kind::qwen3_8b ? QwenLmConfig::qwen3_8b()
                       : kind == Kind::mistral3 ? QwenLmConfig::mistral_small_31()
                                                : QwenLmConfig::qwen25_vl_7b();
      if (tiny) c = QwenLmConfig::tiny(c);
      if (tiny && widths.hidden > 0) c.hidden_size = widths.hidden, c.intermediate_size = 2 * widths.hidden;
      if (has_config) c = QwenLmConfig::from_json_file(folder / "config.json");
      const std::string want = kind == Kind::qwen25_vl ? "qwen2_5_vl" : kind == Kind::mistral3 ? "mistral" : "qwen3";
      if (c.model_type.rfind(want, 0) != 0)
        throw std::runtime_error(folder.string() + ": not the " + std::string(config::name_of(kind)) + " model");
      if (!vision_tower) c.vision.reset();
      auto e = std::make_shared<QwenEncoder>(kind, c, options);
      if (!out.random) {
        out.unused = load_qwen_lm_weights(e->model(), folder);
        // The parts held beside the language model, from the same files: unused = what none of them takes.
        auto also_took = [&](const std::vector<std::string>& unused_by_part) {
          out.unused.erase(std::remove_if(out.unused.begin(), out.unused.end(),
                                          [&](const std::string& n) {
                                            return std::find(unused_by_part.begin(), unused_by_part.end(), n) ==
                                                   unused_by_part.end();
                                          }),
                           out.unused.end());
        };
        if (e->takes_images()) also_took(load_qwen_vision_weights(*e->tower(), folder));
        for (const auto& [part, stored_as] : e->held_parts())
          also_took(io::load_module_weights(*part, folder, io::transformers_weight_files(), stored_as));
      }
      out.encoder = e;
      break;
    }
  }
  return out;
}

}  // namespace gclab::text
