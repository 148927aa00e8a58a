// LoRA on a frozen base and low-precision base weights, applied to a built transformer.
//
// Targets: every Linear inside the transformer's blocks — what AI Toolkit's LoRA network wraps for these
// families (for FLUX.1: 19 x 14 + 38 x 6 = 494 modules), embedders and the output layer excluded.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gclab/config/config.h"
#include "gclab/model/transformer.h"

namespace gclab::model {

struct LoraOptions {
  int64_t rank = 16;    // network.linear
  double alpha = 16.0;  // network.linear_alpha
  double dropout = 0.0;
  // Which Linears get adapters (network.transformer_only, network.network_kwargs): see apply_lora.
  bool transformer_only = true;
  std::vector<std::string> only_if_contains{}, ignore_if_contains{};
  // Only the Linears under these module paths ("transformer_1."): a model of several experts that trains
  // some (AI Toolkit's get_model_to_train, wan22_14b_model.py:594-609); empty: anywhere.
  std::vector<std::string> within{};
};
// The adapters a config's `network` block asks for (the one place its defaults are applied): alpha = rank,
// a scale of 1, as AI Toolkit trains these families; linear_alpha / linear with network.use_linear_alpha.
LoraOptions lora_options(const config::NetworkConfig& network);

// Freezes every parameter, then adds an adapter to each Linear AI Toolkit's LoRASpecialNetwork adapts
// (toolkit/lora_special.py:484-573): those of the family's LoRA blocks (every Linear without
// transformer_only), less those whose "transformer.<path>" contains an ignore_if_contains word, and with
// only_if_contains only those that contain one of its words. Returns the number of adapted modules. The adapters start
// as a no-op (lora_B = 0), so the model's output is unchanged.
int apply_lora(DiffusionTransformer& model, const LoraOptions& options);
// Sets every adapter's multiplier (nn::LinearImpl::set_lora_multiplier): a preview's network_multiplier.
void set_lora_multiplier(DiffusionTransformer& model, double multiplier);

// Stores every Linear's (frozen) weight as `storage`, those outside the blocks too (a test's tool: a run
// quantizes through quantize_base, which leaves the Linears its arch excludes). Returns the bytes of weight
// storage saved.
int64_t set_base_weight_storage(DiffusionTransformer& model, WeightStorage storage);

// The adapter weights in AI Toolkit's / diffusers' (PEFT) LoRA naming, as a file holds them:
//   <prefix><module path>.lora_A.weight  [rank, in]
//   <prefix><module path>.lora_B.weight  [out, rank], multiplied by alpha / rank
// <prefix><module path> the family's key (registry.h lora_file_key: "transformer.<path>", "diffusion_model.<path>"
// for Qwen-Image and Z-Image, Wan's original module names, as AI Toolkit renames keys before saving;
// load_lora reads either), in `dtype`
// (save.dtype). A LoRA file holds the update at scale 1 (delta W = B A), which is how AI
// Toolkit's and diffusers' loaders apply a PEFT-format file; gclab's alpha / rank is folded into lora_B
// rather than left to metadata a loader may ignore. The metadata says so for every reader:
// `lora_adapter_metadata` (diffusers: {"transformer.r", "transformer.lora_alpha" = r, target modules}),
// ss_network_dim / ss_network_alpha (kohya, AI Toolkit) = rank / rank, and gclab_linear_alpha, the alpha
// the adapters trained with.
std::vector<std::pair<std::string, torch::Tensor>> lora_state(DiffusionTransformer& model, torch::ScalarType dtype);
// AI Toolkit's add_model_hash_to_meta (toolkit/metadata.py:31-47, called at toolkit/network_mixins.py:654)
// for sd-webui-additional-networks: the file serialised with its ss_* metadata alone; sshs_model_hash the
// SHA-256 of its tensor bytes (after the header), sshs_legacy_hash the first 8 hex digits of the SHA-256 of
// its 64 KiB at 1 MiB (toolkit/train_tools.py:162-185).
void add_model_hashes(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                      std::map<std::string, std::string>& metadata);
// A model of several experts whose family names their files (expert_lora_suffixes) saves one file per
// expert unless `split_experts` is false (network.split_multistage_loras). Returns the files written.
std::vector<std::filesystem::path> save_lora(DiffusionTransformer& model, const std::filesystem::path& path,
                                             torch::ScalarType dtype, const LoraOptions& options,
                                             std::map<std::string, std::string> metadata = {},
                                             bool split_experts = true);
// `path` with `suffix` before its extension: an expert's file ("lora_000000100_high_noise.safetensors").
std::filesystem::path expert_lora_path(const std::filesystem::path& path, const std::string& suffix);
// Loads adapter weights saved by save_lora into a model with adapters applied (lora_B divided by the
// adapters' alpha / rank, undoing save_lora's fold). Every adapter of the model must be in the file with
// the same shape; throws std::runtime_error naming the first mismatch.
void load_lora(DiffusionTransformer& model, const std::filesystem::path& path);

// A LoRA file's matrices by the diffusers path of the Linear each updates. Reads the namings in use:
// PEFT / diffusers / AI Toolkit (`transformer.<path>.lora_A.weight`, also `diffusion_model.` or no prefix),
// with alpha from `lora_adapter_metadata` or `<path>.alpha` tensors; and kohya (`lora_transformer_<path
// with _>.lora_down.weight` / `lora_up` / `.alpha`, also `lora_unet_`) on diffusers' module paths. Throws
// std::runtime_error naming the first tensor it cannot place (a LoRA for another model, or for the
// original BFL layout's fused modules), a module with one matrix, or matrices of another shape.
struct LoraFileModule {
  torch::Tensor down, up;  // lora_A / lora_down [rank, in], lora_B / lora_up [out, rank]
  std::optional<double> alpha;
};
struct LoraFile {
  std::map<std::string, LoraFileModule> modules;
  std::optional<double> file_scale;  // alpha / r of lora_adapter_metadata
};
LoraFile read_lora_file(DiffusionTransformer& model, const std::filesystem::path& path);

// Adds a LoRA file's update, times `scale`, into the base weights (W += scale * alpha / rank * B A) of
// whichever Linears it names (read_lora_file; alpha = rank where the file has none), and returns how many.
int merge_lora_file(DiffusionTransformer& model, const std::filesystem::path& path, double scale = 1.0);

// model.assistant_lora_path (AI Toolkit's assistant / training adapter: load_assistant_lora_from_path,
// toolkit/assistant_lora.py, fused in for FLUX at stable_diffusion_model.py:718-725; Z-Image's
// load_training_adapter, z_image.py:84-165): the file's update merged into the base weights for training,
// its matrices kept beside them in `dtype` (on the weights' device: AI Toolkit's force_to) to take it back
// out while sampling. Returns the adapted Linears. On a meta model only the matrices' shapes are kept.
int attach_assistant_adapter(DiffusionTransformer& model, const std::filesystem::path& path, torch::ScalarType dtype);
// Runs every assistant adapter at `multiplier`, its matrices placed by `place`: -1 on the device while
// sampling (base_model.py:407-415, the inverted adapter active), 0 in host memory after it (:739-745).
void set_assistant_adapters(DiffusionTransformer& model, double multiplier,
                            const std::function<torch::Tensor(const torch::Tensor&)>& place);

// Loads base weights by diffusers name (a .safetensors file or a sharded *.index.json), converting dtype
// (and quantizing where a Linear stores float8). Every model parameter must be present with its shape;
// file tensors the model has no parameter for are returned (buffers, other components) so the caller can
// report them. Throws std::runtime_error naming the first missing or mismatched tensor.
std::vector<std::string> load_weights(DiffusionTransformer& model, const std::filesystem::path& path);
// A model of several experts from a pipeline folder: the first expert from `path` (transformer/), expert i
// from expert_weights[i - 1] (transformer_2/, ...: LocalModel::expert_weights); without expert_weights (a
// file of the whole model, its keys transformer_1.*, ...) or for one transformer, load_weights above.
std::vector<std::string> load_weights(DiffusionTransformer& model, const std::filesystem::path& path,
                                      const std::vector<std::filesystem::path>& expert_weights);
// Every parameter by name (float8 weights are stored dequantized in `dtype`).
std::vector<std::pair<std::string, torch::Tensor>> weights_state(DiffusionTransformer& model, torch::ScalarType dtype);

}  // namespace gclab::model
