#include "gclab/bench/report.h"

#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "gclab/config/user_error.h"
#include "gclab/model/quantize.h"
#include "gclab/model/registry.h"

#include "gclab/config/byte_size.h"
#include "gclab/data/dataset.h"
#include "gclab/log/log.h"
#include "gclab/model/family.h"
#include "gclab/model/spec.h"
#include "gclab/text/encoder.h"
#include "gclab/text/prompt.h"
#include "gclab/train/session.h"

namespace gclab::bench {

using config::format_bytes;

std::string format_model_summary(const model::ModelSummary& s) {
  const auto& spec = s.spec;
  std::ostringstream out;
  out << "# the model this config selects, counted on a meta-device build (no memory)\n";
  out << "model_summary:\n";
  out << "  preset: " << spec.preset << "\n  family: " << spec.family.name() << "\n";
  out << "  blocks: " << spec.total_blocks() << "  # ";
  out << model::family_of(spec.family).describe_blocks(spec);
  out << ", width " << spec.hidden << " (" << spec.heads << " heads x " << spec.head_dim << ")\n";
  out << "  weights_from: \"" << s.weights_from << "\"\n";
  out << "  parameters: " << s.parameters << "\n";
  out << "  trainable_parameters: " << s.trainable_parameters;
  if (s.lora_modules) out << "  # LoRA on " << s.lora_modules << " Linear modules";
  out << "\n  weight_bytes: " << s.weight_bytes << "  # " << format_bytes(s.weight_bytes) << ", " << s.weight_storage
      << "\n";
  out << "  tokens:  # per sample; text for a 77-token prompt\n";
  for (const auto& t : s.tokens) {
    out << "    - {at: \"" << t.what << " " << t.width << "x" << t.height << "\", image: " << t.image_tokens
        << ", text: " << t.text_tokens;
    if (t.reference_tokens) out << ", reference: " << t.reference_tokens;
    out << "}\n";
  }
  return out.str();
}

std::string format_autoencoder(const config::ProcessConfig& config) {
  const model::ModelSpec spec = model::spec_for(config.model);
  const vae::CodecSpec c = train::codec_plan(config, spec);
  const bool cpu = !train::runs_on_cuda(config);
  const bool cached = train::run_caches_latents(config);
  std::ostringstream out;
  out << "# the autoencoder this config selects (model.vae), its memory predicted from its shapes ("
      << (cpu ? "CPU" : "CUDA") << " kernels)\nautoencoder:\n";
  out << "  codec: \"" << c.describe() << "\"\n";
  out << "  weight_bytes: " << c.weight_bytes() << "  # " << format_bytes(c.weight_bytes()) << "\n";
  out << "  on_the_device_during_steps: " << (c.autoencoder && !cached ? "true" : "false") << "  # "
      << (!c.autoencoder ? "no weights"
          : cached       ? "cache_latents: it leaves once they are encoded"
                         : "latents are encoded on the fly, in each step's data phase")
      << "\n";
  out << "  encode_peaks:" << (config.datasets.empty() ? " []" : "") << "\n";
  std::set<std::pair<int, int>> seen;
  for (const train::StepCell& cell : train::step_cells(config)) {
    const int res = cell.resolution, batch = cached ? 1 : cell.batch;  // caching: one at a time
    if (!seen.insert({res, batch}).second) continue;
    const int64_t b = c.encode_bytes(batch, res, res, cpu);
    out << "    - {at: \"" << res << "x" << res << "\", batch: " << batch << ", bytes: " << b << "}  # "
        << format_bytes(b) << "\n";
  }
  if (config.sample && !config.train.disable_sampling) {
    const auto& s = *config.sample;
    const int64_t b = c.decode_bytes(1, s.height, s.width, cpu);
    out << "  decode_peak: {at: \"" << s.width << "x" << s.height << "\", bytes: " << b << "}  # " << format_bytes(b)
        << (c.tile_sample_size > 0 ? ", in " + std::to_string(c.tile_sample_size) + "-pixel tiles" : "") << "\n";
  }
  return out.str();
}

std::string format_text_encoders(const config::ProcessConfig& config) {
  const model::ModelSpec spec = model::spec_for(config.model);
  const auto plan =
      train::prompt_plan(config, spec,
                         torch::TensorOptions()
                             .device(torch::kMeta)
                             .dtype(config.train.dtype == config::DType::bf16 ? torch::kBFloat16 : torch::kFloat));
  const text::PromptEncoder prompts(plan);
  std::ostringstream out;
  out << "# the text encoders " << spec.family.name()
      << "'s pipeline conditions on (text/), as the run builds them (on the meta device here): their weights as "
         "AI Toolkit holds them ("
      << model::describe_text_encoder_storage(config.model, spec.family) << ")\n";
  out << "text_encoders:" << (prompts.slots() == 0 ? " []" : "") << "\n";
  int64_t total = 0;
  for (size_t i = 0; i < prompts.slots(); ++i) {
    int64_t params = 0;
    for (const auto& p : prompts.encoder(i).parameters()) params += p.numel();
    const int64_t bytes = prompts.weight_bytes(i);
    total += bytes;
    const std::filesystem::path folder = i < plan.encoders.size() ? plan.encoders[i] : "";
    out << "  - {slot: " << model::text_encoder_folder(i) << ", kind: " << config::name_of(prompts.encoder(i).kind())
        << ", parameters: " << params << ", weight_bytes: " << bytes << "}  # " << format_bytes(bytes)
        << (folder.empty() ? "" : ", shape from " + folder.string()) << "\n";
  }
  if (prompts.slots() == 0) return out.str();
  const bool leaves = train::text_encoder_leaves(config);
  out << "text_encoders_total_bytes: " << total << "  # " << format_bytes(total) << "\n";
  const bool cpu = !train::runs_on_cuda(config);
  const text::EncodePrediction p = train::predict_caption_encode(prompts, spec, cpu);
  out << "text_encode_peak:  # a " << model::kNominalCaptionTokens << "-token caption"
      << (spec.edit ? " with a square control image" : "") << ", predicted (text/memory.h, " << (cpu ? "CPU" : "CUDA")
      << " kernels)\n";
  out << "  encoders:\n";
  for (size_t i = 0; i < prompts.slots(); ++i)
    out << "    - {slot: " << model::text_encoder_folder(i) << ", tokens: " << p.tokens[i] << ", bytes: " << p.bytes[i]
        << "}  # " << format_bytes(p.bytes[i]) << "\n";
  out << "  caption_bytes: " << p.peak_bytes << "  # " << format_bytes(p.peak_bytes)
      << ": the encoders in turn, each beside what the ones before returned\n";
  out << "text_encoders_on_the_device_during_steps: " << (leaves ? "false" : "true") << "  # "
      << (leaves ? "cache_text_embeddings / unload_text_encoder: they leave once the captions (or the trigger "
                   "word) and the sample prompts are encoded"
                 : "captions are encoded every step")
      << (config.model.low_vram ? "; low_vram does not move them: AI Toolkit's low_vram quantizes the transformer "
                                  "on the CPU while loading, and its encoders stay on the device"
                                : "")
      << "\n";
  return out.str();
}

std::string format_bucket_histograms(const config::ProcessConfig& config) {
  const int divisibility = model::spec_for(config.model).divisibility;
  std::ostringstream out;
  out << "# buckets, from image headers only (divisibility " << divisibility << ")\n";
  out << "buckets:" << (config.datasets.empty() ? " []" : "") << "\n";
  for (size_t d = 0; d < config.datasets.size(); ++d) {
    const auto& ds = config.datasets[d];
    out << "  datasets[" << d << "]:";
    try {
      const auto scan = data::scan_dataset(ds, static_cast<int>(d));
      for (const auto& w : scan.warnings) log::warn(w);
      out << "  # " << *ds.folder_path << ", " << scan.items.size() << " images\n";
      for (const auto& [resolution, buckets] : data::bucket_histogram(scan.items, ds, divisibility)) {
        out << "    " << resolution << ":\n";
        for (const auto& [bucket, count] : buckets)
          out << "      - " << bucket.key() << ": " << count << (count == 1 ? " image" : " images") << "\n";
      }
    } catch (const data::DataError& e) {
      out << " []  # " << e.what() << "\n";
    }
  }
  return out.str();
}

std::string format_load(const LoadEstimate& load, int64_t cap_bytes, const std::string& indent) {
  std::ostringstream out;
  out << indent << "load:  # before training, as the arch's AI Toolkit loader (train/loading.h): the transformer in "
      << "its dtype, quantized " << (load.quantized_on_host ? "in host memory" : "on the device")
      << ", the text encoders built and quantized on the device\n";
  out << indent << "  device_peak: " << load.device_peak_bytes << "  # " << format_bytes(load.device_peak_bytes);
  if (cap_bytes > 0) out << (load.device_peak_bytes <= cap_bytes ? ", fits the cap" : ", over the cap");
  out << "\n"
      << indent << "  host_peak: " << load.host_peak_bytes << "  # " << format_bytes(load.host_peak_bytes) << "\n";
  return out.str();
}

std::string format_estimate(const MemoryEstimate& e) {
  std::ostringstream out;
  auto bytes = [&](const char* key, int64_t v, const std::string& indent = "  ") {
    out << indent << key << ": " << v << "  # " << format_bytes(v) << "\n";
  };
  auto fits = [&](int64_t total) -> std::string {
    if (e.cap_bytes <= 0) return "";
    return total <= e.cap_bytes ? ", fits the cap" : ", over the cap";
  };
  out << "estimate:\n  preset: " << e.spec.preset << "\n";
  bytes("weights", e.weight_bytes);
  out << "  trained_parameters: " << e.trained << "\n";
  bytes("trained_parameter_bytes", e.trained_bytes);
  bytes("gradients", e.gradient_bytes);
  bytes("optimizer_state", e.optimizer_bytes);
  bytes("ema", e.ema_bytes);
  bytes("text_encoder", e.text_encoder_bytes);
  out << "  vae: \"" << e.vae << "\"\n";
  bytes("vae_weights", e.vae_weight_bytes);
  bytes("vae_resident", e.vae_bytes);
  if (e.host_weight_bytes > 0) {
    bytes("host_weights", e.host_weight_bytes);        // model.layer_offloading: in host memory
    bytes("offload_buffers", e.offload_buffer_bytes);  // the rings' weights on the device, one being brought
  }
  bytes("resident", e.resident_bytes);
  out << "  activations_dtype: " << e.activation_dtype << "\n";
  if (e.cap_bytes > 0) bytes("cap", e.cap_bytes);
  out << format_load(e.load, e.cap_bytes, "  ");
  if (e.text) {
    const auto& t = *e.text;
    out << "  text_encode:  # one " << t.caption_tokens << "-token caption"
        << (t.control_images ? " with a square control image" : "") << " through the text encoders (text/memory.h), "
        << (t.every_step ? "in every step's text phase (text_encode in per_resolution)"
                         : "once before training, beside the weights (then they leave the device)")
        << "\n    encoders: [";
    for (size_t i = 0; i < t.encoders.size(); ++i)
      out << (i ? ", " : "") << "{slot: " << t.encoders[i] << ", tokens: " << t.tokens[i] << ", peak: " << t.bytes[i]
          << "}";
    out << "]\n";
    bytes("encode_peak", t.encode_bytes, "    ");
    if (!t.every_step)
      out << "    total: " << t.total_bytes << "  # " << format_bytes(t.total_bytes) << fits(t.total_bytes) << "\n";
  }
  out << "  per_resolution:  # total = resident + the largest of: batch tensors + block activations + the running "
         "block's MLP transients; the data phase's encode; the text phase's encode\n";
  for (const auto& r : e.resolutions) {
    out << "    - resolution: " << r.resolution << "\n      batch: " << r.batch
        << "\n      image_tokens: " << r.image_tokens << "\n      text_tokens: " << r.text_tokens << "\n";
    for (const auto& [name, s] :
         {std::pair<const char*, const StepEstimate&>{"gc_off", r.gc_off}, {"gc_full", r.gc_full}}) {
      const std::string verdict = fits(s.total_bytes);
      out << "      " << name << ": {batch_tensors: " << s.batch_bytes << ", activations: " << s.activation_bytes
          << ", workspace: " << s.workspace_bytes << ", vae_encode: " << s.encode_bytes
          << (e.text && e.text->every_step ? ", text_encode: " + std::to_string(s.text_bytes) : std::string())
          << ", total: " << s.total_bytes << "}  # " << format_bytes(s.total_bytes) << verdict << "\n";
    }
  }
  if (e.preview) {
    const auto& p = *e.preview;
    const std::string verdict = fits(p.total_bytes);
    out << "  preview:  # after a step: resident without gradients, the autoencoder on the device, then the largest of "
           "denoising, decoding, (edit models) encoding the ctrl_img and (prompts not cached) encoding the prompts\n";
    out << "    {size: \"" << p.width << "x" << p.height << "\", image_tokens: " << p.image_tokens
        << ", denoise: " << p.denoise_bytes << ", vae_decode: " << p.decode_bytes;
    if (p.reference_encode_bytes > 0) out << ", vae_encode_control: " << p.reference_encode_bytes;
    if (p.text_encode_bytes > 0) out << ", text_encode: " << p.text_encode_bytes;
    out << ", total: " << p.total_bytes << "}  # " << format_bytes(p.total_bytes) << verdict << "\n";
  }
  out << "  not_modelled:\n";
  for (const auto& n : e.not_modelled) out << "    - \"" << n << "\"\n";
  return out.str();
}

namespace {

// The markdown table, each line a YAML comment.
std::string as_comments(const std::string& table) {
  std::istringstream in(table);
  std::string out;
  for (std::string line; std::getline(in, line);) out += "# " + line + "\n";
  return out;
}

std::string fit_table(const std::vector<FitRow>& rows) {
  std::ostringstream out;
  out << "| resolution | policy | largest batch that fits | peak at that batch |\n|---|---|---|---|\n";
  for (const auto& r : rows)
    out << "| " << r.resolution << " | " << r.policy << " | "
        << (r.largest_batch ? std::to_string(r.largest_batch) : std::string("none (batch 1 runs out)")) << " | "
        << (r.largest_batch ? format_bytes(r.peak_bytes) : std::string("-")) << " |\n";
  return out.str();
}

nlohmann::ordered_json to_json(const YAML::Node& node) {
  if (node.IsMap()) {
    nlohmann::ordered_json j = nlohmann::ordered_json::object();
    for (const auto& kv : node) j[kv.first.Scalar()] = to_json(kv.second);
    return j;
  }
  if (node.IsSequence()) {
    nlohmann::ordered_json j = nlohmann::ordered_json::array();
    for (const auto& item : node) j.push_back(to_json(item));
    return j;
  }
  if (!node.IsScalar()) return nullptr;
  const std::string& s = node.Scalar();
  if (node.Tag() == "!") return s;  // quoted in the YAML: text, whatever it looks like
  if (s == "true" || s == "false") return s == "true";
  if (s == "null" || s == "~") return nullptr;
  char* end = nullptr;
  const long long i = std::strtoll(s.c_str(), &end, 10);
  if (!s.empty() && *end == '\0') return i;
  const double d = std::strtod(s.c_str(), &end);
  if (!s.empty() && *end == '\0') return d;
  return s;
}

}  // namespace

std::string format_fit(const std::vector<FitRow>& rows) {
  std::ostringstream out;
  out << as_comments(fit_table(rows)) << "fit:" << (rows.empty() ? " []" : "") << "\n";
  for (const auto& r : rows)
    out << "  - {resolution: " << r.resolution << ", policy: \"" << r.policy << "\", largest_batch: " << r.largest_batch
        << ", peak_bytes: " << r.peak_bytes << "}\n";
  return out.str();
}

std::string format_bench(const std::vector<BenchRow>& rows) {
  std::ostringstream out;
  out << as_comments(bench_table(rows)) << "bench:" << (rows.empty() ? " []" : "") << "\n";
  for (const auto& r : rows) {
    out << "  - {resolution: " << r.resolution << ", batch: " << r.batch << ", policy: \"" << r.policy
        << "\", oom: " << (r.oom ? "true" : "false");
    if (r.oom) out << ", oom_phase: \"" << r.oom_phase << "\"";
    out << ", step_ms: " << r.step_ms << ", time_ratio: " << r.time_ratio << ", peak_bytes: " << r.peak_bytes
        << ", reserved_peak_bytes: " << r.reserved_peak_bytes << ", peak_ratio: " << r.peak_ratio
        << ", predicted_activation_bytes: " << r.predicted_activation_bytes << ", model_tflop: " << r.model_tflop
        << ", mfu: " << r.mfu << "}\n";
  }
  return out.str();
}

std::string yaml_to_json(const std::string& yaml) {
  try {
    return to_json(YAML::Load(yaml)).dump(2) + "\n";
  } catch (const YAML::Exception& e) {
    throw UserError(std::string("not YAML: ") + e.what());
  }
}

}  // namespace gclab::bench
