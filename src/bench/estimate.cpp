#include "gclab/bench/estimate.h"

#include <algorithm>
#include <set>

#include "gclab/data/buckets.h"
#include "gclab/data/image.h"
#include "gclab/model/activations.h"
#include "gclab/model/family.h"
#include "gclab/nn/layers.h"
#include "gclab/text/prompt.h"
#include "gclab/train/session.h"

namespace gclab::bench {

namespace {

// The longest sequence a block sees (tokens), from the ledger's block inputs [B, S, hidden].
int64_t longest_sequence(const model::ActivationEstimate& a, int64_t batch, int64_t hidden, int64_t element_bytes) {
  int64_t longest = 0;
  for (const auto& b : a.blocks) longest = std::max(longest, b.input_bytes / (batch * hidden * element_bytes));
  return longest;
}

StepEstimate step_estimate(const train::Session& session, const model::ActivationEstimate& a, int batch, int resolution,
                           bool checkpointed, int64_t resident, int64_t gradients, bool cpu,
                           const std::optional<TextEncodeEstimate>& text) {
  const model::ModelSpec& spec = session.spec();
  StepEstimate s;
  // The flow-matching step's own float32 tensors: x0, noise, x_t, target, the prediction and the squared
  // error (train/flow.cpp), each of the family's latent_shape; the text embeddings [B, T, D] (+ pooled).
  const int64_t latent = int64_t{4} * c10::multiply_integers(model::latent_shape(spec, batch, resolution, resolution));
  s.batch_bytes = 6 * latent + int64_t{4} * batch * (a.text_tokens * spec.text_dim + spec.pooled_dim);
  s.activation_bytes = checkpointed ? a.full_with_recompute_bytes : a.total_off_bytes;
  // On top of what the blocks keep, the block being run (forward) or differentiated (backward, and its
  // recompute) holds its MLP's transients: the hidden activation and its gradient, [B, S, mlp] each, S the
  // longest sequence a block sees. Measured on every tiny preset it is the step's remaining peak, GC off
  // and full (docs/results/estimate-cpu.md).
  const int64_t e = session.activation_options().element_bytes;
  const int64_t longest = longest_sequence(a, batch, spec.hidden, e);
  s.workspace_bytes = 2 * int64_t{batch} * longest * spec.mlp_hidden * e;
  // Encoding on the fly (the autoencoder, latents not cached): the data phase holds the batch's float32
  // images and the encode's peak, before the step's own tensors exist.
  const vae::CodecSpec& codec = session.codec_spec();
  if (codec.autoencoder && !session.caches_latents())
    s.encode_bytes =
        int64_t{4} * batch * 3 * resolution * resolution + codec.encode_bytes(batch, resolution, resolution, cpu);
  // Captions encoded every step: the text phase holds the batch's latents and the encode (the captions one
  // at a time; the earlier ones' embeddings beside it).
  if (text && text->every_step)
    s.text_bytes = latent + text->encode_bytes + int64_t{4} * (batch - 1) * a.text_tokens * spec.text_dim;
  s.total_bytes = std::max({resident - gradients + s.batch_bytes + s.activation_bytes + s.workspace_bytes,
                            resident - gradients + s.encode_bytes, resident - gradients + s.text_bytes, resident});
  return s;
}

LoadEstimate load_of(const train::LoadMemory& load) {
  LoadEstimate l;
  l.quantized_on_host = load.quantized_on_host;
  l.device_peak_bytes = load.device.peak();
  l.host_peak_bytes = load.host.peak();
  return l;
}

// What stays on the device through the steps, and in host memory.
void resident_estimate(train::Session& session, MemoryEstimate& e) {
  const bool leaves = session.plan().text_encoder_leaves;
  const train::ResidentBytes r = session.resident();
  e.weight_bytes = r.weights;
  e.trained = model::trainable_parameter_count(session.model());
  e.trained_bytes = r.trained;
  e.gradient_bytes = r.trained;  // one gradient per trained tensor, in its dtype
  e.optimizer_bytes = session.optimizer().expected_state_bytes();
  e.ema_bytes = r.ema;
  e.text_encoder_bytes = leaves ? 0 : r.text_encoder;
  e.vae = session.codec_spec().describe();
  e.vae_weight_bytes = session.codec_spec().weight_bytes();
  e.vae_bytes = r.vae;
  // Host memory: the offloaded weights, the text encoders' while they stay loaded.
  e.host_weight_bytes = r.host_weights + (leaves ? 0 : r.text_encoder_host);
  e.offload_buffer_bytes = nn::offload_device_bytes(session.model(), session.activation_options().element_bytes);
  e.resident_bytes = e.weight_bytes + e.gradient_bytes + e.optimizer_bytes + e.ema_bytes + e.text_encoder_bytes +
                     e.vae_bytes + e.offload_buffer_bytes;
  e.load = load_of(session.load_memory());
}

// A nominal caption's encode, when the text encoders stay.
void text_estimate(train::Session& session, MemoryEstimate& e, bool cuda) {
  const text::PromptEncoder* prompts = session.text().encoder();
  const train::ResidentBytes r = session.resident();
  if (prompts && prompts->slots() > 0) {
    TextEncodeEstimate t;
    t.caption_tokens = model::kNominalCaptionTokens;
    t.control_images = e.spec.edit ? 1 : 0;
    const text::EncodePrediction p = train::predict_caption_encode(*prompts, e.spec, !cuda);
    for (size_t i = 0; i < prompts->slots(); ++i) t.encoders.push_back(model::text_encoder_folder(i));
    t.tokens = p.tokens, t.bytes = p.bytes, t.encode_bytes = p.peak_bytes;
    t.every_step = !session.plan().text_encoder_leaves;
    if (!t.every_step)
      t.total_bytes = e.resident_bytes - e.gradient_bytes - e.optimizer_bytes + r.text_encoder + t.encode_bytes;
    e.text = t;
  }
}

// The preview: its denoising passes, the decode, an edit model's reference encode, the prompts' encode.
void preview_estimate(train::Session& session, MemoryEstimate& e, bool cuda) {
  const config::ProcessConfig& config = session.config();
  const model::ActivationOptions o = session.activation_options(cuda);
  const text::PromptEncoder* prompts = session.text().encoder();
  text::EncodeMemoryOptions kernels;
  kernels.cpu = !cuda, kernels.threads = at::get_num_threads();
  if (config.sample && !config.train.disable_sampling && !config.sample->samples.empty()) {
    const auto& sc = *config.sample;
    PreviewEstimate p;
    const int d = e.spec.preview_divisibility;
    p.width = sc.width / d * d, p.height = sc.height / d * d;
    p.image_tokens = model::image_tokens(e.spec, p.height, p.width);
    const auto a = model::estimate_activations(e.spec, 1, p.height, p.width, 0, o);
    const int64_t el = session.activation_options().element_bytes;
    const int64_t longest = longest_sequence(a, 1, e.spec.hidden, el);
    const int64_t cfg =
        model::preview_forward_batch(model::preview_guidance(e.spec.family, e.spec.guidance_embed), sc.guidance_scale);
    p.denoise_bytes = cfg * longest * (e.spec.mlp_hidden + 3 * e.spec.hidden) * el;
    // The decode's peak, or after it its float image and the PNG's conversion (one more float copy, the
    // uint8 image), whichever is higher.
    p.decode_bytes = std::max(session.codec_spec().decode_bytes(1, p.height, p.width, !cuda),
                              int64_t{4} * 3 * p.height * p.width + data::to_rgb_uint8_bytes(p.height, p.width));
    const bool controls = std::any_of(sc.samples.begin(), sc.samples.end(),
                                      [](const config::SampleItem& i) { return !i.control_images().empty(); });
    if (e.spec.edit && controls) {  // a square control image's reference (the largest of the area)
      const data::BucketResolution ref = data::reference_size({1, 1}, 1, e.spec.reference_area);
      p.reference_encode_bytes = session.codec_spec().encode_bytes(1, ref.height, ref.width, !cuda);
    }
    // Without cached prompts the preview encodes each prompt (and its negative) with its control images.
    if (prompts && e.text && e.text->every_step)
      for (size_t i = 0; i < sc.samples.size(); ++i) {
        text::ConditionImages conditions;
        for (const auto& f : sc.samples[i].control_images())
          if (const auto size = data::read_image_size(f))
            conditions.push_back(
                torch::empty({3, size->height, size->width}, torch::TensorOptions().device(torch::kMeta)));
        for (const std::string& prompt : {sc.samples[i].prompt, sc.samples[i].neg.value_or(sc.neg)})
          p.text_encode_bytes =
              std::max(p.text_encode_bytes, prompts->predict_encode(prompt, conditions, kernels).peak_bytes);
      }
    p.total_bytes = e.resident_bytes - e.gradient_bytes + (e.vae_weight_bytes - e.vae_bytes) +
                    std::max({p.denoise_bytes, p.decode_bytes, p.reference_encode_bytes, p.text_encode_bytes});
    e.preview = p;
  }
}

void not_modelled(const config::ProcessConfig& config, MemoryEstimate& e) {
  e.not_modelled = {
      "the preview's denoising passes are approximate (a block's input, output and MLP hidden); its "
      "decode is not",
      "the data loader's prefetched batches and latent caches",
      "host memory: the sample prompts' cached embeddings (the captions' are on disk in _t_e_cache/, as AI "
      "Toolkit's: only a batch's reach the device), latents, the process itself",
      "the text encoders' encode is predicted for a " + std::to_string(model::kNominalCaptionTokens) +
          "-token caption (the sample prompts' own lengths in the preview); longer captions of Qwen-Image / "
          "Z-Image hold more",
      "allocator fragmentation and the CUDA context (CUDA)",
      "partial checkpoint policies (every:N, blocks, selective, offload)",
      "the load's host memory as AI Toolkit's from_pretrained holds it: it reads every transformer into host "
      "memory first (load.host_peak counts only where the transformer is quantized there)"};
  if (model::transformer_loading(config.model.arch) == model::TransformerLoading::per_block && config.model.quantize)
    e.not_modelled.push_back(
        "the load: quantize_model stages each block on the device to quantize it; gclab quantizes the blocks in "
        "host memory (one block's weights less on the device meanwhile, below the text encoders' load)");
  if (e.preview && e.preview->reference_encode_bytes > 0 && config.model.low_vram &&
      model::low_vram_tiles_previews(e.spec.family, e.spec.edit_plus))
    e.not_modelled.push_back(
        "low_vram: AI Toolkit's edit previews run with the VAE's tiling on, which tiles the ctrl_img's encode too; "
        "gclab encodes it whole (vae_encode_control is the untiled peak)");
}

}  // namespace

LoadEstimate estimate_load(const config::ProcessConfig& config) {
  return load_of(train::predict_load(train::plan_run(config, train::PlanOptions{/*meta=*/true})));
}

MemoryEstimate estimate_memory(const config::ProcessConfig& config) {
  train::Session session(config, train::SessionOptions{/*meta=*/true});
  MemoryEstimate e;
  e.spec = session.spec();
  resident_estimate(session, e);
  e.cap_bytes = config.vram_cap.bytes;
  e.activation_dtype = std::string(config::name_of(config.train.dtype));
  const bool cuda = session.plan().cuda;
  e.device = cuda ? "cuda" : config.device;
  text_estimate(session, e, cuda);
  // Each of the datasets' (batch, resolution) cells, checkpointing off and full.
  const model::ActivationOptions o = session.activation_options(cuda);
  for (const train::StepCell& c : session.plan().cells) {
    const auto a = model::estimate_activations(e.spec, c.batch, c.resolution, c.resolution, 0, o);
    ResolutionEstimate re;
    re.resolution = c.resolution;
    re.batch = c.batch;
    re.image_tokens = a.image_tokens;
    re.text_tokens = a.text_tokens;
    re.gc_off =
        step_estimate(session, a, c.batch, c.resolution, false, e.resident_bytes, e.gradient_bytes, !cuda, e.text);
    re.gc_full =
        step_estimate(session, a, c.batch, c.resolution, true, e.resident_bytes, e.gradient_bytes, !cuda, e.text);
    e.resolutions.push_back(re);
  }
  preview_estimate(session, e, cuda);
  not_modelled(config, e);
  return e;
}

}  // namespace gclab::bench
