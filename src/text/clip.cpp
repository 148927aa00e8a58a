#include "gclab/text/clip.h"

#include <stdexcept>

#include "gclab/io/json_file.h"
#include "gclab/io/safetensors.h"
#include "gclab/nn/meta_kernels.h"

namespace gclab::text {

namespace {

// A CLIP config's hidden_act (either tower's): quick_gelu (OpenAI's ViT-L) or gelu (OpenCLIP's), else an
// error naming it.
nn::Activation clip_activation(const nlohmann::json& j, nn::Activation fallback) {
  const std::string act = j.value("hidden_act", std::string(nn::name_of(fallback)));
  const auto parsed = nn::parse_activation(act);
  if (!parsed || (*parsed != nn::Activation::quick_gelu && *parsed != nn::Activation::gelu))
    throw std::runtime_error("hidden_act " + act + " is not one gclab builds");
  return *parsed;
}

}  // namespace

ClipTextConfig ClipTextConfig::clip_l(bool with_projection) {
  ClipTextConfig c;
  c.with_projection = with_projection;
  return c;
}

ClipTextConfig ClipTextConfig::clip_g() {
  ClipTextConfig c;
  c.hidden_size = 1280, c.intermediate_size = 5120, c.num_hidden_layers = 32, c.num_attention_heads = 20;
  c.projection_dim = 1280, c.hidden_act = nn::Activation::gelu, c.with_projection = true;
  return c;
}

ClipTextConfig ClipTextConfig::tiny(const ClipTextConfig& like) {
  ClipTextConfig c = like;
  c.vocab_size = 1000, c.max_position_embeddings = 16;
  c.hidden_size = 32, c.intermediate_size = 64, c.num_hidden_layers = 2, c.num_attention_heads = 4;
  c.projection_dim = 16;
  if (c.eos_token_id != 2) c.eos_token_id = c.vocab_size - 1;
  return c;
}

ClipTextConfig ClipTextConfig::from_json_file(const std::filesystem::path& path) {
  return io::parse_json_file(path, [](const nlohmann::json& j) {
    ClipTextConfig c;
    const std::string type = j.value("model_type", std::string("clip_text_model"));
    if (type != "clip_text_model") throw std::runtime_error("model_type is " + type + ", not clip_text_model");
    c.vocab_size = j.value("vocab_size", c.vocab_size);
    c.hidden_size = j.value("hidden_size", int64_t{512});  // transformers' CLIPTextConfig defaults
    c.intermediate_size = j.value("intermediate_size", int64_t{2048});
    c.num_hidden_layers = j.value("num_hidden_layers", int64_t{12});
    c.num_attention_heads = j.value("num_attention_heads", int64_t{8});
    c.max_position_embeddings = j.value("max_position_embeddings", c.max_position_embeddings);
    c.projection_dim = j.value("projection_dim", int64_t{512});
    c.eos_token_id = j.value("eos_token_id", c.eos_token_id);
    c.hidden_act = clip_activation(j, c.hidden_act);
    c.layer_norm_eps = j.value("layer_norm_eps", c.layer_norm_eps);
    for (const auto& a : j.value("architectures", nlohmann::json::array()))
      if (a == "CLIPTextModelWithProjection") c.with_projection = true;
    return c;
  });
}

ClipEncoderLayer::ClipEncoderLayer(torch::nn::Module& owner, const std::string& path, int64_t d, int64_t inner,
                                   const torch::TensorOptions& options) {
  auto linear = [&](const std::string& name, int64_t in, int64_t out) {
    return nn::register_at(owner, path + name, nn::Linear(nn::LinearOptions(in, out).tensor_options(options)));
  };
  auto norm = [&](const std::string& name, torch::Tensor& w, torch::Tensor& b) {
    auto& holder = nn::holder_at(owner, path + name);
    w = holder.register_parameter("weight", torch::ones({d}, options));
    b = holder.register_parameter("bias", torch::zeros({d}, options));
  };
  q_ = linear("self_attn.q_proj", d, d), k_ = linear("self_attn.k_proj", d, d), v_ = linear("self_attn.v_proj", d, d);
  out_ = linear("self_attn.out_proj", d, d);
  norm("layer_norm1", ln1_w_, ln1_b_);
  fc1_ = linear("mlp.fc1", d, inner), fc2_ = linear("mlp.fc2", inner, d);
  norm("layer_norm2", ln2_w_, ln2_b_);
}

torch::Tensor ClipEncoderLayer::forward(torch::Tensor h, const torch::Tensor& mask, int64_t heads, nn::Activation act,
                                        double eps) {
  const int64_t batch = h.size(0), length = h.size(1), width = h.size(2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(width / heads));
  {  // the attention's tensors are freed before the MLP runs, as in transformers' forward
    const torch::Tensor n = nn::layer_norm(h, ln1_w_, ln1_b_, eps);
    auto split = [&](nn::Linear& proj) { return proj->forward(n).view({batch, length, heads, -1}).transpose(1, 2); };
    torch::Tensor a = nn::attention(split(q_), split(k_), split(v_), mask, scale);
    a = a.transpose(1, 2).reshape({batch, length, width});
    h = h + out_->forward(a);
  }
  torch::Tensor f = fc1_->forward(nn::layer_norm(h, ln2_w_, ln2_b_, eps));
  f = nn::activate(act, f);  // CLIPMLP: fc1's output replaced by its activation, then fc2
  return h + fc2_->forward(f);
}

ClipTextModelImpl::ClipTextModelImpl(ClipTextConfig config, const torch::TensorOptions& options)
    : config_(std::move(config)) {
  const auto& c = config_;
  const int64_t d = c.hidden_size;
  auto norm = [&](const std::string& path, torch::Tensor& w, torch::Tensor& b) {
    auto& holder = nn::holder_at(*this, path);
    w = holder.register_parameter("weight", torch::ones({d}, options));
    b = holder.register_parameter("bias", torch::zeros({d}, options));
  };
  // N(0, 0.02) embeddings, as CLIP initialises them (transformers replaces them on load).
  token_embedding_ = nn::holder_at(*this, "text_model.embeddings.token_embedding")
                         .register_parameter("weight", torch::randn({c.vocab_size, d}, options) * 0.02);
  position_embedding_ = nn::holder_at(*this, "text_model.embeddings.position_embedding")
                            .register_parameter("weight", torch::randn({c.max_position_embeddings, d}, options) * 0.02);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    layers_.push_back(std::make_shared<ClipEncoderLayer>(*this, "text_model.encoder.layers." + std::to_string(i) + ".",
                                                         d, c.intermediate_size, options));
  norm("text_model.final_layer_norm", final_norm_weight_, final_norm_bias_);
  if (c.with_projection)
    text_projection_ =
        nn::register_at(*this, "text_projection",
                        nn::Linear(nn::LinearOptions(d, c.projection_dim).bias(false).tensor_options(options)));
}

ClipTextOutput ClipTextModelImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask) {
  const auto& c = config_;
  const int64_t batch = input_ids.size(0), length = input_ids.size(1), heads = c.num_attention_heads;
  if (length > c.max_position_embeddings)
    throw std::invalid_argument("CLIP takes at most " + std::to_string(c.max_position_embeddings) + " tokens, got " +
                                std::to_string(length));
  torch::Tensor h = nn::embedding(token_embedding_, input_ids) + position_embedding_.slice(0, 0, length);
  const torch::Tensor mask = nn::causal_additive_mask(length, attention_mask, h.options());
  ClipTextOutput out;
  if (layers_.size() < 2) out.penultimate = h;  // one layer: hidden_states[-2] is the embeddings' output
  for (size_t i = 0; i < layers_.size(); ++i) {
    // The old state freed as it goes.
    h = layers_[i]->forward(std::move(h), mask, heads, c.hidden_act, c.layer_norm_eps);
    if (i + 2 == layers_.size()) out.penultimate = h;
  }
  out.last_hidden_state = nn::layer_norm(h, final_norm_weight_, final_norm_bias_, c.layer_norm_eps);
  // The end-of-text token: the largest id (configs whose eos_token_id is 2, as the published CLIP-L and
  // bigG ones: the tokenizer's end token has the largest id), else the first position holding eos_token_id.
  const torch::Tensor ids = input_ids.to(out.last_hidden_state.device());
  const torch::Tensor where =
      c.eos_token_id == 2 ? ids.to(torch::kInt).argmax(-1) : (ids == c.eos_token_id).to(torch::kInt).argmax(-1);
  out.pooled = out.last_hidden_state.index({torch::arange(batch, ids.options().dtype(torch::kLong)), where});
  if (text_projection_) out.text_embeds = text_projection_->forward(out.pooled);
  return out;
}

std::vector<std::string> load_clip_text_weights(ClipTextModelImpl& model, const std::filesystem::path& path) {
  const std::string prefix = "text_model.";
  return io::load_module_weights(model, path, io::transformers_weight_files(), [&](const std::string& name) {
    return name.rfind(prefix, 0) == 0 ? std::vector<std::string>{name.substr(prefix.size())}
                                      : std::vector<std::string>{};
  });
}

}  // namespace gclab::text

namespace gclab::text {

ClipVisionConfig ClipVisionConfig::vit_h14() {
  ClipVisionConfig c;
  c.hidden_size = 1280, c.intermediate_size = 5120, c.num_hidden_layers = 32, c.num_attention_heads = 16;
  c.patch_size = 14, c.hidden_act = nn::Activation::gelu;
  return c;
}

ClipVisionConfig ClipVisionConfig::tiny() {
  ClipVisionConfig c;
  c.hidden_size = 32, c.intermediate_size = 64, c.num_hidden_layers = 2, c.num_attention_heads = 4;
  c.image_size = 32, c.patch_size = 8, c.hidden_act = nn::Activation::gelu;
  return c;
}

ClipVisionConfig ClipVisionConfig::from_json_file(const std::filesystem::path& path) {
  return io::parse_json_file(path, [](const nlohmann::json& top) {
    const nlohmann::json& j = top.contains("vision_config") ? top.at("vision_config") : top;
    const std::string type = j.value("model_type", std::string("clip_vision_model"));
    if (type != "clip_vision_model") throw std::runtime_error("model_type is " + type + ", not clip_vision_model");
    ClipVisionConfig c;  // transformers' CLIPVisionConfig defaults
    c.hidden_size = j.value("hidden_size", c.hidden_size);
    c.intermediate_size = j.value("intermediate_size", c.intermediate_size);
    c.num_hidden_layers = j.value("num_hidden_layers", c.num_hidden_layers);
    c.num_attention_heads = j.value("num_attention_heads", c.num_attention_heads);
    c.image_size = j.value("image_size", c.image_size);
    c.patch_size = j.value("patch_size", c.patch_size);
    c.num_channels = j.value("num_channels", c.num_channels);
    c.layer_norm_eps = j.value("layer_norm_eps", c.layer_norm_eps);
    c.hidden_act = clip_activation(j, c.hidden_act);
    if (c.image_size % c.patch_size != 0)
      throw std::runtime_error("image_size " + std::to_string(c.image_size) + " is not a multiple of patch_size " +
                               std::to_string(c.patch_size));
    return c;
  });
}

ClipVisionModelImpl::ClipVisionModelImpl(ClipVisionConfig config, const torch::TensorOptions& options)
    : config_(std::move(config)) {
  const auto& c = config_;
  const int64_t d = c.hidden_size, p = c.patch_size;
  auto norm = [&](const std::string& path, torch::Tensor& w, torch::Tensor& b) {
    auto& holder = nn::holder_at(*this, path);
    w = holder.register_parameter("weight", torch::ones({d}, options));
    b = holder.register_parameter("bias", torch::zeros({d}, options));
  };
  auto& embeddings = nn::holder_at(*this, "vision_model.embeddings");
  class_embedding_ = embeddings.register_parameter("class_embedding", torch::randn({d}, options));
  const double bound = 1.0 / std::sqrt(static_cast<double>(c.num_channels * p * p));
  patch_weight_ = nn::holder_at(*this, "vision_model.embeddings.patch_embedding")
                      .register_parameter("weight", nn::uniform_parameter({d, c.num_channels, p, p}, bound, options));
  position_embedding_ = nn::holder_at(*this, "vision_model.embeddings.position_embedding")
                            .register_parameter("weight", torch::randn({c.positions(), d}, options));
  norm("vision_model.pre_layrnorm", pre_w_, pre_b_);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    layers_.push_back(std::make_shared<ClipEncoderLayer>(
        *this, "vision_model.encoder.layers." + std::to_string(i) + ".", d, c.intermediate_size, options));
  norm("vision_model.post_layernorm", post_w_, post_b_);
}

ClipVisionOutput ClipVisionModelImpl::forward(const torch::Tensor& pixel_values) {
  const auto& c = config_;
  const int64_t b = pixel_values.size(0), p = c.patch_size, g = c.image_size / p, d = c.hidden_size;
  if (pixel_values.dim() != 4 || pixel_values.size(1) != c.num_channels || pixel_values.size(2) != c.image_size ||
      pixel_values.size(3) != c.image_size)
    throw std::invalid_argument("CLIP's vision tower takes [B, " + std::to_string(c.num_channels) + ", " +
                                std::to_string(c.image_size) + ", " + std::to_string(c.image_size) + "], got " +
                                c10::str(pixel_values.sizes()));
  // The Conv2d patch embedding (kernel = stride = patch, no bias) as the matmul it is over each patch's
  // (channel, row, column) values: [B, g*g, d], then the class token in front and the positions added.
  const torch::Tensor x = pixel_values.to(patch_weight_.scalar_type());
  const torch::Tensor patches = x.reshape({b, c.num_channels, g, p, g, p})
                                    .permute({0, 2, 4, 1, 3, 5})
                                    .reshape({b, g * g, c.num_channels * p * p});
  const torch::Tensor embedded = torch::matmul(patches, patch_weight_.reshape({d, -1}).t());
  torch::Tensor h = torch::cat({class_embedding_.expand({b, 1, d}), embedded}, 1) + position_embedding_;
  h = nn::layer_norm(h, pre_w_, pre_b_, c.layer_norm_eps);
  ClipVisionOutput out;
  if (layers_.size() < 2) out.penultimate = h;  // one layer: hidden_states[-2] is the embeddings' output
  for (size_t i = 0; i < layers_.size(); ++i) {
    h = layers_[i]->forward(std::move(h), {}, c.num_attention_heads, c.hidden_act, c.layer_norm_eps);
    if (i + 2 == layers_.size()) out.penultimate = h;
  }
  out.last_hidden_state = h;
  out.pooled = nn::layer_norm(h.select(1, 0), post_w_, post_b_, c.layer_norm_eps);
  return out;
}

std::vector<std::string> load_clip_vision_weights(ClipVisionModelImpl& model, const std::filesystem::path& path) {
  const std::string prefix = "vision_model.";  // the published checkpoints' names; transformers 5 saves without it
  return io::load_module_weights(model, path, io::transformers_weight_files(), [&](const std::string& name) {
    return name.rfind(prefix, 0) == 0 ? std::vector<std::string>{name.substr(prefix.size())}
                                      : std::vector<std::string>{};
  });
}

}  // namespace gclab::text
