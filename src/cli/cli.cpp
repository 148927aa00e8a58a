// The `gclab` executable: parses the command line, hands each verb to its part, and turns every failure
// into a message and an exit code (docs/usage.md, "Exit codes"): 0 done, 2 bad config or input, 3 out of
// memory, 1 anything else. No exception escapes main.
#include "gclab/cli/cli.h"

#include <malloc.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "gclab/bench/advise.h"
#include "gclab/bench/bench.h"
#include "gclab/bench/bench_page.h"
#include "gclab/bench/report.h"
#include "gclab/bench/run_report.h"
#include "gclab/config/byte_size.h"
#include "gclab/config/user_error.h"
#include "gclab/data/synth.h"
#include "gclab/dist/process_group.h"
#include "gclab/io/safetensors.h"
#include "gclab/log/log.h"
#include "gclab/memory/device.h"
#include "gclab/model/family.h"
#include "gclab/model/forward.h"
#include "gclab/model/quantize.h"
#include "gclab/model/summary.h"
#include "gclab/text/encoder.h"
#include "gclab/text/tokenizer.h"
#include "gclab/train/oom_report.h"
#include "gclab/train/predict.h"
#include "gclab/train/session.h"
#include "gclab/train/state_file.h"
#include "gclab/train/trainer.h"
#include "gclab/vae/autoencoder_kl.h"
#include "gclab/vae/qwen_image_vae.h"

namespace {

constexpr int kExitOk = 0;
constexpr int kExitOther = 1;
constexpr int kExitBadInput = 2;
constexpr int kExitOom = 3;
constexpr int kExitSaveFailed = 4;
constexpr int kExitInterrupted = 130;  // as a shell reports a process ended by SIGINT

// Every verb runs through here: the one place an outcome becomes an exit code.
int run_verb(const std::function<int()>& verb) {
  try {
    return verb();
  } catch (const gclab::UserError& e) {
    gclab::log::error(e.what());
    return kExitBadInput;
  } catch (const gclab::train::OutOfMemoryStop& e) {
    gclab::log::error(e.what());
    return kExitOom;
  } catch (const c10::OutOfMemoryError& e) {
    gclab::log::error(std::string("out of memory: ") + e.what_without_backtrace());
    return kExitOom;
  } catch (const gclab::train::SaveError& e) {
    gclab::log::error(e.what());
    return kExitSaveFailed;
  } catch (const gclab::train::NonFiniteStop& e) {
    gclab::log::error(e.what());
    return kExitOther;
  } catch (const gclab::dist::RankLost& e) {  // another rank stopped: its own error says why
    gclab::log::error(e.what());
    return kExitOther;
  } catch (const std::exception& e) {
    gclab::log::error(std::string("internal error: ") + e.what());
    return kExitOther;
  }
}

struct ConfigArgs {
  std::string path;
  std::vector<std::string> overrides;
  std::string vram_cap;
  std::string host_cap;
  bool json = false;  // check, estimate, bench, fit: the same content as JSON instead of YAML
};

// What a reporting verb prints: YAML (after `yaml_head`, comment lines and the config as to_yaml writes it),
// or with --json the same content as JSON.
void print_report(const ConfigArgs& args, const gclab::bench::Document& report, const std::string& yaml_head = "") {
  std::cout << (args.json ? report.json() : yaml_head + report.yaml());
}

void add_config_args(CLI::App* cmd, ConfigArgs& args) {
  cmd->add_option("config", args.path, "AI Toolkit config (YAML)")->required();
  cmd->add_option("--set", args.overrides, "override a field inside the process, e.g. train.batch_size=4")
      ->allow_extra_args(false);
  cmd->add_option("--vram-cap", args.vram_cap, "emulated VRAM cap, e.g. 24GiB (same as vram_cap in the config)");
  cmd->add_option("--host-cap", args.host_cap,
                  "emulated host-memory cap, e.g. 64GiB: what layer offloading keeps in RAM (host_cap in the config)");
}

// Loads, validates (config and model facts) and reports; throws UserError when the config has errors.
gclab::config::ProcessConfig load(const ConfigArgs& args) {
  gclab::config::LoadOptions options;
  options.overrides = args.overrides;
  if (!args.vram_cap.empty()) options.overrides.push_back("vram_cap=" + args.vram_cap);
  if (!args.host_cap.empty()) options.overrides.push_back("host_cap=" + args.host_cap);
  auto result = gclab::model::load_config_file(args.path, options);
  for (const auto& d : result.diagnostics.all()) {
    const std::string text = d.format();
    if (d.severity == gclab::config::Severity::Error)
      gclab::log::error(text.substr(text.find(": ") + 2));
    else
      gclab::log::warn(text.substr(text.find(": ") + 2));
  }
  if (!result.ignored.empty()) {
    std::string list;
    for (const auto& k : result.ignored) list += (list.empty() ? "" : ", ") + k;
    gclab::log::info("AI Toolkit keys gclab does not act on (ignored): " + list);
  }
  if (!result.ok())
    throw gclab::UserError(args.path + ": " + std::to_string(result.diagnostics.errors().size()) +
                           " error(s); nothing was run");
  return std::move(*result.config);
}

// "a,b,c" -> items; each parsed strictly (a bad item is a UserError naming the option).
template <class T>
std::vector<T> parse_list(const std::string& option, const std::string& text,
                          const std::function<T(const std::string&)>& parse) {
  std::vector<T> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (item.empty()) continue;
    try {
      out.push_back(parse(item));
    } catch (const std::exception& e) {
      throw gclab::UserError(option + ": '" + item + "': " + e.what());
    }
  }
  return out;
}

int parse_int(const std::string& s) {
  size_t used = 0;
  const int v = std::stoi(s, &used);
  if (used != s.size() || v < 1) throw std::invalid_argument("not a positive whole number");
  return v;
}

// --gc's policies: commas inside brackets belong to a policy (blocks:[0,3], modes:[full*2,none]).
std::vector<gclab::ckpt::CheckpointPolicy> parse_policies(const std::string& text) {
  std::vector<gclab::ckpt::CheckpointPolicy> out;
  std::string item;
  int depth = 0;
  auto take = [&] {
    if (item.empty()) return;
    try {
      out.push_back(gclab::ckpt::CheckpointPolicy::parse(item));
    } catch (const std::exception& e) {
      throw gclab::UserError("--gc: '" + item + "': " + e.what());
    }
    item.clear();
  };
  for (const char c : text) {
    depth += c == '[' ? 1 : c == ']' ? -1 : 0;
    if (c == ',' && depth <= 0)
      take();
    else
      item += c;
  }
  take();
  return out;
}

int run_check(const ConfigArgs& args) {
  const auto config = load(args);
  namespace bench = gclab::bench;
  bench::Document parts = bench::model_summary_report(gclab::model::summarize_model(config));
  parts.append(bench::autoencoder_report(config));
  parts.append(bench::text_encoders_report(config));
  parts.append(bench::load_report(gclab::train::estimate_load(config), config.vram_cap.bytes));
  parts.append(bench::phases_report(gclab::train::MemoryModel(config), config));
  parts.append(bench::bucket_report(config));
  if (args.json) {
    bench::Document all = bench::config_report(config);
    all.append(parts);
    print_report(args, all);
  } else {
    print_report(args, parts, "# resolved by gclab from " + args.path + "\n" + gclab::config::to_yaml(config));
  }
  return kExitOk;
}

int run_info() {
  const auto info = gclab::memory::describe_devices();
  std::cout << "libtorch: " << info.torch_version << "\n";
  std::cout << "cuda_compiled: " << (info.cuda_compiled ? "true" : "false") << "\n";
  if (info.cuda_compiled) std::cout << "cuda_version: \"" << info.cuda_version << "\"\n";
  std::cout << "cuda_available: " << (info.cuda_available ? "true" : "false") << "\n";
  std::cout << "cpu_threads: " << info.cpu_threads << "\n";
  std::cout << "cpu_isa: " << info.cpu_isa << "  # oneDNN's, as the CPU memory rules read it"
            << (info.cpu_rules_measured ? "" : " (bf16 rules not measured on it: docs/results/cpu-isa.md)") << "\n";
  std::cout << "gpus:" << (info.gpus.empty() ? " []" : "") << "\n";
  for (const auto& g : info.gpus) {
    std::cout << "  - index: " << g.index << "\n    name: \"" << g.name << "\"\n    total_bytes: " << g.total_bytes
              << "  # " << gclab::config::format_bytes(g.total_bytes) << "\n    free_bytes: " << g.free_bytes
              << "\n    compute_capability: \"" << g.compute_capability_major << "." << g.compute_capability_minor
              << "\"\n";
  }
  return kExitOk;
}

enum class ForwardComponent { transformer, vae_encode, vae_decode, text_encoder };

struct ForwardArgs {
  std::string weights, inputs, out, dtype = "fp32", lora;
  ForwardComponent component = ForwardComponent::transformer;
  gclab::vae::Posterior posterior = gclab::vae::Posterior::mean;
  double lora_scale = 1.0;
  int64_t vae_tile = 0;  // vae.decode: tiled decoding with this tile size in pixels (0: off)
  size_t text_slot = 0;  // text_encoder: which of the family's (0: text_encoder, 1: text_encoder_2, ...)
};

// The tensors of a weights file the network did not use, said once.
void warn_unused(const std::vector<std::string>& unused, const std::filesystem::path& file) {
  if (!unused.empty())
    gclab::log::warn(std::to_string(unused.size()) + " tensor(s) in " + file.string() +
                     " are not parameters of this network and were not used, e.g. " + unused.front());
}

// gclab forward --component vae.encode|vae.decode: the run's autoencoder (train::codec_plan: the family's
// AutoencoderKL or AutoencoderKLQwenImage, its tiny size for a tiny preset, its config.json and weights from
// --weights or model.vae_path / name_or_path's vae/ folder, else random). Images [B, 3, H, W] (videos
// [B, 3, T, H, W] for Qwen-Image's) in [-1, 1] from f.inputs through encode (the posterior f.posterior asks
// for, sampled from training_seed) or decode, the result written to f.out.
int run_vae_forward(const gclab::config::ProcessConfig& config, const ForwardArgs& f, torch::ScalarType dtype) {
  const gclab::model::ModelSpec spec = gclab::model::spec_for(config.model);
  try {
    const gclab::vae::CodecSpec plan = gclab::train::codec_plan(config, spec, f.weights);
    if (!plan.autoencoder) throw gclab::UserError("model.vae: dct has no autoencoder to run");
    torch::manual_seed(config.seed());
    auto built = gclab::vae::build_autoencoder(*plan.autoencoder, plan.weights);
    if (built.random)
      gclab::log::warn("no --weights and no vae/ folder in model.name_or_path: random autoencoder weights");
    warn_unused(built.unused, plan.weights);
    gclab::vae::AutoencoderBase& vae = *built.vae;
    const torch::Device device = gclab::train::resolve_device(config.device);
    if (f.vae_tile < 0 || f.vae_tile % vae.downsampling() != 0)
      throw gclab::UserError("--vae-tile " + std::to_string(f.vae_tile) + ": a tile size in pixels, a multiple of " +
                             std::to_string(vae.downsampling()));
    if (f.vae_tile > 0) vae.enable_tiling(f.vae_tile);
    vae.to(device, dtype);
    vae.eval();
    auto gen = at::make_generator<at::CPUGeneratorImpl>(config.seed());
    const bool encode = f.component == ForwardComponent::vae_encode;
    const auto file = gclab::io::SafetensorsFile::open(f.inputs);
    const std::string in_name = encode ? "images" : "latents", out_name = encode ? "latents" : "images";
    if (!file.contains(in_name)) throw gclab::UserError(f.inputs + ": needs '" + in_name + "'");
    const torch::Tensor x = file.tensor(in_name).to(device, dtype);
    const int64_t channels = encode ? vae.image_channels() : vae.latent_channels();
    const bool video = vae.takes_video();
    if ((x.dim() != 4 && !(video && x.dim() == 5)) || x.size(1) != channels)
      throw gclab::UserError(f.inputs + ": '" + in_name + "' must be [B, " + std::to_string(channels) + ", H, W]" +
                             (video ? " or [B, " + std::to_string(channels) + ", T, H, W]" : std::string()) + ", got " +
                             c10::str(x.sizes()));
    torch::Tensor y;
    {
      torch::NoGradGuard no_grad;
      y = encode ? vae.encode(x, f.posterior, device.is_cpu() ? std::optional<at::Generator>(gen) : std::nullopt)
                 : vae.decode(x);
    }
    gclab::io::save_safetensors(f.out, {{out_name, y.contiguous()}});
    std::cout << out_name << " " << y.sizes() << " " << c10::toString(y.scalar_type()) << " -> " << f.out << "\n";
  } catch (const std::runtime_error& e) {  // bad weights, config.json or inputs
    throw gclab::UserError(e.what());
  }
  return kExitOk;
}

// gclab forward --component text_encoder|text_encoder_2|text_encoder_3: the family's text encoder in that
// slot (model::text_encoders), its config.json and weights from --weights or name_or_path's folder of that
// name, else random at the real shape (tiny presets: the CPU-test size); `input_ids` [B, T] (and optionally
// `attention_mask`) -> what the pipeline takes from it: `hidden_states`, `pooled` where it has one. Qwen2.5-VL
// also reads images: `pixel_values` + `image_grid_thw` as Qwen2VLImageProcessor gives them, or an `image`
// [3, H, W] in [0, 1] that gclab's processor prepares (its `pixel_values` / `image_grid_thw` written out).
// `hidden_layers` (1-D int64): those hidden states stacked per token as FLUX.2's pipelines take them.
int run_text_forward(const gclab::config::ProcessConfig& config, const ForwardArgs& f, torch::ScalarType dtype) {
  const gclab::model::ModelSpec spec = gclab::model::spec_for(config.model);
  const auto kinds = gclab::model::text_encoders(spec);
  const size_t slot = f.text_slot;
  const std::string name = gclab::model::text_encoder_folder(slot);
  if (slot >= kinds.size())
    throw gclab::UserError("--component " + name + ": " + spec.family.name() + " has " + std::to_string(kinds.size()) +
                           " text encoder(s)");
  std::filesystem::path folder = f.weights;
  if (folder.empty())
    if (const auto local = gclab::model::local_model(config.model); local && slot < local->text_encoders.size())
      folder = local->text_encoders[slot];
  try {
    torch::manual_seed(config.seed());
    auto built = gclab::text::build_text_encoder(kinds[slot], spec.tiny, folder);
    if (built.random)
      gclab::log::warn("no --weights and no " + name + "/ folder in model.name_or_path: random weights");
    warn_unused(built.unused, folder);
    gclab::text::TextEncoderBase& encoder = *built.encoder;
    const torch::Device device = gclab::train::resolve_device(config.device);
    encoder.to(device, dtype);
    encoder.eval();
    const auto file = gclab::io::SafetensorsFile::open(f.inputs);
    if (!file.contains("input_ids")) throw gclab::UserError(f.inputs + ": needs 'input_ids'");
    const torch::Tensor ids = file.tensor("input_ids").to(device, torch::kLong);
    if (ids.dim() != 2 || ids.size(1) > encoder.max_positions() || ids.numel() == 0)
      throw gclab::UserError(f.inputs + ": 'input_ids' must be [B, T] with 0 < T <= " +
                             std::to_string(encoder.max_positions()) + ", got " + c10::str(ids.sizes()));
    if (ids.min().item<int64_t>() < 0 || ids.max().item<int64_t>() >= encoder.vocab_size())
      throw gclab::UserError(f.inputs + ": 'input_ids' must lie in [0, " + std::to_string(encoder.vocab_size()) +
                             "), the encoder's vocabulary; got " + std::to_string(ids.min().item<int64_t>()) + " to " +
                             std::to_string(ids.max().item<int64_t>()));
    torch::Tensor mask;
    if (file.contains("attention_mask")) {
      mask = file.tensor("attention_mask").to(device);
      if (mask.sizes() != ids.sizes())
        throw gclab::UserError(f.inputs + ": 'attention_mask' must have input_ids' shape " + c10::str(ids.sizes()));
    }
    // Images (Qwen2.5-VL): the processor's `pixel_values` + `image_grid_thw`, or an `image` [3, H, W] in
    // [0, 1] that gclab's processor prepares (its pixel_values and grid are written out too).
    std::optional<gclab::text::QwenVisionInput> images;
    std::vector<std::pair<std::string, torch::Tensor>> tensors;
    if (file.contains("pixel_values") || file.contains("image")) {
      if (!encoder.takes_images())
        throw gclab::UserError(f.inputs + ": " + std::string(gclab::config::name_of(encoder.kind())) +
                               " does not read images");
      if (file.contains("image")) {
        images = gclab::text::qwen_vl_image_input(file.tensor("image"), *encoder.vision_config());
        tensors.emplace_back("pixel_values", images->pixel_values);
        tensors.emplace_back("image_grid_thw", images->grid_thw);
      } else {
        if (!file.contains("image_grid_thw")) throw gclab::UserError(f.inputs + ": pixel_values needs image_grid_thw");
        images = gclab::text::QwenVisionInput{file.tensor("pixel_values"), file.tensor("image_grid_thw")};
      }
      images->pixel_values = images->pixel_values.to(device, dtype);
    }
    gclab::text::EncodedText out;
    {
      torch::NoGradGuard no_grad;
      if (file.contains("hidden_layers")) {  // FLUX.2's pipelines: these hidden states stacked per token
        const torch::Tensor layers = file.tensor("hidden_layers").to(torch::kCPU, torch::kLong).contiguous();
        if (layers.dim() != 1 || layers.numel() == 0)
          throw gclab::UserError(f.inputs + ": 'hidden_layers' must be a 1-D list of layer indices");
        out =
            encoder.encode_layers(ids, mask, {layers.data_ptr<int64_t>(), layers.data_ptr<int64_t>() + layers.numel()});
      } else {
        out = images ? encoder.encode_with_images(ids, mask, *images) : encoder.encode(ids, mask);
      }
    }
    if (out.hidden_states.defined()) tensors.insert(tensors.begin(), {"hidden_states", out.hidden_states.contiguous()});
    if (out.pooled.defined()) tensors.emplace_back("pooled", out.pooled.contiguous());
    gclab::io::save_safetensors(f.out, tensors);
    for (const auto& [key, t] : tensors) std::cout << key << " " << t.sizes() << " -> " << f.out << "\n";
  } catch (const std::invalid_argument& e) {
    throw gclab::UserError(e.what());
  } catch (const std::runtime_error& e) {
    throw gclab::UserError(e.what());
  }
  return kExitOk;
}

struct TokenizeArgs {
  std::string component, tokenizer;
  int64_t max_length = 0;
  std::vector<std::string> captions;
};

// gclab tokenize CONFIG --component text_encoder_2 "caption" ...: the ids the family's tokenizer gives (one
// line per caption: the ids, cut and padded to the pipeline's length).
int run_tokenize(const ConfigArgs& args, const TokenizeArgs& t) {
  const auto config = load(args);
  const gclab::model::ModelSpec spec = gclab::model::spec_for(config.model);
  const auto kinds = gclab::model::text_encoders(spec);
  const auto parsed = gclab::model::text_encoder_slot(t.component);
  if (!parsed)
    throw gclab::UserError("--component " + t.component + ": text_encoder, text_encoder_2 or text_encoder_3");
  const size_t slot = *parsed;
  if (slot >= kinds.size())
    throw gclab::UserError("--component " + t.component + ": " + spec.family.name() + " has " +
                           std::to_string(kinds.size()) + " text encoder(s)");
  // The pipeline's own call (template, length, padding) from the run's prompt plan, built on the meta
  // device: only the tokenizers are real.
  auto plan = gclab::train::prompt_plan(config, spec, torch::TensorOptions().device(torch::kMeta));
  if (!t.tokenizer.empty()) {
    plan.tokenizers.resize(std::max(plan.tokenizers.size(), slot + 1));
    plan.tokenizers[slot] = t.tokenizer;
  }
  try {
    const gclab::text::PromptEncoder prompts(plan);
    if (prompts.hashing_tokenizer(slot))
      std::cerr << "gclab tokenize: " << t.component << ": the hashing stand-in ("
                << (gclab::config::t5_structured(kinds[slot]) ? "no spiece.model in the tokenizer folder"
                                                              : "no vocab.json and merges.txt in the tokenizer folder")
                << ")\n";
    for (const auto& caption : t.captions) {
      const gclab::text::TokenizedBatch b = t.max_length > 0
                                                ? prompts.tokenizer(slot).encode_batch({caption}, t.max_length)
                                                : prompts.tokenize(slot, caption);
      std::string line;
      for (int64_t j = 0; j < b.input_ids.size(1); ++j)
        line += (j ? " " : "") + std::to_string(b.input_ids[0][j].item<int64_t>());
      std::cout << line << "\n";
    }
  } catch (const std::runtime_error& e) {
    throw gclab::UserError(e.what());
  }
  return kExitOk;
}

// gclab forward: the configured transformer, the user's weights (or random ones from training_seed), one
// pass on named inputs, the prediction written as safetensors.
int run_forward(const ConfigArgs& args, const ForwardArgs& f) {
  const auto config = load(args);
  const gclab::model::ModelSpec spec = gclab::model::spec_for(config.model);
  const auto dtype_choice = gclab::config::parse_choice<gclab::config::DType>(f.dtype);
  const torch::ScalarType dtype = *dtype_choice == gclab::config::DType::bf16   ? torch::kBFloat16
                                  : *dtype_choice == gclab::config::DType::fp16 ? torch::kHalf
                                                                                : torch::kFloat;
  if (f.component == ForwardComponent::vae_encode || f.component == ForwardComponent::vae_decode)
    return run_vae_forward(config, f, dtype);
  if (f.component != ForwardComponent::transformer) return run_text_forward(config, f, dtype);
  const torch::Device device = gclab::train::resolve_device(config.device);
  try {
    torch::manual_seed(config.seed());
    // Built in the compute dtype and quantized as a training run would be (model.quantize / qtype /
    // accuracy_recovery_adapter), before the weights load: a quantized Linear quantizes what it loads.
    auto model = gclab::model::build_transformer(spec, torch::TensorOptions().dtype(dtype));
    if (config.model.quantize)
      gclab::log::info("model.quantize: " +
                       gclab::model::describe(gclab::model::quantize_base(*model, config.model), config.model));
    // --weights (a safetensors file, a sharded index or a diffusers folder), else the weights of a local
    // model.name_or_path folder.
    std::filesystem::path weights;
    std::vector<std::filesystem::path> expert_weights;  // a model of several experts: transformer_2/, ...
    if (!f.weights.empty() && std::filesystem::is_directory(f.weights)) {
      const auto local = gclab::model::local_model_at(f.weights, "--weights");
      weights = local.weights, expert_weights = local.expert_weights;
      if (weights.empty()) throw gclab::UserError("--weights " + f.weights + ": the folder holds no weights");
    } else if (!f.weights.empty()) {
      weights = f.weights;
    } else if (const auto local = gclab::model::local_model(config.model)) {
      weights = local->weights, expert_weights = local->expert_weights;
    }
    if (!weights.empty()) {
      warn_unused(gclab::model::load_weights(*model, weights, expert_weights), weights);
    } else {
      gclab::log::warn("no --weights: random weights (training_seed " + std::to_string(config.seed()) + ")");
    }
    if (!f.lora.empty()) {
      const int merged = gclab::model::merge_lora_file(*model, f.lora, f.lora_scale);
      gclab::log::info("applied " + f.lora + " to " + std::to_string(merged) + " Linears at scale " +
                       std::to_string(f.lora_scale));
    }
    model->to(device);
    model->eval();
    const auto in = gclab::model::read_model_inputs(spec, f.inputs, device, dtype);
    torch::Tensor prediction;
    {
      torch::NoGradGuard no_grad;
      prediction = model->forward(in);
    }
    gclab::io::save_safetensors(f.out, {{"prediction", prediction}}, gclab::model::spec_metadata(spec));
    std::cout << "prediction " << prediction.sizes() << " " << c10::toString(prediction.scalar_type()) << " -> "
              << f.out << "\n";
  } catch (const std::runtime_error& e) {  // bad weights or inputs (SafetensorsError is one)
    throw gclab::UserError(e.what());
  }
  return kExitOk;
}

struct SynthArgs {
  std::string out;
  int count = 24;
  std::string sizes = "512x512,640x448,448x640";
  uint64_t seed = 1;
  bool simple = false;
  int frames = 1;
  bool video = false;
  std::string format = "mp4";
  int fps = 16;
};

int run_synth(const SynthArgs& a) {
  gclab::data::SynthOptions o;
  o.count = a.count;
  o.seed = a.seed;
  o.simple = a.simple;
  o.frames = a.frames;
  o.sizes = parse_list<gclab::data::ImageSize>("--sizes", a.sizes, [](const std::string& item) {
    int w = 0, h = 0;
    char x = 0;
    std::stringstream one(item);
    if (!(one >> w >> x >> h) || x != 'x' || !one.eof() || w < 8 || h < 8 || w > 8192 || h > 8192)
      throw std::invalid_argument("not WIDTHxHEIGHT (8..8192), e.g. 512x512");
    return gclab::data::ImageSize{w, h};
  });
  if (o.count < 1) throw gclab::UserError("--count must be at least 1");
  if (o.frames < 1) throw gclab::UserError("--frames must be at least 1");
  if (a.video) {
    if (a.format != "mp4" && a.format != "webm" && a.format != "mov" && a.format != "mkv" && a.format != "gif")
      throw gclab::UserError("--format must be mp4, webm, mov, mkv or gif (got '" + a.format + "')");
    if (a.fps < 1) throw gclab::UserError("--fps must be at least 1");
    o.video_format = a.format, o.fps = a.fps;
    if (o.frames == 1) o.frames = 17;  // a short clip: 1 + 4·4 frames, five latent frames for Wan's autoencoder
  }
  const auto files = gclab::data::write_synthetic_dataset(a.out, o);
  std::cout << "wrote " << files.size() << " captioned "
            << (o.frames > 1 ? (a.video ? a.format + " clips of " : "clips of ") + std::to_string(o.frames) + " frames"
                             : std::string("images"))
            << " to " << a.out << "\n";
  return kExitOk;
}

std::atomic<bool> g_stop{false};
extern "C" void on_interrupt(int) { g_stop.store(true); }

// report.html beside the run's other outputs, its path returned ("" when it could not be written: that never
// fails the run).
std::string write_report_after_run(const std::filesystem::path& run_dir) {
  try {
    return gclab::bench::write_run_report(run_dir).string();
  } catch (const std::exception& e) {
    gclab::log::warn(std::string("report.html not written: ") + e.what());
    return "";
  }
}

int run_report(const std::string& run_dir) {
  if (!std::filesystem::is_directory(run_dir)) throw gclab::UserError(run_dir + " is not a folder");
  try {
    std::cout << gclab::bench::write_run_report(run_dir).string() << "\n";
  } catch (const std::runtime_error& e) {
    throw gclab::UserError(e.what());
  }
  return kExitOk;
}

int run_train(const ConfigArgs& args, bool resume, bool dry_run, const std::string& memory_snapshot,
              int dist_timeout_s) {
  const auto config = load(args);
  if (dry_run) {
    gclab::log::info(gclab::train::dry_run(config));
    return kExitOk;
  }
  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);  // torchrun stops the other workers so when one fails: save and stop too
  gclab::train::TrainOptions options;
  options.resume = resume;
  options.progress = &std::cerr;
  options.progress_in_place = ::isatty(STDERR_FILENO) == 1;
  options.stop_requested = &g_stop;
  options.memory_snapshot = memory_snapshot;
  options.dist_timeout = std::chrono::seconds(dist_timeout_s);
  const std::filesystem::path run_dir = std::filesystem::path(config.training_folder) / config.name;
  const bool writes = gclab::dist::process_world().writes_outputs();  // report.html is rank 0's
  gclab::train::TrainSummary s;
  try {
    s = gclab::train::train(config, options);
  } catch (const gclab::train::OutOfMemoryStop&) {
    // Marks the step that ran out and the first fix.
    const std::string report = writes ? write_report_after_run(run_dir) : "";
    if (!report.empty()) gclab::log::info("report: " + report);
    throw;
  }
  const std::string report = writes ? write_report_after_run(run_dir) : "";
  const double wait_share = s.step_s > 0 ? 100.0 * s.data_wait_s / s.step_s : 0.0;
  char line[256];
  std::snprintf(line, sizeof line, "%s steps %lld-%lld in %.1f s (%.2f steps/s; %.1f%% of step time waiting for data)",
                s.interrupted ? "interrupted after" : "done:", static_cast<long long>(s.start_step),
                static_cast<long long>(s.end_step), s.total_s,
                s.step_s > 0 ? static_cast<double>(s.end_step - s.start_step) / s.step_s : 0.0, wait_share);
  gclab::log::info(line);
  if (!s.unusable_images.empty())
    gclab::log::warn(std::to_string(s.unusable_images.size()) + " image(s) could not be decoded and were replaced: " +
                     s.unusable_images.front() + (s.unusable_images.size() > 1 ? ", ..." : ""));
  gclab::log::info("outputs in " + s.output_dir.string());
  if (!report.empty()) gclab::log::info("report: " + report + " (open it in a browser)");
  return s.interrupted ? kExitInterrupted : kExitOk;
}

struct EstimateGrid {
  std::string frames, resolution;
  int world_size = 0;  // --world-size (0: this process's world)
  std::string shard = "none";
};

int run_estimate(const ConfigArgs& args, const EstimateGrid& grid) {
  const auto config = load(args);
  const auto frames = parse_list<int>("--frames", grid.frames, parse_int);
  const auto resolutions = parse_list<int>("--resolution", grid.resolution, parse_int);
  const auto shard = gclab::train::parse_shard(grid.shard);
  if (!shard) throw gclab::UserError("--shard " + grid.shard + ": none, optimizer, grads or full");
  gclab::dist::World world = gclab::dist::process_world();
  if (grid.world_size > 0) world = gclab::dist::World{}, world.size = grid.world_size;  // rank 0 of that world
  if (*shard != gclab::train::Shard::none && world.alone())
    throw gclab::UserError("--shard " + grid.shard + ": give --world-size N (N > 1), the ranks it shards across");
  // Any sharding keeps the optimizer's state to each rank's own tensors: walked so (train/sharding.h).
  world.shard_optimizer = *shard != gclab::train::Shard::none;
  gclab::dist::set_process_world(world);
  print_report(args,
               gclab::bench::estimate_report(gclab::train::estimate_memory_grid(config, frames, resolutions), *shard),
               "# predicted training memory for " + args.path + ", counted from the run's own Session (no run)\n");
  return kExitOk;
}

struct BenchArgs {
  std::string gc, batch, resolution, caps;  // gc empty: bench's off,full; fit's off,full,auto
  int steps = 3;
  double peak_tflops = 0;
};

// Timings on the CPU that do not hang on the allocation history: glibc moves its mmap threshold as blocks are
// freed, and a step whose large tensors fall below it or above it differs by up to 60% (the quickstart at
// 512², measured: MALLOC_MMAP_THRESHOLD_ at 128 KiB against 1 GiB). bench and advise hold both thresholds
// at 1 GiB, so every policy they compare runs with freed memory kept by the process (live bytes, which the
// tracker counts, are the same).
void steady_cpu_allocations() {
#ifdef __GLIBC__
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

int run_bench(const ConfigArgs& args, const BenchArgs& b) {
  steady_cpu_allocations();
  const auto config = load(args);
  gclab::bench::BenchOptions o;
  o.steps = std::max(1, b.steps);
  o.peak_flops = b.peak_tflops * 1e12;
  o.policies = parse_policies(b.gc.empty() ? "off,full" : b.gc);
  o.batches = parse_list<int>("--batch", b.batch, parse_int);
  o.resolutions = parse_list<int>("--resolution", b.resolution, parse_int);
  o.caps = parse_list<std::string>("--caps", b.caps, [](const std::string& item) { return item; });
  const bool times_auto = std::any_of(o.policies.begin(), o.policies.end(), [](const auto& p) {
    return p.kind == gclab::ckpt::CheckpointPolicy::Kind::Auto;
  });
  if (!o.caps.empty() && !times_auto) throw gclab::UserError("--caps: give auto among --gc (the caps are auto's)");
  const std::filesystem::path dir = std::filesystem::path(config.training_folder) / config.name;
  std::filesystem::create_directories(dir);
  gclab::train::Session session = gclab::train::open_session(config, dir);
  const auto rows = gclab::bench::run_bench(session, o);
  print_report(args, gclab::bench::bench_report(rows));
  if (!gclab::dist::process_world().writes_outputs()) return kExitOk;  // a rank above 0: its figures printed only
  gclab::bench::write_bench_csv(dir / "bench.csv", rows);
  gclab::bench::write_bench_page(dir / "bench_report.html", rows, config.vram_cap.bytes);
  gclab::log::info("written " + (dir / "bench.csv").string() + " and " + (dir / "bench_report.html").string());
  return kExitOk;
}

int run_fit(const ConfigArgs& args, const BenchArgs& b, int max_batch, int max_frames) {
  const auto config = load(args);
  if (config.vram_cap.bytes <= 0 && !torch::cuda::is_available())
    throw gclab::UserError(
        "gclab fit on the CPU needs a cap to fit under: --vram-cap 24GiB (or vram_cap in the config)");
  const auto policies = parse_policies(b.gc.empty() ? "off,full,auto" : b.gc);
  const auto resolutions = parse_list<int>("--resolution", b.resolution, parse_int);
  if (max_batch < 1) throw gclab::UserError("--max-batch must be at least 1");
  if (max_frames < 1) throw gclab::UserError("--max-frames must be at least 1");
  const std::filesystem::path dir = std::filesystem::path(config.training_folder) / config.name;
  std::filesystem::create_directories(dir);
  gclab::train::Session session = gclab::train::open_session(config, dir);
  const auto rows = gclab::bench::run_fit(session, policies, resolutions, max_batch, max_frames);
  print_report(args, gclab::bench::fit_report(rows));
  if (!gclab::dist::process_world().writes_outputs()) return kExitOk;  // a rank above 0: its figures printed only
  gclab::bench::write_fit_page(dir / "fit_report.html", rows, config.vram_cap.bytes);
  gclab::log::info("written " + (dir / "fit_report.html").string());
  return kExitOk;
}

int run_advise(const ConfigArgs& args, int64_t steps) {
  steady_cpu_allocations();
  const auto config = load(args);
  const std::filesystem::path dir = std::filesystem::path(config.training_folder) / config.name;
  std::filesystem::create_directories(dir);
  gclab::train::Session session = gclab::train::open_session(config, dir);
  gclab::bench::AdviseOptions o;
  o.steps = steps;
  const auto result = gclab::bench::run_advise(session, o);
  std::cout << gclab::bench::advise_table(result);
  gclab::bench::write_advice(dir, result);
  // A run folder's report.html shows the advice too.
  if (std::filesystem::exists(dir / "metrics.jsonl") && !write_report_after_run(dir).empty())
    gclab::log::info("report: " + (dir / "report.html").string() + " shows the advice too");
  gclab::log::info("written " + (dir / "advise.json").string() + " and " + (dir / "advise.html").string());
  return kExitOk;
}

// Every verb's arguments, filled by CLI11's parse.
struct Verbs {
  ConfigArgs check_args, train_args, bench_args, fit_args, estimate_args, forward_args, tokenize_args;
  EstimateGrid estimate_grid;
  bool resume = false, from_scratch = false, dry_run = false;
  std::string memory_snapshot;
  int dist_timeout_s = 1800;
  std::string train_shard = "none";
  ConfigArgs advise_args;
  int64_t advise_steps = 0;
  BenchArgs bench_opts, fit_opts;
  int fit_max_batch = 32;
  int fit_max_frames = 81;
  TokenizeArgs tokenize_opts;
  ForwardArgs forward_files;
  SynthArgs synth_args;
  std::string report_dir;
  CLI::App *report = nullptr, *check = nullptr, *info = nullptr, *train = nullptr, *bench = nullptr, *fit = nullptr,
           *estimate = nullptr, *synth = nullptr, *tokenize = nullptr, *forward = nullptr, *advise = nullptr;
};

void add_bench_and_fit(CLI::App& app, Verbs& v) {
  auto& bench_args = v.bench_args;
  auto& bench_opts = v.bench_opts;
  auto& fit_args = v.fit_args;
  auto& fit_opts = v.fit_opts;
  auto& fit_max_batch = v.fit_max_batch;
  auto& fit_max_frames = v.fit_max_frames;
  auto* bench = v.bench = app.add_subcommand("bench", "GC on/off side by side: step time, peak memory");
  add_config_args(bench, bench_args);
  bench->add_flag("--json", bench_args.json, "print JSON instead of YAML");
  bench->add_option("--gc", bench_opts.gc,
                    "policies to compare, comma-separated (default off,full; auto is decided at each cell under the "
                    "cap)");
  bench->add_option("--batch", bench_opts.batch, "batch sizes, comma-separated (default: train.batch_size)");
  bench->add_option("--resolution", bench_opts.resolution,
                    "square resolutions, comma-separated (default: the datasets')");
  bench->add_option("--steps", bench_opts.steps, "timed steps per cell after one warm-up (default 3)");
  bench->add_option("--caps", bench_opts.caps,
                    "caps auto is timed under, comma-separated: 25% is a quarter of the way from full's predicted "
                    "peak to GC off's, or a size (20GiB); the policies then take turns, a warm-up and a timed step "
                    "each a round, the order reversed every other round");
  bench
      ->add_option("--peak-tflops", bench_opts.peak_tflops,
                   "the bf16 rate MFU is held against, TFLOP/s (a matmul measured on this machine; default: the "
                   "GPU's data-sheet peak)")
      ->check(CLI::NonNegativeNumber);
  auto* fit = v.fit = app.add_subcommand("fit", "largest batch / bucket that fits, per checkpoint policy");
  add_config_args(fit, fit_args);
  fit->add_flag("--json", fit_args.json, "print JSON instead of YAML");
  fit->add_option("--gc", fit_opts.gc,
                  "policies, comma-separated (default off,full,auto: auto decided at each batch under the cap)");
  fit->add_option("--resolution", fit_opts.resolution, "square resolutions, comma-separated (default: the datasets')");
  fit->add_option("--max-batch", fit_max_batch, "largest batch to try (default 32)");
  fit->add_option("--max-frames", fit_max_frames,
                  "a video model: largest num_frames to try, at train.batch_size (default 81)");
  auto* advise = v.advise = app.add_subcommand(
      "advise", "I want speed: the alternatives to turning checkpointing off, measured on this config and ranked");
  add_config_args(advise, v.advise_args);
  advise->add_option("--steps", v.advise_steps, "the run length the previews are amortised over (default train.steps)")
      ->check(CLI::NonNegativeNumber);
}

void add_tokenize(CLI::App& app, Verbs& v) {
  auto& tokenize_args = v.tokenize_args;
  auto& tokenize_opts = v.tokenize_opts;
  auto* tokenize = v.tokenize =
      app.add_subcommand("tokenize", "a caption's token ids, as the family's tokenizer gives them");
  add_config_args(tokenize, tokenize_args);
  tokenize
      ->add_option("--component", tokenize_opts.component,
                   "the text encoder whose tokenizer: text_encoder, text_encoder_2 or text_encoder_3")
      ->required();
  tokenize->add_option("--tokenizer", tokenize_opts.tokenizer,
                       "the tokenizer's folder or file (default: name_or_path's tokenizer folder of that slot)");
  tokenize->add_option("--max-length", tokenize_opts.max_length,
                       "cut and pad to this many tokens (default: the pipeline's length)");
  tokenize->add_option("caption", tokenize_opts.captions, "captions")->required();
}

void add_forward(CLI::App& app, Verbs& v) {
  auto& forward_args = v.forward_args;
  auto& forward_files = v.forward_files;
  auto* forward = v.forward = app.add_subcommand("forward", "one forward pass on named inputs, for numerics checks");
  add_config_args(forward, forward_args);
  forward
      ->add_option("--weights", forward_files.weights,
                   "a diffusers model folder, .safetensors or *.index.json; default: model.name_or_path's "
                   "weights, else random")
      ->check(CLI::ExistingPath);
  forward->add_option("--inputs", forward_files.inputs, "safetensors with latents, timestep, text, ...")
      ->required()
      ->check(CLI::ExistingFile);
  forward->add_option("--out", forward_files.out, "where to write the prediction (safetensors)")->required();
  forward
      ->add_option("--lora", forward_files.lora,
                   "a LoRA file to apply (gclab's, or diffusers / AI Toolkit / kohya naming)")
      ->check(CLI::ExistingFile);
  forward->add_option("--lora-scale", forward_files.lora_scale, "the LoRA's strength (default 1)");
  forward->add_option_function<std::string>(
      "--component",
      [&forward_files](const std::string& v) {
        const std::map<std::string, ForwardComponent> named = {{"transformer", ForwardComponent::transformer},
                                                               {"vae.encode", ForwardComponent::vae_encode},
                                                               {"vae.decode", ForwardComponent::vae_decode}};
        if (const auto slot = gclab::model::text_encoder_slot(v)) {
          forward_files.component = ForwardComponent::text_encoder;
          forward_files.text_slot = *slot;
        } else if (const auto it = named.find(v); it != named.end()) {
          forward_files.component = it->second;
        } else {
          throw CLI::ValidationError("--component", v + " is not transformer, vae.encode, vae.decode, "
                                                        "text_encoder, text_encoder_2 or text_encoder_3");
        }
      },
      "transformer (default), vae.encode (images -> latents), vae.decode (latents -> images), "
      "text_encoder, text_encoder_2 or text_encoder_3 (input_ids -> hidden_states, pooled)");
  forward->add_option("--vae-tile", forward_files.vae_tile,
                      "vae.decode: decode in overlapping tiles of this many pixels, blended (diffusers' tiled_decode)");
  forward
      ->add_option("--posterior", forward_files.posterior,
                   "vae.encode: the posterior's mean (default) or a sample (training_seed)")
      ->transform(CLI::CheckedTransformer(std::map<std::string, gclab::vae::Posterior>{
          {"mean", gclab::vae::Posterior::mean}, {"sample", gclab::vae::Posterior::sample}}));
  forward->add_option("--dtype", forward_files.dtype, "fp32 (default), bf16, fp16")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
}

void add_synth(CLI::App& app, Verbs& v) {
  auto* synth = v.synth = app.add_subcommand("synth", "write a captioned image (or video clip) folder to train on");
  auto& synth_args = v.synth_args;
  synth->add_option("--out", synth_args.out, "folder to write (created if needed)")->required();
  synth->add_option("--count", synth_args.count, "number of images (default 24)");
  synth->add_option("--sizes", synth_args.sizes,
                    "comma-separated WIDTHxHEIGHT, cycled (default 512x512,640x448,448x640)");
  synth->add_option("--seed", synth_args.seed, "random seed (default 1)");
  synth->add_option("--frames", synth_args.frames,
                    "above 1: clips (folders of numbered frames, or video files with --video) for a video dataset's "
                    "num_frames (default 1; 17 with --video)");
  synth->add_flag("--video", synth_args.video, "clips as video files (FFmpeg): synth_NNNN.mp4 beside its caption");
  synth->add_option("--format", synth_args.format, "with --video: mp4, webm, mov, mkv or gif (default mp4)");
  synth->add_option("--fps", synth_args.fps, "with --video: the clips' frame rate (default 16, Wan's)");
  synth->add_flag("--simple", synth_args.simple,
                  "one large shape in the middle, every shape / colour / background combination in turn (the "
                  "quickstart's: learnable in minutes)");
}

}  // namespace

int gclab::cli::run(int argc, char** argv) {
  CLI::App app{"gclab: gradient-checkpointing lab for diffusion transformers (AI Toolkit configs)"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));

  Verbs v;
  v.check = app.add_subcommand("check", "validate a config and print it resolved (YAML)");
  add_config_args(v.check, v.check_args);
  v.check->add_flag("--json", v.check_args.json, "print JSON instead of YAML");
  v.info = app.add_subcommand("info", "LibTorch build, CUDA and GPUs this binary sees");
  v.train = app.add_subcommand("train", "train as the config says");
  add_config_args(v.train, v.train_args);
  // AI Toolkit resumes whenever the output folder has a save (BaseSDTrainProcess.py:2048, 2191-2215): so does
  // `gclab train`; --from-scratch starts at step 0 (later saves then rotate the earlier ones away).
  v.train->add_flag("--resume", v.resume, "continue from the newest save in the output folder (the default)");
  v.train->add_flag("--from-scratch", v.from_scratch,
                    "start at step 0 even where the output folder has saves (they rotate away as new ones come)");
  v.train->add_flag("--dry-run", v.dry_run, "validate and build the session on the meta device; train nothing");
  v.train->add_option("--memory-snapshot", v.memory_snapshot,
                      "record the allocator's history and write it to FILE when the run ends (out of memory too), "
                      "as the pickle PyTorch's memory viewer opens (pytorch.org/memory_viz)");
  v.train
      ->add_option("--dist-timeout", v.dist_timeout_s,
                   "data parallelism: seconds a rank waits for the others (a rank previewing or saving alone, one "
                   "that is gone) before it stops with an error naming them")
      ->check(CLI::PositiveNumber);
  v.train
      ->add_option("--shard", v.train_shard,
                   "data parallelism: none (DDP: every rank holds the whole optimizer state) or optimizer (ZeRO-1: "
                   "each rank keeps and updates the state of its share of the trained tensors)")
      ->check(CLI::IsMember({"none", "optimizer"}));
  add_bench_and_fit(app, v);
  v.estimate = app.add_subcommand("estimate", "predicted memory breakdown, no run");
  add_config_args(v.estimate, v.estimate_args);
  v.estimate->add_flag("--json", v.estimate_args.json, "print JSON instead of YAML");
  v.estimate->add_option("--frames", v.estimate_grid.frames,
                         "comma-separated num_frames (a video model): a row per frames x resolution");
  v.estimate->add_option("--resolution", v.estimate_grid.resolution,
                         "comma-separated dataset resolutions (default: the config's)");
  v.estimate
      ->add_option("--world-size", v.estimate_grid.world_size,
                   "data parallelism: the figures of each of N processes (default: this process's WORLD_SIZE, else 1)")
      ->check(CLI::PositiveNumber);
  v.estimate
      ->add_option("--shard", v.estimate_grid.shard,
                   "with --world-size: none (DDP, as gclab trains), optimizer (ZeRO-1), grads (ZeRO-2) or full "
                   "(FSDP): each rank's share, on paper")
      ->check(CLI::IsMember({"none", "optimizer", "grads", "full"}));
  add_synth(app, v);
  v.report = app.add_subcommand("report", "write report.html for a run folder: loss, memory per phase, previews");
  v.report->add_option("run_dir", v.report_dir, "the run's output folder (training_folder/name)")->required();
  add_tokenize(app, v);
  add_forward(app, v);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitBadInput;
  }
  gclab::log::set_level(log_level);
  // Data parallelism: torchrun's (or scripts/launch.sh's) environment says which process this is.
  try {
    gclab::dist::set_process_world(gclab::dist::world_from_environment().value_or(gclab::dist::World{}));
  } catch (const std::invalid_argument& e) {
    std::cerr << "error: " << e.what() << " (torchrun's environment: RANK, WORLD_SIZE, LOCAL_RANK)\n";
    return kExitBadInput;
  }
  gclab::log::set_source(gclab::dist::process_world().name());

  if (*v.check) return run_verb([&] { return run_check(v.check_args); });
  if (*v.info) return run_verb(run_info);
  if (*v.train) {
    if (v.train_shard == "optimizer") {
      gclab::dist::World world = gclab::dist::process_world();
      if (world.alone()) gclab::log::warn("--shard optimizer: one process (WORLD_SIZE unset or 1): nothing to shard");
      world.shard_optimizer = true;
      gclab::dist::set_process_world(world);
    }
    if (v.resume && v.from_scratch) {
      std::cerr << "error: --resume and --from-scratch contradict each other\n";
      return kExitBadInput;
    }
    return run_verb(
        [&] { return run_train(v.train_args, !v.from_scratch, v.dry_run, v.memory_snapshot, v.dist_timeout_s); });
  }
  if (*v.bench) return run_verb([&] { return run_bench(v.bench_args, v.bench_opts); });
  if (*v.fit) return run_verb([&] { return run_fit(v.fit_args, v.fit_opts, v.fit_max_batch, v.fit_max_frames); });
  if (*v.advise) return run_verb([&] { return run_advise(v.advise_args, v.advise_steps); });
  if (*v.estimate) return run_verb([&] { return run_estimate(v.estimate_args, v.estimate_grid); });
  if (*v.synth) return run_verb([&] { return run_synth(v.synth_args); });
  if (*v.report) return run_verb([&] { return run_report(v.report_dir); });
  if (*v.forward) return run_verb([&] { return run_forward(v.forward_args, v.forward_files); });
  if (*v.tokenize) return run_verb([&] { return run_tokenize(v.tokenize_args, v.tokenize_opts); });
  return kExitOther;
}
