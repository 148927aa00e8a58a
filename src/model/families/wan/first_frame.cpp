// Wan 2.1 I2V's conditioning on each sample's first frame in training, as AI Toolkit computes it in
// Wan21I2V.get_noise_prediction (toolkit/models/wan21/wan21_i2v.py:481-524): the frame's CLIP image tokens
// (preprocess_clip_image, :458-479, then the vision tower's hidden_states[-2]) and the 20 channels of
// add_first_frame_conditioning (toolkit/models/wan21/wan_utils.py:5-113) — a 4-channel mask that is 1 on the
// first latent frame, and the latents of a video that is the first frame followed by black — concatenated
// after the noisy latents: [noisy 16, mask 4, condition 16].
#include <nlohmann/json.hpp>

#include <stdexcept>

#include "gclab/config/user_error.h"
#include "gclab/data/image.h"
#include "gclab/io/json_file.h"
#include "gclab/memory/placement.h"
#include "gclab/model/frame_conditioning.h"
#include "gclab/nn/meta_kernels.h"
#include "gclab/text/clip.h"

namespace gclab::model::wan {
namespace {

namespace F = torch::nn::functional;

// The image processor (CLIPImageProcessor): preprocessor_config.json's image_mean / image_std and its resize's
// shortest edge and centre crop, else its defaults (OPENAI_CLIP_MEAN / OPENAI_CLIP_STD, transformers'
// image_utils) at the tower's size.
struct ClipProcessor {
  std::vector<double> mean = {0.48145466, 0.4578275, 0.40821073};
  std::vector<double> std = {0.26862954, 0.26130258, 0.27577711};
  int64_t shortest_edge = 224, crop_height = 224, crop_width = 224;
};

ClipProcessor read_processor(const std::filesystem::path& folder, int64_t image_size) {
  ClipProcessor n;
  n.shortest_edge = n.crop_height = n.crop_width = image_size;
  const auto file = folder / "preprocessor_config.json";
  if (folder.empty() || !std::filesystem::is_regular_file(file)) return n;
  return io::parse_json_file(file, [&](const nlohmann::json& j) {
    n.mean = j.value("image_mean", n.mean);
    n.std = j.value("image_std", n.std);
    if (n.mean.size() != 3 || n.std.size() != 3)
      throw UserError(file.string() + ": image_mean and image_std must have 3 values each");
    if (j.contains("size") && j["size"].is_object())
      n.shortest_edge = j["size"].value("shortest_edge", n.shortest_edge);
    if (j.contains("crop_size") && j["crop_size"].is_object()) {
      n.crop_height = j["crop_size"].value("height", n.crop_height);
      n.crop_width = j["crop_size"].value("width", n.crop_width);
    }
    return n;
  });
}

// The first frame [B, 3, H, W] scaled (bilinear) to `h` x `w` latents' pixels, as both conditionings scale it
// (F.interpolate(first_frame, size=(H * scale, W * scale), mode="bilinear")): the identity at the bucket's size.
torch::Tensor at_latents_size(const torch::Tensor& frame, int64_t h, int64_t w, int64_t scale) {
  return F::interpolate(frame, F::InterpolateFuncOptions()
                                   .size(std::vector<int64_t>{h * scale, w * scale})
                                   .mode(torch::kBilinear)
                                   .align_corners(false));
}

// A preview's control image: read and resized to the preview's size in host memory (PIL's LANCZOS in AI
// Toolkit, stb's filter here: the same at the same size), uint8 [H, W, 3].
torch::Tensor control_image(const std::filesystem::path& file, int64_t width, int64_t height) {
  memory::HostScope host;
  return data::resize_rgb(data::decode_image_rgb(file), static_cast<int>(width), static_cast<int>(height));
}

torch::Tensor normalise(const torch::Tensor& x, const ClipProcessor& p) {
  const auto o = x.options();
  const torch::Tensor mean = torch::tensor(p.mean, o.dtype(torch::kDouble)).to(o).view({1, 3, 1, 1});
  const torch::Tensor std = torch::tensor(p.std, o.dtype(torch::kDouble)).to(o).view({1, 3, 1, 1});
  return (x - mean) / std;
}

class WanFirstFrame final : public FrameConditioning {
 public:
  WanFirstFrame(const ModelSpec& spec, const FrameConditioningSource& source)
      : spec_(spec), dtype_(source.dtype), device_(source.device) {
    if (spec.image_embed_dim <= 0) return;  // Wan 2.2 I2V: the channels only, no image tokens
    const std::filesystem::path config_file = source.image_encoder / "config.json";
    const bool local = !source.image_encoder.empty() && std::filesystem::is_regular_file(config_file);
    text::ClipVisionConfig config;
    try {
      config = local       ? text::ClipVisionConfig::from_json_file(config_file)
               : spec.tiny ? text::ClipVisionConfig::tiny()
                           : text::ClipVisionConfig::vit_h14();
    } catch (const std::runtime_error& e) {
      throw UserError("image_encoder: " + std::string(e.what()));
    }
    if (config.hidden_size != spec.image_embed_dim || config.positions() != spec.image_embed_tokens)
      throw UserError("image_encoder: a CLIP vision tower of width " + std::to_string(config.hidden_size) + " and " +
                      std::to_string(config.positions()) + " tokens, where the transformer takes " +
                      std::to_string(spec.image_embed_tokens) + " tokens of " + std::to_string(spec.image_embed_dim));
    torch::manual_seed(source.seed + 7);
    const torch::Device where =
        source.encoder_in_host_memory && device_.is_cuda() ? torch::Device(torch::kCPU) : device_;
    encoder_ = text::ClipVisionModel(config, torch::TensorOptions().device(where).dtype(dtype_));
    for (auto& p : encoder_->parameters()) p.set_requires_grad(false);
    encoder_->eval();
    if (local && !device_.is_meta()) {
      try {
        text::load_clip_vision_weights(*encoder_, source.image_encoder);
        loaded_ = true;
      } catch (const std::runtime_error& e) {
        throw UserError("image_encoder: " + source.image_encoder.string() + ": " + e.what());
      }
    }
    processor_ = read_processor(source.image_processor, config.image_size);
  }

  torch::nn::Module* image_encoder() override { return encoder_ ? encoder_.get() : nullptr; }

  std::string describe() const override {
    if (!encoder_) return "none";
    return "a CLIP vision tower (" + std::to_string(parameter_count(*encoder_)) + " parameters, " +
           (loaded_ ? "weights loaded" : "random weights") + ")";
  }

  void condition(ModelInputs& in, const FirstFrames& first, const torch::Tensor& x0, const Encode& encode) override {
    // The pixels always (a cache of latents is refused when the run is planned: caches_first_frame_latents).
    if (!first.pixels.defined()) throw std::logic_error("Wan 2.1 I2V's conditioning needs the first frames' pixels");
    torch::NoGradGuard no_grad;
    const torch::Tensor frame = memory::to_device(first.pixels, x0.device(), torch::kFloat);
    if (encoder_) in.image_embeds = encoder_->forward(clip_pixels(frame)).penultimate.to(dtype_);
    in.condition_channels = first_frame_channels(frame, x0, encode);
  }

  // Wan21I2V.generate_single_image (wan21_i2v.py:401-456): the control image resized to the preview's size
  // (PIL's LANCZOS there, stb's filter here), then WanImageToVideoPipeline's encode_image (CLIP's processor,
  // hidden_states[-2]) and prepare_latents (pipeline_wan_i2v.py:396-484: the image followed by black frames,
  // encoded to the posterior's mean, the same mask) — the image embeddings and channels of both the prompt
  // and its negative.
  // Wan 2.2 I2V A14B's (Wan2214bI2VModel.generate_single_image, wan22_14b_i2v_model.py:19-110): no image
  // tokens, and the channels of add_first_frame_conditioning itself — the posterior sampled.
  void preview_condition(ModelInputs& in, const std::filesystem::path& file, const std::vector<int64_t>& latent_shape,
                         const Encode& mean, const Encode& sample) override {
    const Encode& encode = encoder_ ? mean : sample;
    torch::NoGradGuard no_grad;
    const int64_t height = latent_shape.at(3) * spec_.latent_spatial, width = latent_shape.at(4) * spec_.latent_spatial;
    const torch::Tensor image = control_image(file, width, height);
    if (encoder_)
      in.image_embeds =
          encoder_->forward(memory::to_device(processor_pixels(image), device_, dtype_)).penultimate.to(dtype_);
    const torch::Tensor x0 = torch::empty(latent_shape, torch::TensorOptions().device(torch::kMeta));
    torch::Tensor frame;
    {
      memory::HostScope host;
      frame = data::to_unit_range(image).unsqueeze(0);
    }
    in.condition_channels = first_frame_channels(memory::to_device(frame, device_, torch::kFloat), x0, encode);
  }

 private:
  // preprocess_clip_image: [-1, 1] to [0, 1], bilinear to the tower's size (224² for ViT-H/14; AI Toolkit
  // writes 224), clamped, normalised — then in the encoder's dtype.
  torch::Tensor clip_pixels(const torch::Tensor& frame) const {
    torch::Tensor x = (frame + 1) / 2;
    const int64_t s = encoder_->config().image_size;
    if (x.size(2) != s || x.size(3) != s)
      x = F::interpolate(
          x, F::InterpolateFuncOptions().size(std::vector<int64_t>{s, s}).mode(torch::kBilinear).align_corners(false));
    return normalise(x.clamp(0, 1), processor_).to(dtype_);
  }

  // WanImageToVideoPipeline.encode_image's CLIPImageProcessor (transformers' torchvision backend) on the
  // uint8 image [H, W, 3]: the shortest edge to its size (bicubic, antialiased, on the uint8 levels; the long
  // edge int(size * long / short)), a centre crop (top int((h - ch) / 2)), / 255, normalised.
  torch::Tensor processor_pixels(const torch::Tensor& image) const {
    const memory::CpuWork cpu;  // the processor's work is the CPU's
    torch::Tensor x = memory::to_cpu(image).permute({2, 0, 1}).unsqueeze(0).contiguous();
    const int64_t h = x.size(2), w = x.size(3), s = processor_.shortest_edge;
    const int64_t longer = static_cast<int64_t>(static_cast<double>(s) * static_cast<double>(std::max(h, w)) /
                                                static_cast<double>(std::min(h, w)));
    const int64_t rh = w <= h ? longer : s, rw = w <= h ? s : longer;
    if (rh != h || rw != w) x = nn::resize_bicubic_aa(x, {rh, rw});
    const int64_t ch = processor_.crop_height, cw = processor_.crop_width;
    TORCH_CHECK(ch <= rh && cw <= rw, "the CLIP processor's crop is larger than its resized image");
    const int64_t top = static_cast<int64_t>(static_cast<double>(rh - ch) / 2.0);
    const int64_t left = static_cast<int64_t>(static_cast<double>(rw - cw) / 2.0);
    x = x.narrow(2, top, ch).narrow(3, left, cw).to(torch::kFloat) / 255;
    return normalise(x, processor_);
  }

  // add_first_frame_conditioning: the first frame scaled (bilinear) to the latents' size times the VAE's 8,
  // followed by 4 (F' - 1) black frames, encoded; the mask 1 on the first latent frame's four temporal
  // slots, 0 after; [mask, latents] in the compute dtype.
  torch::Tensor first_frame_channels(const torch::Tensor& frame, const torch::Tensor& x0, const Encode& encode) const {
    const int64_t b = x0.size(0), latent_frames = x0.size(2), h = x0.size(3), w = x0.size(4);
    const int64_t frames = (latent_frames - 1) * spec_.latent_temporal + 1;
    const torch::Tensor scaled = at_latents_size(frame, h, w, spec_.latent_spatial);
    torch::Tensor video = torch::zeros({b, 3, frames, scaled.size(2), scaled.size(3)}, scaled.options());
    video.select(2, 0).copy_(scaled);
    const torch::Tensor latents = encode(video).to(dtype_);
    video = torch::Tensor();
    torch::Tensor mask = torch::zeros({b, spec_.latent_temporal, latent_frames, h, w}, latents.options());
    mask.select(2, 0).fill_(1);
    return torch::cat({mask, latents}, 1);
  }

  ModelSpec spec_;
  torch::ScalarType dtype_;
  torch::Device device_;
  text::ClipVisionModel encoder_{nullptr};
  ClipProcessor processor_;
  bool loaded_ = false;
};

// Wan 2.2 TI2V 5B's (Wan225bModel.get_noise_prediction, wan22_5b_model.py:255-334, and
// add_first_frame_conditioning_v22, toolkit/models/wan21/wan_utils.py:116-189): a clip's first frame scaled to
// its latents' size x 16 and encoded (a posterior sample), normalised, given as the clean first latent frame
// — its tokens at t = 0 and outside the loss (scale_loss, :327-334) — and every token's timestep its own; with
// cached latents, the first frame's latents the cache drew once (batch.first_frame_latents, :266-279). An
// image (AI Toolkit's 4-D batch, :282-284) gets the per-token timesteps only; a clip of one latent frame is
// conditioned whole (its mask all 0: scale_loss makes its loss 0). Its previews
// (Wan22Pipeline with expand_timesteps; generate_single_image :155-213): per-token timesteps always, and a
// ctrl_img, when given, encoded (sampled) as the clean first frame.
class WanFirstLatents final : public FrameConditioning {
 public:
  WanFirstLatents(const ModelSpec& spec, const FrameConditioningSource& source)
      : spec_(spec), dtype_(source.dtype), device_(source.device) {}
  torch::nn::Module* image_encoder() override { return nullptr; }
  std::string describe() const override { return "the first frame's latents (no image encoder)"; }
  void condition(ModelInputs& in, const FirstFrames& first, const torch::Tensor& x0, const Encode& encode) override {
    torch::NoGradGuard no_grad;
    in.per_token_timesteps = true;
    if (!first.clips) return;
    if (first.latents.defined()) {
      in.clean_latent_frames = memory::to_device(first.latents, x0.device(), dtype_);
      return;
    }
    const torch::Tensor frame = memory::to_device(first.pixels, x0.device(), torch::kFloat);
    in.clean_latent_frames =
        encode(at_latents_size(frame, x0.size(3), x0.size(4), spec_.latent_spatial).unsqueeze(2)).to(dtype_);
  }
  void preview_condition(ModelInputs& in, const std::filesystem::path& file, const std::vector<int64_t>& latent_shape,
                         const Encode& /*mean*/, const Encode& sample) override {
    torch::NoGradGuard no_grad;
    in.per_token_timesteps = true;
    if (file.empty()) return;
    const torch::Tensor image =
        control_image(file, latent_shape.at(4) * spec_.latent_spatial, latent_shape.at(3) * spec_.latent_spatial);
    torch::Tensor frame;
    {
      memory::HostScope host;
      frame = data::to_unit_range(image).unsqueeze(0).unsqueeze(2);
    }
    in.clean_latent_frames = sample(memory::to_device(frame, device_, torch::kFloat)).to(dtype_);
  }

 private:
  ModelSpec spec_;
  torch::ScalarType dtype_;
  torch::Device device_;
};

}  // namespace

std::unique_ptr<FrameConditioning> first_frame_conditioning(const ModelSpec& spec,
                                                            const FrameConditioningSource& source) {
  return std::make_unique<WanFirstFrame>(spec, source);
}

std::unique_ptr<FrameConditioning> first_latents_conditioning(const ModelSpec& spec,
                                                              const FrameConditioningSource& source) {
  return std::make_unique<WanFirstLatents>(spec, source);
}

}  // namespace gclab::model::wan
