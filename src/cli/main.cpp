// The `gclab` executable: parses the command line, hands each verb to its part, and turns every failure
// into a message and an exit code (DESIGN.md section 1): 0 done, 2 bad config or input, 3 out of
// memory, 1 anything else. No exception escapes main.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "gclab/ckpt/policy.h"
#include "gclab/config/byte_size.h"
#include "gclab/config/loader.h"
#include "gclab/log/log.h"
#include "gclab/memory/device.h"
#include "gclab/bench/bench.h"
#include "gclab/bench/estimate.h"
#include "gclab/config/arch.h"
#include "gclab/data/dataset.h"
#include "gclab/data/synth.h"
#include "gclab/io/safetensors.h"
#include "gclab/model/forward.h"
#include "gclab/model/lora.h"
#include "gclab/model/summary.h"
#include "gclab/train/trainer.h"

#include <unistd.h>

#include <atomic>
#include <csignal>

namespace {

constexpr int kExitOk = 0;
constexpr int kExitOther = 1;
constexpr int kExitBadInput = 2;
constexpr int kExitOom = 3;

struct ConfigArgs {
  std::string path;
  std::vector<std::string> overrides;
  std::string vram_cap;
};

void add_config_args(CLI::App* cmd, ConfigArgs& args) {
  cmd->add_option("config", args.path, "AI Toolkit config (YAML)")->required();
  cmd->add_option("--set", args.overrides, "override a field inside the process, e.g. train.batch_size=4")
      ->allow_extra_args(false);
  cmd->add_option("--vram-cap", args.vram_cap, "emulated VRAM cap, e.g. 24GiB (same as vram_cap in the config)");
}

// Loads and reports. Warnings and the ignored-key list go to the log; errors too, and then nullopt.
std::optional<gclab::config::ProcessConfig> load(const ConfigArgs& args) {
  gclab::config::LoadOptions options;
  options.overrides = args.overrides;
  if (!args.vram_cap.empty()) options.overrides.push_back("vram_cap=" + args.vram_cap);
  auto result = gclab::config::load_config_file(args.path, options);
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
  // The policy grammar belongs to the checkpoint part; the config only carries the text.
  if (result.config) {
    try {
      gclab::ckpt::CheckpointPolicy::parse(result.config->train.checkpoint_policy);
    } catch (const std::invalid_argument& e) {
      const std::string where = result.config->source.where("train.checkpoint_policy");
      result.diagnostics.error("train.checkpoint_policy", where, e.what());
      gclab::log::error("train.checkpoint_policy" + (where.empty() ? "" : " (" + where + ")") + ": " + e.what());
    }
  }
  if (!result.ok()) {
    gclab::log::error(args.path + ": " + std::to_string(result.diagnostics.errors().size()) +
                      " error(s); nothing was run");
    return std::nullopt;
  }
  return std::move(result.config);
}

void print_model_summary(const gclab::model::ModelSummary& s) {
  using gclab::config::format_bytes;
  const auto& spec = s.spec;
  std::cout << "# the model this config selects, counted on a meta-device build (no memory)\n";
  std::cout << "model_summary:\n";
  std::cout << "  preset: " << spec.preset << "\n  family: " << spec.family << "\n";
  std::cout << "  blocks: " << spec.total_blocks() << "  # ";
  if (spec.family == "flux") std::cout << spec.double_blocks << " double-stream + " << spec.single_blocks << " single-stream";
  else if (spec.family == "zimage")
    std::cout << spec.refiner_blocks << " noise + " << spec.refiner_blocks << " context refiners + " << spec.single_blocks
              << " single-stream";
  else std::cout << spec.total_blocks() << " " << (spec.family == "dit" ? "DiT" : "joint / double-stream");
  std::cout << ", width " << spec.hidden << " (" << spec.heads << " heads x " << spec.head_dim << ")\n";
  std::cout << "  parameters: " << s.parameters << "\n";
  std::cout << "  trainable_parameters: " << s.trainable_parameters;
  if (s.lora_modules) std::cout << "  # LoRA on " << s.lora_modules << " Linear modules";
  std::cout << "\n  weight_bytes: " << s.weight_bytes << "  # " << format_bytes(s.weight_bytes) << ", "
            << s.weight_storage << "\n";
  std::cout << "  tokens:  # per sample; text for a 77-token prompt\n";
  for (const auto& t : s.tokens) {
    std::cout << "    - {at: \"" << t.what << " " << t.width << "x" << t.height << "\", image: " << t.image_tokens
              << ", text: " << t.text_tokens;
    if (t.reference_tokens) std::cout << ", reference: " << t.reference_tokens;
    std::cout << "}\n";
  }
}

// Where each dataset's images land, per resolution, from image headers alone (no decoding).
void print_bucket_histograms(const gclab::config::ProcessConfig& config) {
  const auto arch = gclab::config::find_arch(config.model.arch);
  const int divisibility = arch ? arch->divisibility : 16;
  std::cout << "# buckets, from image headers only (divisibility " << divisibility << ")\n";
  std::cout << "buckets:" << (config.datasets.empty() ? " []" : "") << "\n";
  for (size_t d = 0; d < config.datasets.size(); ++d) {
    const auto& ds = config.datasets[d];
    std::cout << "  datasets[" << d << "]:";
    try {
      const auto scan = gclab::data::scan_dataset(ds, static_cast<int>(d));
      for (const auto& w : scan.warnings) gclab::log::warn(w);
      std::cout << "  # " << *ds.folder_path << ", " << scan.items.size() << " images\n";
      for (const auto& [resolution, buckets] : gclab::data::bucket_histogram(scan.items, ds, divisibility)) {
        std::cout << "    " << resolution << ":\n";
        for (const auto& [bucket, count] : buckets)
          std::cout << "      - " << bucket.key() << ": " << count << (count == 1 ? " image" : " images") << "\n";
      }
    } catch (const gclab::data::DataError& e) {
      std::cout << " []  # " << e.what() << "\n";
    }
  }
}

int run_check(const ConfigArgs& args) {
  const auto config = load(args);
  if (!config) return kExitBadInput;
  std::cout << "# resolved by gclab from " << args.path << "\n" << gclab::config::to_yaml(*config);
  print_model_summary(gclab::model::summarize_model(*config));
  print_bucket_histograms(*config);
  return kExitOk;
}

int run_info() {
  const auto info = gclab::memory::describe_devices();
  std::cout << "libtorch: " << info.torch_version << "\n";
  std::cout << "cuda_compiled: " << (info.cuda_compiled ? "true" : "false") << "\n";
  if (info.cuda_compiled) std::cout << "cuda_version: \"" << info.cuda_version << "\"\n";
  std::cout << "cuda_available: " << (info.cuda_available ? "true" : "false") << "\n";
  std::cout << "cpu_threads: " << info.cpu_threads << "\n";
  std::cout << "gpus:" << (info.gpus.empty() ? " []" : "") << "\n";
  for (const auto& g : info.gpus) {
    std::cout << "  - index: " << g.index << "\n    name: \"" << g.name << "\"\n    total_bytes: " << g.total_bytes
              << "  # " << gclab::config::format_bytes(g.total_bytes) << "\n    free_bytes: " << g.free_bytes
              << "\n    compute_capability: \"" << g.compute_capability_major << "." << g.compute_capability_minor
              << "\"\n";
  }
  return kExitOk;
}

struct ForwardArgs {
  std::string weights, inputs, out, dtype = "fp32";
};

// gclab forward: the configured transformer, the user's weights (or random ones from training_seed), one
// pass on named inputs, the prediction written as safetensors.
int run_forward(const ConfigArgs& args, const ForwardArgs& f) {
  const auto config = load(args);
  if (!config) return kExitBadInput;
  gclab::model::ModelSpec spec;
  try {
    spec = gclab::model::spec_for(config->model);
  } catch (const std::invalid_argument& e) {
    gclab::log::error(e.what());
    return kExitBadInput;
  }
  const torch::ScalarType dtype = f.dtype == "bf16" ? torch::kBFloat16 : f.dtype == "fp16" ? torch::kHalf : torch::kFloat;
  const torch::Device device = config->device == "auto" ? (torch::cuda::is_available() ? torch::kCUDA : torch::kCPU)
                                                        : torch::Device(config->device);
  try {
    torch::manual_seed(static_cast<uint64_t>(config->training_seed.value_or(42)));
    auto model = gclab::model::build_transformer(spec);
    if (config->model.quantize) gclab::model::set_base_weight_storage(*model, gclab::model::WeightStorage::Float8PerRow);
    if (!f.weights.empty()) {
      const auto unused = gclab::model::load_weights(*model, f.weights);
      if (!unused.empty())
        gclab::log::warn(std::to_string(unused.size()) + " tensor(s) in " + f.weights +
                         " are not parameters of this model and were not used, e.g. " + unused.front());
    } else {
      gclab::log::warn("no --weights: random weights (training_seed " +
                       std::to_string(config->training_seed.value_or(42)) + ")");
    }
    model->to(device);
    model->eval();
    const auto in = gclab::model::read_model_inputs(spec, f.inputs, device, dtype);
    torch::Tensor prediction;
    {
      torch::NoGradGuard no_grad;
      if (dtype != torch::kFloat) model->to(dtype);
      prediction = model->forward(in);
    }
    gclab::io::save_safetensors(f.out, {{"prediction", prediction}}, gclab::model::spec_metadata(spec));
    std::cout << "prediction " << prediction.sizes() << " " << c10::toString(prediction.scalar_type()) << " -> "
              << f.out << "\n";
  } catch (const std::runtime_error& e) {  // bad weights or inputs (SafetensorsError is one)
    gclab::log::error(e.what());
    return kExitBadInput;
  }
  return kExitOk;
}

struct SynthArgs {
  std::string out;
  int count = 24;
  std::string sizes = "512x512,640x448,448x640";
  uint64_t seed = 1;
};

int run_synth(const SynthArgs& a) {
  gclab::data::SynthOptions o;
  o.count = a.count;
  o.seed = a.seed;
  o.sizes.clear();
  std::stringstream in(a.sizes);
  for (std::string item; std::getline(in, item, ',');) {
    int w = 0, h = 0;
    char x = 0;
    std::stringstream one(item);
    if (!(one >> w >> x >> h) || x != 'x' || w < 8 || h < 8 || w > 8192 || h > 8192) {
      gclab::log::error("--sizes: '" + item + "' is not WIDTHxHEIGHT (8..8192), e.g. 512x512");
      return kExitBadInput;
    }
    o.sizes.push_back({w, h});
  }
  if (o.count < 1) {
    gclab::log::error("--count must be at least 1");
    return kExitBadInput;
  }
  const auto files = gclab::data::write_synthetic_dataset(a.out, o);
  std::cout << "wrote " << files.size() << " captioned images to " << a.out << "\n";
  return kExitOk;
}

std::atomic<bool> g_stop{false};
extern "C" void on_interrupt(int) { g_stop.store(true); }

int run_train(const ConfigArgs& args, bool resume) {
  const auto config = load(args);
  if (!config) return kExitBadInput;
  std::signal(SIGINT, on_interrupt);
  gclab::train::TrainOptions options;
  options.resume = resume;
  options.progress = &std::cerr;
  options.progress_in_place = ::isatty(STDERR_FILENO) == 1;
  options.stop_requested = &g_stop;
  try {
    const auto s = gclab::train::train(*config, options);
    const double wait_share = s.step_s > 0 ? 100.0 * s.data_wait_s / s.step_s : 0.0;
    char line[256];
    std::snprintf(line, sizeof line, "%s steps %lld-%lld in %.1f s (%.2f steps/s; %.1f%% of step time waiting for data)",
                  s.interrupted ? "interrupted after" : "done:", static_cast<long long>(s.start_step),
                  static_cast<long long>(s.end_step), s.total_s,
                  s.step_s > 0 ? static_cast<double>(s.end_step - s.start_step) / s.step_s : 0.0, wait_share);
    gclab::log::info(line);
    gclab::log::info("outputs in " + s.output_dir.string());
    return kExitOk;
  } catch (const gclab::train::OutOfMemoryStop& e) {
    gclab::log::error(e.what());
    return kExitOom;
  } catch (const c10::OutOfMemoryError& e) {
    gclab::log::error(std::string("out of memory: ") + e.what_without_backtrace());
    return kExitOom;
  } catch (const gclab::data::DataError& e) {
    gclab::log::error(e.what());
    return kExitBadInput;
  } catch (const std::invalid_argument& e) {
    gclab::log::error(e.what());
    return kExitBadInput;
  }
}

int run_estimate(const ConfigArgs& args) {
  const auto config = load(args);
  if (!config) return kExitBadInput;
  gclab::bench::MemoryEstimate e;
  try {
    e = gclab::bench::estimate_memory(*config);
  } catch (const std::invalid_argument& err) {
    gclab::log::error(err.what());
    return kExitBadInput;
  }
  using gclab::config::format_bytes;
  std::cout << "# predicted training memory for " << args.path << ", from shapes alone (no run)\n";
  std::cout << "estimate:\n  preset: " << e.spec.preset << "\n";
  std::cout << "  weights: " << e.weight_bytes << "  # " << format_bytes(e.weight_bytes) << "\n";
  std::cout << "  trained_parameters: " << e.trainable << "\n";
  std::cout << "  trained_parameter_bytes: " << e.trainable_bytes << "  # " << format_bytes(e.trainable_bytes) << "\n";
  std::cout << "  gradients: " << e.gradient_bytes << "  # " << format_bytes(e.gradient_bytes) << "\n";
  std::cout << "  optimizer_state: " << e.optimizer_bytes << "  # " << format_bytes(e.optimizer_bytes) << " ("
            << config->train.optimizer << ")\n";
  std::cout << "  activations_dtype: " << e.activation_dtype << "\n";
  if (e.cap_bytes > 0) std::cout << "  cap: " << e.cap_bytes << "  # " << format_bytes(e.cap_bytes) << "\n";
  std::cout << "  per_resolution:  # total = the above + block activations; the text encoder is not counted\n";
  for (const auto& r : e.resolutions) {
    auto verdict = [&](int64_t total) {
      return e.cap_bytes <= 0 ? std::string() : total <= e.cap_bytes ? ", fits" : ", over the cap";
    };
    std::cout << "    - {resolution: " << r.resolution << ", batch: " << r.batch << ", image_tokens: " << r.image_tokens
              << ", text_tokens: " << r.text_tokens << "}\n";
    std::cout << "      gc_off:  {activations: " << r.activations_off << ", total: " << r.total_off << "}  # "
              << format_bytes(r.total_off) << verdict(r.total_off) << "\n";
    std::cout << "      gc_full: {activations: " << r.activations_full << ", total: " << r.total_full << "}  # "
              << format_bytes(r.total_full) << verdict(r.total_full) << "\n";
  }
  return kExitOk;
}

struct BenchArgs {
  std::string gc = "off,full", batch, resolution;
  int steps = 3;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

int run_bench(const ConfigArgs& args, const BenchArgs& b) {
  const auto config = load(args);
  if (!config) return kExitBadInput;
  gclab::bench::BenchOptions o;
  o.steps = std::max(1, b.steps);
  try {
    o.policies = split_list(b.gc);
    for (const auto& p : o.policies) gclab::ckpt::CheckpointPolicy::parse(p);
    for (const auto& x : split_list(b.batch)) o.batches.push_back(std::stoi(x));
    for (const auto& x : split_list(b.resolution)) o.resolutions.push_back(std::stoi(x));
  } catch (const std::exception& e) {
    gclab::log::error(std::string("bench options: ") + e.what());
    return kExitBadInput;
  }
  const auto arch = gclab::config::find_arch(config->model.arch);
  for (int r : o.resolutions)
    if (arch && r % arch->divisibility != 0) {  // NOLINT
      gclab::log::error("--resolution " + std::to_string(r) + " is not a multiple of " +
                        std::to_string(arch->divisibility) + " (" + arch->name + ")");
      return kExitBadInput;
    }
  try {
    const auto rows = gclab::bench::run_bench(*config, o);
    std::cout << gclab::bench::bench_table(rows);
    const std::filesystem::path dir = std::filesystem::path(config->training_folder) / config->name;
    std::filesystem::create_directories(dir);
    gclab::bench::write_bench_csv(dir / "bench.csv", rows);
    gclab::log::info("written " + (dir / "bench.csv").string());
  } catch (const std::invalid_argument& e) {
    gclab::log::error(e.what());
    return kExitBadInput;
  }
  return kExitOk;
}

int run_fit(const ConfigArgs& args, const BenchArgs& b, int max_batch) {
  const auto config = load(args);
  if (!config) return kExitBadInput;
  if (config->vram_cap.bytes <= 0 && !torch::cuda::is_available()) {
    gclab::log::error("gclab fit on the CPU needs a cap to fit under: --vram-cap 24GiB (or vram_cap in the config)");
    return kExitBadInput;
  }
  std::vector<int> resolutions;
  for (const auto& x : split_list(b.resolution)) resolutions.push_back(std::stoi(x));
  if (resolutions.empty())
    for (const auto& d : config->datasets) resolutions.insert(resolutions.end(), d.resolution.begin(), d.resolution.end());
  std::sort(resolutions.begin(), resolutions.end());
  resolutions.erase(std::unique(resolutions.begin(), resolutions.end()), resolutions.end());
  try {
    const auto rows = gclab::bench::run_fit(*config, split_list(b.gc), resolutions, std::max(1, max_batch));
    std::cout << "| resolution | policy | largest batch that fits | peak at that batch |\n|---|---|---|---|\n";
    for (const auto& r : rows)
      std::cout << "| " << r.resolution << " | " << r.policy << " | "
                << (r.largest_batch ? std::to_string(r.largest_batch) : std::string("none (batch 1 runs out)")) << " | "
                << (r.largest_batch ? gclab::config::format_bytes(r.peak_bytes) : std::string("-")) << " |\n";
  } catch (const std::invalid_argument& e) {
    gclab::log::error(e.what());
    return kExitBadInput;
  }
  return kExitOk;
}


}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gclab: gradient-checkpointing lab for diffusion transformers (AI Toolkit configs)"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));

  ConfigArgs check_args, train_args, bench_args, fit_args, estimate_args, forward_args;
  auto* check = app.add_subcommand("check", "validate a config and print it resolved (YAML)");
  add_config_args(check, check_args);
  auto* info = app.add_subcommand("info", "LibTorch build, CUDA and GPUs this binary sees");
  auto* train = app.add_subcommand("train", "train as the config says");
  add_config_args(train, train_args);
  bool resume = false;
  train->add_flag("--resume", resume, "continue from the newest checkpoint in the output folder");
  auto* bench = app.add_subcommand("bench", "GC on/off side by side: step time, peak memory");
  add_config_args(bench, bench_args);
  BenchArgs bench_opts;
  bench->add_option("--gc", bench_opts.gc, "policies to compare, comma-separated (default off,full)");
  bench->add_option("--batch", bench_opts.batch, "batch sizes, comma-separated (default: train.batch_size)");
  bench->add_option("--resolution", bench_opts.resolution, "square resolutions, comma-separated (default: the datasets')");
  bench->add_option("--steps", bench_opts.steps, "timed steps per cell after one warm-up (default 3)");
  auto* fit = app.add_subcommand("fit", "largest batch / bucket that fits, per checkpoint policy");
  add_config_args(fit, fit_args);
  BenchArgs fit_opts;
  int fit_max_batch = 32;
  fit->add_option("--gc", fit_opts.gc, "policies, comma-separated (default off,full)");
  fit->add_option("--resolution", fit_opts.resolution, "square resolutions, comma-separated (default: the datasets')");
  fit->add_option("--max-batch", fit_max_batch, "largest batch to try (default 32)");
  auto* estimate = app.add_subcommand("estimate", "predicted memory breakdown, no run");
  add_config_args(estimate, estimate_args);
  auto* synth = app.add_subcommand("synth", "write a captioned image folder to train on");
  auto* forward = app.add_subcommand("forward", "one forward pass on named inputs, for numerics checks");
  add_config_args(forward, forward_args);
  ForwardArgs forward_files;
  forward->add_option("--weights", forward_files.weights, "diffusers-format .safetensors (or *.index.json); default random")
      ->check(CLI::ExistingFile);
  forward->add_option("--inputs", forward_files.inputs, "safetensors with latents, timestep, text, ...")
      ->required()
      ->check(CLI::ExistingFile);
  forward->add_option("--out", forward_files.out, "where to write the prediction (safetensors)")->required();
  forward->add_option("--dtype", forward_files.dtype, "fp32 (default), bf16, fp16")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  SynthArgs synth_args;
  synth->add_option("--out", synth_args.out, "folder to write (created if needed)")->required();
  synth->add_option("--count", synth_args.count, "number of images (default 24)");
  synth->add_option("--sizes", synth_args.sizes, "comma-separated WIDTHxHEIGHT, cycled (default 512x512,640x448,448x640)");
  synth->add_option("--seed", synth_args.seed, "random seed (default 1)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitBadInput;
  }
  gclab::log::set_level(log_level);

  try {
    if (*check) return run_check(check_args);
    if (*info) return run_info();
    if (*train) return run_train(train_args, resume);
    if (*bench) return run_bench(bench_args, bench_opts);
    if (*fit) return run_fit(fit_args, fit_opts, fit_max_batch);
    if (*estimate) return run_estimate(estimate_args);
    if (*synth) return run_synth(synth_args);
    if (*forward) return run_forward(forward_args, forward_files);
  } catch (const std::exception& e) {
    gclab::log::error(std::string("internal error: ") + e.what());
    return kExitOther;
  }
  return kExitOther;
}
