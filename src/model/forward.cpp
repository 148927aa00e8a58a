#include "gclab/model/forward.h"

#include <stdexcept>

#include "gclab/io/safetensors.h"

namespace gclab::model {

namespace {

torch::Tensor find(const io::SafetensorsFile& file, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (file.contains(n)) return file.tensor(n);
  return {};
}

void expect(bool ok, const std::filesystem::path& path, const std::string& what) {
  if (!ok) throw std::runtime_error(path.string() + ": " + what);
}

}  // namespace

ModelInputs read_model_inputs(const ModelSpec& spec, const std::filesystem::path& path, const torch::Device& device,
                              torch::ScalarType dtype) {
  const auto file = io::SafetensorsFile::open(path);
  ModelInputs in;
  auto to = [&](const torch::Tensor& t) { return t.defined() ? t.to(device, dtype) : t; };
  in.latents = to(find(file, {"latents", "hidden_states"}));
  expect(in.latents.defined(), path, "no 'latents' tensor");
  const int64_t rank = static_cast<int64_t>(model::latent_shape(spec, {1, 1, 0, 0}).size());
  const std::string s = std::to_string(spec.latent_spatial);
  expect(in.latents.dim() == rank && in.latents.size(1) == spec.latent_channels, path,
         "latents must be [B, " + std::to_string(spec.latent_channels) + (rank == 5 ? ", F'" : "") + ", H/" + s +
             ", W/" + s + "], got " + c10::str(in.latents.sizes()));
  const int64_t cell = spec.patch;
  expect(in.latents.size(-2) % cell == 0 && in.latents.size(-1) % cell == 0, path,
         "latent height and width must be multiples of the patch size " + std::to_string(cell));
  const int64_t batch = in.latents.size(0);
  // The timestep and guidance stay float32 as the pipelines hand them over; each model casts them where its
  // diffusers code does (FLUX rounds them to the latents' dtype first).
  auto to_float = [&](const torch::Tensor& t) { return t.defined() ? t.to(device, torch::kFloat) : t; };
  in.timestep = to_float(find(file, {"timestep", "timesteps"}));
  // One value per sample, or (Wan 2.2 TI2V's per-token timesteps) [B, S].
  const int64_t tokens =
      (in.latents.dim() == 5 ? in.latents.size(2) : 1) * (in.latents.size(-2) / cell) * (in.latents.size(-1) / cell);
  const bool per_token =
      in.timestep.defined() && in.timestep.dim() == 2 && in.timestep.size(0) == batch && in.timestep.size(1) == tokens;
  expect(in.timestep.defined() && (in.timestep.numel() == batch || per_token), path,
         "needs 'timestep' with one value per sample (or per token, [B, S])");
  if (!per_token) in.timestep = in.timestep.reshape({batch});
  if (spec.text_dim) {
    in.text = to(find(file, {"text", "encoder_hidden_states"}));
    expect(in.text.defined() && in.text.dim() == 3 && in.text.size(0) == batch && in.text.size(2) == spec.text_dim,
           path, "needs 'text' [B, T, " + std::to_string(spec.text_dim) + "]");
  }
  if (const torch::Tensor mask = find(file, {"text_mask"}); mask.defined()) {  // optional: every row a token
    expect(in.text.defined() && mask.dim() == 2 && mask.size(0) == batch && mask.size(1) == in.text.size(1), path,
           "'text_mask' must be [B, T] like 'text'");
    in.text_mask = mask.to(device, torch::kLong);
  }
  if (spec.pooled_dim) {
    in.pooled = to(find(file, {"pooled", "pooled_projections"}));
    expect(in.pooled.defined() && in.pooled.sizes() == c10::IntArrayRef({batch, spec.pooled_dim}), path,
           "needs 'pooled' [B, " + std::to_string(spec.pooled_dim) + "]");
  }
  if (spec.guidance_embed) {
    in.guidance = to_float(find(file, {"guidance"}));
    expect(in.guidance.defined() && in.guidance.numel() == batch, path, "needs 'guidance' with one value per sample");
    in.guidance = in.guidance.reshape({batch});
  }
  if (spec.num_classes) {
    const torch::Tensor labels = find(file, {"class_labels"});
    if (labels.defined()) {
      in.class_labels = labels.to(device, torch::kLong).reshape({batch});
      expect((in.class_labels >= 0).all().item<bool>() && (in.class_labels <= spec.num_classes).all().item<bool>(),
             path, "class_labels must lie in [0, " + std::to_string(spec.num_classes) + "]");
    }
  }
  for (int r = 0; file.contains("reference_latents." + std::to_string(r)); ++r)
    in.reference_latents.push_back(to(file.tensor("reference_latents." + std::to_string(r))));
  if (spec.condition_input_channels) {
    in.condition_channels = to(find(file, {"condition_channels"}));
    std::vector<int64_t> want = in.latents.sizes().vec();
    want[1] = spec.condition_input_channels;
    expect(in.condition_channels.defined() && in.condition_channels.sizes() == c10::IntArrayRef(want), path,
           "needs 'condition_channels' " + c10::str(c10::IntArrayRef(want)));
  }
  if (spec.image_embed_dim) {
    in.image_embeds = to(find(file, {"image_embeds", "encoder_hidden_states_image"}));
    expect(in.image_embeds.defined() && in.image_embeds.dim() == 3 && in.image_embeds.size(0) == batch &&
               in.image_embeds.size(2) == spec.image_embed_dim,
           path, "needs 'image_embeds' [B, N, " + std::to_string(spec.image_embed_dim) + "]");
  }
  return in;
}

std::vector<std::pair<std::string, torch::Tensor>> model_inputs_state(const ModelInputs& in) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  auto add = [&](const char* name, const torch::Tensor& t) {
    if (t.defined()) out.emplace_back(name, t);
  };
  add("latents", in.latents);
  add("timestep", in.timestep);
  add("text", in.text);
  add("pooled", in.pooled);
  add("guidance", in.guidance);
  add("class_labels", in.class_labels);
  add("condition_channels", in.condition_channels);
  add("image_embeds", in.image_embeds);
  for (size_t r = 0; r < in.reference_latents.size(); ++r)
    out.emplace_back("reference_latents." + std::to_string(r), in.reference_latents[r]);
  return out;
}

std::map<std::string, std::string> spec_metadata(const ModelSpec& s) {
  std::string axes;
  for (int64_t a : s.rope_axes) axes += (axes.empty() ? "" : ",") + std::to_string(a);
  return {{"preset", s.preset},
          {"family", s.family.name()},
          {"hidden", std::to_string(s.hidden)},
          {"heads", std::to_string(s.heads)},
          {"double_blocks", std::to_string(s.double_blocks)},
          {"single_blocks", std::to_string(s.single_blocks)},
          {"refiner_blocks", std::to_string(s.refiner_blocks)},
          {"mlp_hidden", std::to_string(s.mlp_hidden)},
          {"latent_channels", std::to_string(s.latent_channels)},
          {"out_channels", std::to_string(s.out_channels)},
          {"patch", std::to_string(s.patch)},
          {"text_dim", std::to_string(s.text_dim)},
          {"pooled_dim", std::to_string(s.pooled_dim)},
          {"guidance_embed", s.guidance_embed ? "1" : "0"},
          {"rope_axes", axes},
          {"rope_theta", std::to_string(s.rope_theta)},
          {"adaln_dim", std::to_string(s.adaln_dim)},
          {"t_embed_mid", std::to_string(s.t_embed_mid)},
          {"num_classes", std::to_string(s.num_classes)},
          {"pos_embed_max", std::to_string(s.pos_embed_max)},
          {"sd3_base_size", std::to_string(s.sd3_base_size)}};
}

}  // namespace gclab::model
