#include "gclab/text/t5.h"

#include <cmath>
#include <stdexcept>

#include "gclab/io/json_file.h"
#include "gclab/io/safetensors.h"
#include "gclab/nn/layers.h"
#include "gclab/nn/meta_kernels.h"

namespace gclab::text {

T5Config T5Config::tiny() {
  T5Config c;
  c.vocab_size = 1000, c.d_model = 64, c.d_kv = 16, c.d_ff = 128, c.num_layers = 2, c.num_heads = 4;
  return c;
}

T5Config T5Config::umt5_xxl() {
  T5Config c;
  c.vocab_size = 256384, c.bias_per_layer = true;
  return c;
}

T5Config T5Config::from_json_file(const std::filesystem::path& path) {
  return io::parse_json_file(path, [](const nlohmann::json& j) {
    T5Config c;
    const std::string type = j.value("model_type", std::string("t5"));
    if (type != "t5" && type != "umt5")
      throw std::runtime_error("model_type is " + j["model_type"].dump() + ", not t5 or umt5");
    c.bias_per_layer = type == "umt5";
    // transformers' T5Config defaults (t5-small), UMT5Config's (umt5-small) for a umt5 file.
    const bool umt5 = c.bias_per_layer;
    c.vocab_size = j.value("vocab_size", umt5 ? int64_t{250112} : c.vocab_size);
    c.d_model = j.value("d_model", int64_t{512});
    c.d_kv = j.value("d_kv", int64_t{64});
    c.d_ff = j.value("d_ff", umt5 ? int64_t{1024} : int64_t{2048});
    c.num_layers = j.value("num_layers", umt5 ? int64_t{8} : int64_t{6});
    c.num_heads = j.value("num_heads", umt5 ? int64_t{6} : int64_t{8});
    c.relative_attention_num_buckets = j.value("relative_attention_num_buckets", c.relative_attention_num_buckets);
    c.relative_attention_max_distance = j.value("relative_attention_max_distance", c.relative_attention_max_distance);
    c.layer_norm_epsilon = j.value("layer_norm_epsilon", c.layer_norm_epsilon);
    // feed_forward_proj: "relu", "gelu", "gated-gelu", "gated-silu"...; "gated-gelu" means gelu_new.
    const std::string proj = j.value("feed_forward_proj", std::string(umt5 ? "gated-gelu" : "relu"));
    c.gated = proj.rfind("gated-", 0) == 0;
    std::string act = c.gated ? proj.substr(6) : proj;
    if (act == "gelu" && c.gated) act = "gelu_new";
    const auto parsed = nn::parse_activation(act);
    if (!parsed || *parsed == nn::Activation::quick_gelu)
      throw std::runtime_error("feed_forward_proj " + proj + " is not one gclab builds");
    c.dense_act_fn = *parsed;
    return c;
  });
}

namespace {

// T5LayerNorm: x / sqrt(mean(x², float32) + eps), back to the weight's half type, times the weight.
torch::Tensor t5_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  const torch::Tensor variance = x.to(torch::kFloat).pow(2).mean(-1, /*keepdim=*/true);
  torch::Tensor y = x * torch::rsqrt(variance + eps);
  if (weight.scalar_type() == torch::kHalf || weight.scalar_type() == torch::kBFloat16) y = y.to(weight.scalar_type());
  return weight * y;
}

// _relative_position_bucket, bidirectional (the encoder): half the buckets for keys after the query, and
// within each half exact buckets for small distances, logarithmic ones up to max_distance.
torch::Tensor relative_position_bucket(const torch::Tensor& relative, int64_t num_buckets, int64_t max_distance) {
  const int64_t half = num_buckets / 2;
  torch::Tensor buckets = (relative > 0).to(torch::kLong) * half;
  const torch::Tensor distance = torch::maximum(relative, -relative);  // |relative| (abs has no meta kernel)
  const int64_t max_exact = half / 2;
  const torch::Tensor is_small = distance < max_exact;
  torch::Tensor large = max_exact + (torch::log(distance.to(torch::kFloat) / static_cast<double>(max_exact)) /
                                     std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact)) *
                                     static_cast<double>(half - max_exact))
                                        .to(torch::kLong);
  large = torch::min(large, torch::full_like(large, half - 1));
  return buckets + nn::where(is_small, distance, large);
}

}  // namespace

struct T5EncoderImpl::Block {
  nn::Linear q{nullptr}, k{nullptr}, v{nullptr}, o{nullptr}, wi_0{nullptr}, wi_1{nullptr}, wo{nullptr};
  torch::Tensor attention_norm, ff_norm;
  torch::Tensor relative_attention_bias;  // the first block's, or every block's (UMT5)
};

T5EncoderImpl::T5EncoderImpl(T5Config config, const torch::TensorOptions& options) : config_(std::move(config)) {
  const auto& c = config_;
  const int64_t inner = c.num_heads * c.d_kv;
  // nn.Embedding's initialisation N(0, 1) (transformers re-initialises on load; random runs use these).
  shared_ =
      nn::holder_at(*this, "shared").register_parameter("weight", torch::randn({c.vocab_size, c.d_model}, options));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    auto b = std::make_shared<Block>();
    const std::string p = "encoder.block." + std::to_string(i) + ".layer.";
    b->q = nn::register_at(*this, p + "0.SelfAttention.q",
                           nn::Linear(nn::LinearOptions(c.d_model, inner).bias(false).tensor_options(options)));
    b->k = nn::register_at(*this, p + "0.SelfAttention.k",
                           nn::Linear(nn::LinearOptions(c.d_model, inner).bias(false).tensor_options(options)));
    b->v = nn::register_at(*this, p + "0.SelfAttention.v",
                           nn::Linear(nn::LinearOptions(c.d_model, inner).bias(false).tensor_options(options)));
    b->o = nn::register_at(*this, p + "0.SelfAttention.o",
                           nn::Linear(nn::LinearOptions(inner, c.d_model).bias(false).tensor_options(options)));
    if (i == 0 || c.bias_per_layer)
      b->relative_attention_bias =
          nn::holder_at(*this, p + "0.SelfAttention.relative_attention_bias")
              .register_parameter("weight", torch::randn({c.relative_attention_num_buckets, c.num_heads}, options));
    b->attention_norm =
        nn::holder_at(*this, p + "0.layer_norm").register_parameter("weight", torch::ones({c.d_model}, options));
    if (c.gated) {
      b->wi_0 = nn::register_at(*this, p + "1.DenseReluDense.wi_0",
                                nn::Linear(nn::LinearOptions(c.d_model, c.d_ff).bias(false).tensor_options(options)));
      b->wi_1 = nn::register_at(*this, p + "1.DenseReluDense.wi_1",
                                nn::Linear(nn::LinearOptions(c.d_model, c.d_ff).bias(false).tensor_options(options)));
    } else {
      b->wi_0 = nn::register_at(*this, p + "1.DenseReluDense.wi",
                                nn::Linear(nn::LinearOptions(c.d_model, c.d_ff).bias(false).tensor_options(options)));
    }
    b->wo = nn::register_at(*this, p + "1.DenseReluDense.wo",
                            nn::Linear(nn::LinearOptions(c.d_ff, c.d_model).bias(false).tensor_options(options)));
    b->ff_norm =
        nn::holder_at(*this, p + "1.layer_norm").register_parameter("weight", torch::ones({c.d_model}, options));
    blocks_.push_back(b);
  }
  final_norm_ =
      nn::holder_at(*this, "encoder.final_layer_norm").register_parameter("weight", torch::ones({c.d_model}, options));
}

torch::Tensor T5EncoderImpl::position_bias(const torch::Tensor& table, int64_t length,
                                           const torch::Device& device) const {
  const auto opts = torch::TensorOptions().dtype(torch::kLong).device(device);
  const torch::Tensor context = torch::arange(length, opts).unsqueeze(1);
  const torch::Tensor memory = torch::arange(length, opts).unsqueeze(0);
  const torch::Tensor buckets = relative_position_bucket(memory - context, config_.relative_attention_num_buckets,
                                                         config_.relative_attention_max_distance);
  // [T, T, heads] -> [1, heads, T, T]
  return nn::embedding(table, buckets).permute({2, 0, 1}).unsqueeze(0);
}

torch::Tensor T5EncoderImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask) {
  const auto& c = config_;
  const int64_t batch = input_ids.size(0), length = input_ids.size(1);
  torch::Tensor h = nn::embedding(shared_, input_ids);
  // The relative-position bias (T5: computed once, by the first block; UMT5: by each block), plus the
  // padding mask as the smallest finite value where a key is padding.
  const torch::Tensor hidden =
      attention_mask.defined() ? (attention_mask.to(h.device()) == 0).view({batch, 1, 1, length}) : torch::Tensor();
  auto bias_of = [&](const Block& b) {
    torch::Tensor bias = position_bias(b.relative_attention_bias, length, h.device()).to(h.scalar_type());
    return hidden.defined() ? bias.masked_fill(hidden, nn::lowest_value(bias.scalar_type())) : bias;
  };
  torch::Tensor bias = bias_of(*blocks_.front());
  const bool fp16 = h.scalar_type() == torch::kHalf;
  auto clamp_fp16 = [&](torch::Tensor x) {  // transformers clamps inf values in float16
    if (!fp16) return x;
    const double limit = 65504.0 - 1000.0;
    return torch::clamp(x, -limit, limit);
  };
  for (const auto& b : blocks_) {
    if (c.bias_per_layer && b != blocks_.front()) bias = bias_of(*b);
    {  // the attention's tensors are freed before the feed-forward runs, as in transformers' forward
      const torch::Tensor n = t5_norm(h, b->attention_norm, c.layer_norm_epsilon);
      auto heads = [&](nn::Linear& l) {
        return l->forward(n).view({batch, length, c.num_heads, c.d_kv}).transpose(1, 2);
      };
      const torch::Tensor q = heads(b->q), k = heads(b->k), v = heads(b->v);
      // No scaling of the scores: T5 folds it into its initialisation.
      torch::Tensor a = nn::attention(q, k, v, bias, /*scale=*/1.0);
      a = a.transpose(1, 2).reshape({batch, length, c.num_heads * c.d_kv});
      h = clamp_fp16(h + b->o->forward(a));
    }
    const torch::Tensor n = t5_norm(h, b->ff_norm, c.layer_norm_epsilon);
    torch::Tensor f = nn::activate(c.dense_act_fn, b->wi_0->forward(n));
    if (c.gated) f = f * b->wi_1->forward(n);
    h = clamp_fp16(h + b->wo->forward(f));
  }
  return t5_norm(h, final_norm_, c.layer_norm_epsilon);
}

std::vector<std::string> load_t5_weights(T5EncoderImpl& encoder, const std::filesystem::path& path) {
  return io::load_module_weights(encoder, path, io::transformers_weight_files(), [](const std::string& name) {
    return name == "shared.weight" ? std::vector<std::string>{"encoder.embed_tokens.weight"}
                                   : std::vector<std::string>{};
  });
}

}  // namespace gclab::text
