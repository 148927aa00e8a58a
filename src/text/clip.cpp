#include "gclab/text/clip.h"

#include <stdexcept>

#include "gclab/io/json_file.h"
#include "gclab/io/safetensors.h"
#include "gclab/nn/meta_kernels.h"

namespace gclab::text {

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
    const std::string act = j.value("hidden_act", std::string(nn::name_of(c.hidden_act)));
    const auto parsed = nn::parse_activation(act);
    if (!parsed || (*parsed != nn::Activation::quick_gelu && *parsed != nn::Activation::gelu))
      throw std::runtime_error("hidden_act " + act + " is not one gclab builds");
    c.hidden_act = *parsed;
    c.layer_norm_eps = j.value("layer_norm_eps", c.layer_norm_eps);
    for (const auto& a : j.value("architectures", nlohmann::json::array()))
      if (a == "CLIPTextModelWithProjection") c.with_projection = true;
    return c;
  });
}

struct ClipTextModelImpl::Layer {
  nn::Linear q{nullptr}, k{nullptr}, v{nullptr}, out{nullptr}, fc1{nullptr}, fc2{nullptr};
  torch::Tensor ln1_w, ln1_b, ln2_w, ln2_b;
};

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
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    auto l = std::make_shared<Layer>();
    const std::string p = "text_model.encoder.layers." + std::to_string(i) + ".";
    l->q = nn::register_at(*this, p + "self_attn.q_proj", nn::Linear(nn::LinearOptions(d, d).tensor_options(options)));
    l->k = nn::register_at(*this, p + "self_attn.k_proj", nn::Linear(nn::LinearOptions(d, d).tensor_options(options)));
    l->v = nn::register_at(*this, p + "self_attn.v_proj", nn::Linear(nn::LinearOptions(d, d).tensor_options(options)));
    l->out =
        nn::register_at(*this, p + "self_attn.out_proj", nn::Linear(nn::LinearOptions(d, d).tensor_options(options)));
    norm(p + "layer_norm1", l->ln1_w, l->ln1_b);
    l->fc1 = nn::register_at(*this, p + "mlp.fc1",
                             nn::Linear(nn::LinearOptions(d, c.intermediate_size).tensor_options(options)));
    l->fc2 = nn::register_at(*this, p + "mlp.fc2",
                             nn::Linear(nn::LinearOptions(c.intermediate_size, d).tensor_options(options)));
    norm(p + "layer_norm2", l->ln2_w, l->ln2_b);
    layers_.push_back(l);
  }
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
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.hidden_size / heads));
  auto act = [&](const torch::Tensor& x) { return nn::activate(c.hidden_act, x); };
  ClipTextOutput out;
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer& l = *layers_[i];
    {  // the attention's tensors are freed before the MLP runs, as in transformers' forward
      const torch::Tensor n = nn::layer_norm(h, l.ln1_w, l.ln1_b, c.layer_norm_eps);
      auto split = [&](nn::Linear& proj) { return proj->forward(n).view({batch, length, heads, -1}).transpose(1, 2); };
      torch::Tensor a = nn::attention(split(l.q), split(l.k), split(l.v), mask, scale);
      a = a.transpose(1, 2).reshape({batch, length, c.hidden_size});
      h = h + l.out->forward(a);
    }
    torch::Tensor f = l.fc1->forward(nn::layer_norm(h, l.ln2_w, l.ln2_b, c.layer_norm_eps));
    f = act(f);  // CLIPMLP: fc1's output replaced by its activation, then fc2
    h = h + l.fc2->forward(f);
    if (i + 2 == layers_.size()) out.penultimate = h;
  }
  if (layers_.size() < 2) out.penultimate = h;  // one layer: hidden_states[-2] is the embeddings' output
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
