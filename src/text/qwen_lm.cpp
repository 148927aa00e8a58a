#include "gclab/text/qwen_lm.h"

#include <stdexcept>

#include "gclab/io/json_file.h"
#include "gclab/io/safetensors.h"
#include "gclab/nn/meta_kernels.h"

namespace gclab::text {

QwenLmConfig QwenLmConfig::qwen3_4b() { return {}; }

QwenLmConfig QwenLmConfig::qwen3_8b() {
  QwenLmConfig c;
  c.hidden_size = 4096, c.intermediate_size = 12288, c.num_hidden_layers = 36;
  c.num_attention_heads = 32, c.num_key_value_heads = 8, c.head_dim = 128;
  c.lm_head = true;
  return c;
}

PixtralResidentConfig PixtralResidentConfig::tiny() {
  PixtralResidentConfig c;
  c.hidden_size = 16, c.intermediate_size = 32, c.num_hidden_layers = 2;
  return c;
}

QwenLmConfig QwenLmConfig::mistral_small_31() {
  QwenLmConfig c;  // Mistral3Config's text_config (model_type mistral)
  c.model_type = "mistral3";
  c.vocab_size = 131072, c.hidden_size = 5120, c.intermediate_size = 32768, c.num_hidden_layers = 40;
  c.num_attention_heads = 32, c.num_key_value_heads = 8, c.head_dim = 128;
  c.rms_norm_eps = 1e-5, c.rope_theta = 1e9;
  c.qk_norm = false, c.pixtral = PixtralResidentConfig(), c.lm_head = true;
  return c;
}

QwenLmConfig QwenLmConfig::qwen25_vl_7b() {
  QwenLmConfig c;
  c.model_type = "qwen2_5_vl";
  c.vocab_size = 152064, c.hidden_size = 3584, c.intermediate_size = 18944, c.num_hidden_layers = 28;
  c.num_attention_heads = 28, c.num_key_value_heads = 4, c.head_dim = 128;
  c.qk_norm = false, c.attention_bias = true, c.prefix = "model.", c.mrope_section = {16, 24, 24};
  c.vision = QwenVisionConfig::qwen25_vl_7b(), c.lm_head = true;
  return c;
}

QwenLmConfig QwenLmConfig::tiny(const QwenLmConfig& like) {
  QwenLmConfig c = like;
  c.vocab_size = 1000, c.hidden_size = 64, c.intermediate_size = 128, c.num_hidden_layers = 2;
  if (c.vision) c.vision = QwenVisionConfig::tiny(c.hidden_size);
  if (c.pixtral) c.pixtral = PixtralResidentConfig::tiny();
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 16;
  if (!c.mrope_section.empty()) c.mrope_section = {2, 3, 3}, c.image_token_id = c.vocab_size - 2;
  return c;
}

QwenLmConfig QwenLmConfig::from_json_file(const std::filesystem::path& path) {
  return io::parse_json_file(path, [](const nlohmann::json& root) {
    QwenLmConfig c;
    const std::string type = root.value("model_type", std::string());
    if (type == "qwen2_5_vl") {
      c = qwen25_vl_7b();
    } else if (type == "mistral3" || type == "mistral") {
      c = mistral_small_31();
      if (type == "mistral") c.pixtral.reset(), c.lm_head = false, c.model_type = type;
    } else if (type != "qwen3") {
      throw std::runtime_error("model_type is '" + type + "', not qwen3, qwen2_5_vl, mistral3 or mistral");
    }
    // Qwen2.5-VL keeps the language model's numbers in text_config (older files: at the top level).
    const nlohmann::json& j =
        root.contains("text_config") && root["text_config"].is_object() ? root["text_config"] : root;
    c.vocab_size = j.value("vocab_size", root.value("vocab_size", c.vocab_size));
    c.hidden_size = j.value("hidden_size", c.hidden_size);
    c.intermediate_size = j.value("intermediate_size", c.intermediate_size);
    c.num_hidden_layers = j.value("num_hidden_layers", c.num_hidden_layers);
    c.num_attention_heads = j.value("num_attention_heads", c.num_attention_heads);
    c.num_key_value_heads = j.value("num_key_value_heads", c.num_attention_heads);
    c.head_dim = j.contains("head_dim") && !j["head_dim"].is_null() ? j["head_dim"].get<int64_t>()
                                                                    : c.hidden_size / c.num_attention_heads;
    c.rms_norm_eps = j.value("rms_norm_eps", c.rms_norm_eps);
    if (j.contains("rope_parameters") && j["rope_parameters"].is_object())
      c.rope_theta = j["rope_parameters"].value("rope_theta", c.rope_theta);
    else
      c.rope_theta = j.value("rope_theta", c.rope_theta);
    // The rotary sections: rope_parameters (transformers 5) or rope_scaling (the published files), in
    // text_config or at the top level.
    for (const nlohmann::json* o : {&j, &root})
      for (const char* key : {"rope_parameters", "rope_scaling"})
        if (o->contains(key) && (*o)[key].is_object() && (*o)[key].contains("mrope_section"))
          c.mrope_section = (*o)[key]["mrope_section"].get<std::vector<int64_t>>();
    c.image_token_id = root.value("image_token_id", j.value("image_token_id", c.image_token_id));
    if (type == "qwen3") {
      c.attention_bias = j.value("attention_bias", false);
      // Qwen3ForCausalLM with an untied head (Qwen3-8B, klein 9B's) holds lm_head.weight; Qwen3Model and the
      // tied Qwen3-4B do not.
      bool causal_lm = false;
      for (const auto& a : root.value("architectures", nlohmann::json::array()))
        causal_lm = causal_lm || (a.is_string() && a.get<std::string>().find("ForCausalLM") != std::string::npos);
      c.lm_head = causal_lm && !root.value("tie_word_embeddings", false);
    }
    if (type == "mistral3") {
      c.lm_head = !j.value("tie_word_embeddings", root.value("tie_word_embeddings", false));
      c.pixtral->projector_bias = root.value("multimodal_projector_bias", false);
      c.pixtral->spatial_merge_size = root.value("spatial_merge_size", c.pixtral->spatial_merge_size);
      if (root.contains("vision_config") && root["vision_config"].is_object()) {
        const nlohmann::json& v = root["vision_config"];
        PixtralResidentConfig& o = *c.pixtral;
        o.hidden_size = v.value("hidden_size", o.hidden_size);
        o.intermediate_size = v.value("intermediate_size", o.intermediate_size);
        o.num_hidden_layers = v.value("num_hidden_layers", o.num_hidden_layers);
        o.patch_size = v.value("patch_size", o.patch_size);
        o.channels = v.value("num_channels", o.channels);
      }
    }
    // MistralConfig's sliding window (none in Mistral-Small-3.1; 4096 by default) is wider than the 512 tokens
    // the pipelines encode, so it hides nothing; a narrower one is not built.
    if ((type == "mistral" || type == "mistral3") && j.contains("sliding_window") && j["sliding_window"].is_number() &&
        j["sliding_window"].get<int64_t>() < 512)
      throw std::runtime_error("sliding_window below 512 tokens is not built");
    if (type == "qwen2_5_vl") {
      c.lm_head = !root.value("tie_word_embeddings", j.value("tie_word_embeddings", false));
      if (root.contains("vision_config") && root["vision_config"].is_object()) {
        const nlohmann::json& v = root["vision_config"];
        QwenVisionConfig& o = *c.vision;
        o.depth = v.value("depth", o.depth);
        o.hidden_size = v.value("hidden_size", o.hidden_size);
        o.intermediate_size = v.value("intermediate_size", o.intermediate_size);
        o.num_heads = v.value("num_heads", o.num_heads);
        o.out_hidden_size = v.value("out_hidden_size", c.hidden_size);
        o.in_channels = v.value("in_chans", v.value("in_channels", o.in_channels));
        o.patch_size = v.value("patch_size", o.patch_size);
        o.temporal_patch_size = v.value("temporal_patch_size", o.temporal_patch_size);
        o.spatial_merge_size = v.value("spatial_merge_size", o.spatial_merge_size);
        o.window_size = v.value("window_size", o.window_size);
        if (v.contains("fullatt_block_indexes"))
          o.fullatt_block_indexes = v["fullatt_block_indexes"].get<std::vector<int64_t>>();
        if (v.contains("rope_parameters") && v["rope_parameters"].is_object())
          o.rope_theta = v["rope_parameters"].value("rope_theta", o.rope_theta);
        if (v.value("hidden_act", std::string("silu")) != "silu")
          throw std::runtime_error("vision_config.hidden_act is not silu");
      }
    }
    if (j.value("hidden_act", std::string("silu")) != "silu") throw std::runtime_error("hidden_act is not silu");
    int64_t sections = 0;
    for (int64_t n : c.mrope_section) sections += n;
    if (!c.mrope_section.empty() && (c.mrope_section.size() != 3 || sections * 2 != c.head_dim))
      throw std::runtime_error("mrope_section must be three numbers summing to head_dim / 2 = " +
                               std::to_string(c.head_dim / 2));
    return c;
  });
}

namespace {

// Qwen3RMSNorm / Qwen2RMSNorm: in float32, back to the input's type, times the weight.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  const torch::Tensor f = x.to(torch::kFloat);
  const torch::Tensor y = f * torch::rsqrt(f.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * y.to(x.scalar_type());
}

}  // namespace

struct QwenLmImpl::Layer {
  nn::Linear q{nullptr}, k{nullptr}, v{nullptr}, o{nullptr}, gate{nullptr}, up{nullptr}, down{nullptr};
  torch::Tensor input_norm, post_norm, q_norm, k_norm;
};

QwenLmImpl::QwenLmImpl(QwenLmConfig config, const torch::TensorOptions& options) : config_(std::move(config)) {
  const auto& c = config_;
  const int64_t d = c.hidden_size, hd = c.head_dim;
  auto weight = [&](const std::string& path, int64_t n) {
    return nn::holder_at(*this, c.prefix + path).register_parameter("weight", torch::ones({n}, options));
  };
  embed_ = nn::holder_at(*this, c.prefix + "embed_tokens")
               .register_parameter("weight", torch::randn({c.vocab_size, d}, options) * 0.02);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    auto l = std::make_shared<Layer>();
    const std::string p = "layers." + std::to_string(i) + ".";
    auto linear = [&](const std::string& name, int64_t in, int64_t out, bool bias) {
      return nn::register_at(*this, c.prefix + p + name,
                             nn::Linear(nn::LinearOptions(in, out).bias(bias).tensor_options(options)));
    };
    l->q = linear("self_attn.q_proj", d, c.num_attention_heads * hd, c.attention_bias);
    l->k = linear("self_attn.k_proj", d, c.num_key_value_heads * hd, c.attention_bias);
    l->v = linear("self_attn.v_proj", d, c.num_key_value_heads * hd, c.attention_bias);
    l->o = linear("self_attn.o_proj", c.num_attention_heads * hd, d, false);
    if (c.qk_norm) {
      l->q_norm = weight(p + "self_attn.q_norm", hd);
      l->k_norm = weight(p + "self_attn.k_norm", hd);
    }
    l->gate = linear("mlp.gate_proj", d, c.intermediate_size, false);
    l->up = linear("mlp.up_proj", d, c.intermediate_size, false);
    l->down = linear("mlp.down_proj", c.intermediate_size, d, false);
    l->input_norm = weight(p + "input_layernorm", d);
    l->post_norm = weight(p + "post_attention_layernorm", d);
    layers_.push_back(l);
  }
  norm_ = weight("norm", d);
}

torch::Tensor QwenLmImpl::embed(const torch::Tensor& input_ids) const { return nn::embedding(embed_, input_ids); }

QwenLmOutput QwenLmImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                 bool keep_hidden_states) {
  // Positions 0..T-1 (Qwen2.5-VL's three rotary sections coincide for text: transformers' text-only forward
  // takes the same arange for each); the pipelines pad on the right.
  const int64_t batch = input_ids.size(0), length = input_ids.size(1);
  const torch::Tensor positions =
      torch::arange(length, input_ids.options().dtype(torch::kLong)).unsqueeze(0).expand({batch, length});
  return forward_embeds(embed(input_ids), positions, attention_mask, keep_hidden_states);
}

QwenLmOutput QwenLmImpl::forward_embeds(const torch::Tensor& inputs_embeds, const torch::Tensor& positions,
                                        const torch::Tensor& attention_mask, bool keep_hidden_states) {
  const auto& c = config_;
  torch::Tensor h = inputs_embeds;
  const int64_t batch = h.size(0), length = h.size(1), hd = c.head_dim;
  const auto long_opts = torch::TensorOptions().dtype(torch::kLong).device(h.device());
  const torch::Tensor inv_freq =
      1.0 / torch::pow(c.rope_theta, torch::arange(0, hd, 2, long_opts.dtype(torch::kFloat)) / static_cast<double>(hd));
  torch::Tensor freqs;  // [B, T, hd/2]
  if (positions.dim() == 3) {
    // Qwen2_5_VLRotaryEmbedding: section i of the frequencies follows position axis i % 3.
    const torch::Tensor all = positions.to(h.device(), torch::kFloat).unsqueeze(-1) * inv_freq;  // [3, B, T, hd/2]
    std::vector<torch::Tensor> parts;
    int64_t start = 0;
    const std::vector<int64_t> sections = c.mrope_section.empty() ? std::vector<int64_t>{hd / 2} : c.mrope_section;
    for (size_t i = 0; i < sections.size(); ++i) {
      parts.push_back(all[static_cast<int64_t>(i % 3)].slice(-1, start, start + sections[i]));
      start += sections[i];
    }
    freqs = torch::cat(parts, -1);
  } else {
    freqs = positions.to(h.device(), torch::kFloat).unsqueeze(-1) * inv_freq;
  }
  const torch::Tensor emb = torch::cat({freqs, freqs}, -1).unsqueeze(1);  // [B, 1, T, hd]
  const torch::Tensor cos = emb.cos().to(h.scalar_type()), sin = emb.sin().to(h.scalar_type());
  const torch::Tensor mask = nn::causal_additive_mask(length, attention_mask, h.options());  // causal, padding hidden
  const int64_t groups = c.num_attention_heads / c.num_key_value_heads;
  QwenLmOutput out;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (keep_hidden_states) out.hidden_states.push_back(h);
    Layer& l = *layers_[i];
    {  // the attention's tensors are freed before the MLP runs, as in transformers' forward
      const torch::Tensor n = rms_norm(h, l.input_norm, c.rms_norm_eps);
      torch::Tensor q = l.q->forward(n).view({batch, length, -1, hd});
      torch::Tensor k = l.k->forward(n).view({batch, length, -1, hd});
      if (c.qk_norm) q = rms_norm(q, l.q_norm, c.rms_norm_eps), k = rms_norm(k, l.k_norm, c.rms_norm_eps);
      q = nn::apply_rope_half(q.transpose(1, 2), cos, sin);
      k = nn::apply_rope_half(k.transpose(1, 2), cos, sin).repeat_interleave(groups, 1);
      const torch::Tensor v =
          l.v->forward(n).view({batch, length, -1, hd}).transpose(1, 2).repeat_interleave(groups, 1);
      const torch::Tensor a = nn::attention(q, k, v, mask, 1.0 / std::sqrt(static_cast<double>(hd)));
      h = h + l.o->forward(a.transpose(1, 2).reshape({batch, length, -1}));
    }
    h = h + nn::swiglu(*l.gate, *l.up, *l.down, rms_norm(h, l.post_norm, c.rms_norm_eps));
    if (i + 2 == layers_.size()) out.penultimate = h;
  }
  if (layers_.size() < 2) out.penultimate = h;
  out.last_hidden_state = rms_norm(h, norm_, c.rms_norm_eps);
  if (keep_hidden_states) out.hidden_states.push_back(out.last_hidden_state);
  return out;
}

std::shared_ptr<torch::nn::Module> pixtral_resident(const PixtralResidentConfig& c, int64_t text_hidden,
                                                    const torch::TensorOptions& options) {
  auto m = std::make_shared<torch::nn::Module>("PixtralResident");
  const int64_t d = c.hidden_size;
  auto linear = [&](const std::string& path, int64_t in, int64_t out, bool bias = false) {
    nn::register_at(*m, path, nn::Linear(nn::LinearOptions(in, out).bias(bias).tensor_options(options)));
  };
  auto norm = [&](const std::string& path) {
    nn::holder_at(*m, path).register_parameter("weight", torch::ones({d}, options));
  };
  nn::holder_at(*m, "vision_tower.patch_conv")
      .register_parameter("weight", torch::randn({d, c.channels, c.patch_size, c.patch_size}, options) * 0.02);
  norm("vision_tower.ln_pre");
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "vision_tower.transformer.layers." + std::to_string(i) + ".";
    norm(p + "attention_norm"), norm(p + "ffn_norm");
    for (const char* name : {"q_proj", "k_proj", "v_proj", "o_proj"}) linear(p + "attention." + name, d, d);
    linear(p + "feed_forward.gate_proj", d, c.intermediate_size);
    linear(p + "feed_forward.up_proj", d, c.intermediate_size);
    linear(p + "feed_forward.down_proj", c.intermediate_size, d);
  }
  norm("multi_modal_projector.norm");
  const int64_t merged = d * c.spatial_merge_size * c.spatial_merge_size;
  linear("multi_modal_projector.patch_merger.merging_layer", merged, d);
  linear("multi_modal_projector.linear_1", d, text_hidden, c.projector_bias);
  linear("multi_modal_projector.linear_2", text_hidden, text_hidden, c.projector_bias);
  return m;
}

QwenLmOutput qwen_forward_with_images(QwenLmImpl& model, QwenVisionTowerImpl& tower, const torch::Tensor& input_ids,
                                      const torch::Tensor& attention_mask, const QwenVisionInput& images) {
  const int64_t image_token = model.config().image_token_id;
  torch::Tensor embeds = model.embed(input_ids);
  const torch::Tensor is_image = input_ids == image_token;
  const int64_t image_tokens = is_image.sum().item<int64_t>();
  const torch::Tensor tokens = tower.forward(images).to(embeds.scalar_type());
  if (image_tokens != tokens.size(0))
    throw std::invalid_argument("the images give " + std::to_string(tokens.size(0)) + " tokens but input_ids has " +
                                std::to_string(image_tokens) + " image tokens");
  embeds = nn::masked_scatter(embeds, is_image.unsqueeze(-1).to(embeds.device()), tokens);
  const torch::Tensor positions =
      qwen_mrope_positions(input_ids, attention_mask, image_token, images.grid_thw, tower.config().spatial_merge_size);
  return model.forward_embeds(embeds, positions, attention_mask);
}

torch::Tensor qwen_mrope_positions(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                   int64_t image_token_id, const torch::Tensor& grid_thw, int64_t spatial_merge_size) {
  const torch::Tensor ids_cpu = input_ids.to(torch::kCPU, torch::kLong).contiguous();
  const torch::Tensor keep_cpu =
      (attention_mask.defined() ? attention_mask.to(torch::kCPU) != 0 : torch::ones(ids_cpu.sizes(), torch::kBool))
          .contiguous();
  const torch::Tensor grid_cpu =
      grid_thw.defined() ? grid_thw.to(torch::kCPU, torch::kLong).contiguous() : torch::zeros({0, 3}, torch::kLong);
  const auto ids = ids_cpu.accessor<int64_t, 2>();
  const auto keep = keep_cpu.accessor<bool, 2>();
  const auto grid = grid_cpu.accessor<int64_t, 2>();
  const int64_t batch = ids_cpu.size(0), length = ids_cpu.size(1), m = spatial_merge_size, images = grid_cpu.size(0);
  torch::Tensor out = torch::zeros({3, batch, length}, torch::kLong);
  auto acc = out.accessor<int64_t, 3>();
  int64_t image = 0;  // the images are consumed in order, across the batch (as get_rope_index's iterator)
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<int64_t> kept;
    for (int64_t i = 0; i < length; ++i)
      if (keep[b][i]) kept.push_back(i);
    const auto n = static_cast<int64_t>(kept.size());
    int64_t pos = 0, t = 0;
    while (t < n) {
      if (ids[b][kept[t]] != image_token_id) {
        for (int a = 0; a < 3; ++a) acc[a][b][kept[t]] = pos;
        ++pos, ++t;
        continue;
      }
      if (image >= images)
        throw std::invalid_argument("more runs of image tokens than images (" + std::to_string(images) + ")");
      const int64_t gt = grid[image][0], gh = grid[image][1] / m, gw = grid[image][2] / m;
      ++image;
      int64_t run = 0;
      while (t + run < n && ids[b][kept[t + run]] == image_token_id) ++run;
      if (run != gt * gh * gw)
        throw std::invalid_argument("an image of " + std::to_string(gt * gh * gw) + " tokens has a run of " +
                                    std::to_string(run) + " image tokens in the text");
      for (int64_t f = 0; f < gt; ++f)
        for (int64_t r = 0; r < gh; ++r)
          for (int64_t col = 0; col < gw; ++col, ++t) {
            acc[0][b][kept[t]] = pos + f;
            acc[1][b][kept[t]] = pos + r;
            acc[2][b][kept[t]] = pos + col;
          }
      pos += std::max(gh, gw);
    }
  }
  if (image != images)
    throw std::invalid_argument(std::to_string(images) + " images but " + std::to_string(image) +
                                " runs of image tokens in the text");
  return out.to(input_ids.device());
}

std::vector<std::string> load_qwen_lm_weights(QwenLmImpl& model, const std::filesystem::path& path) {
  const std::string prefix = model.config().prefix;
  return io::load_module_weights(model, path, io::transformers_weight_files(), [&](const std::string& name) {
    const std::string bare = name.substr(prefix.size());
    // transformers 5's Mistral3 and Qwen2.5-VL (model.language_model.), the published Mistral3 files
    // (language_model.model.).
    return std::vector<std::string>{prefix.empty() ? "model." + bare : bare, "model.language_model." + bare,
                                    "language_model.model." + bare};
  });
}

}  // namespace gclab::text
