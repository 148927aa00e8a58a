// What generic code asks of the families, answered by the family registry (registry.h; each family's folder
// under src/model/families/ holds its facts): which `model.arch` names gclab models, the family each belongs
// to, how each loads, guides and conditions. The config checks that need these facts (arch modelled,
// resolutions divisible by the arch's buckets) are here too, and load_config_file/text run them after the
// config part's own validation: every verb loads through them.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "gclab/config/loader.h"
#include "gclab/model/family_id.h"
#include "gclab/text/pipeline.h"

namespace gclab::model {

struct ModelSpec;  // spec.h

// How AI Toolkit's loader for the arch quantizes the transformer and when it reaches the device (read in
// ostris/ai-toolkit): what a load holds, and what model.low_vram changes there.
enum class TransformerLoading {
  // Moved whole to the device in its dtype, quantized there, then the text encoders are loaded beside it
  // (flex2.py's Flex2.load_model: `transformer.to(self.quantize_device)`, low_vram or not).
  on_device,
  // The same, except that under model.low_vram it stays in host memory to be quantized and is moved to
  // the device after (StableDiffusion.load_model's FLUX.1 / Flex.1 and SD3 branches, stable_diffusion_model.py:
  // `if not self.low_vram: transformer.to(self.quantize_device)`) — "uncomment this if the GPU is
  // connected to your monitors. It will use less vram to quantize" (the FLUX example configs).
  on_device_unless_low_vram,
  // quantize_model (toolkit/util/quantize.py): each block brought to the device, quantized and sent back,
  // the rest quantized in host memory; the transformer reaches the device after the text encoders are
  // loaded and quantized (qwen_image.py, z_image.py; under low_vram z_image.py waits for its first use).
  per_block,
  // In its dtype on the device unless low_vram (in host memory then); quantize_model quantizes each block and
  // sends it to host memory (toolkit/util/quantize.py:448-465, the rest quantized where it is); the text
  // encoders load; then the whole transformer moves to the device, low_vram or not (Wan's load_wan_transformer
  // and load_model, wan21.py:344-391, 445-448, 479-485). Unquantized and without low_vram it never leaves.
  parked_while_text_encoders_load,
  // A model of several experts, one expert after the other (Wan 2.2 A14B's load_wan_transformer,
  // wan22_14b_model.py:288-346): in its dtype on the device unless low_vram (in host memory then), quantized
  // by quantize_model (block by block through the device), then on the device unless low_vram — before the
  // text encoders load. Under low_vram every expert waits in host memory for the first forward that runs it,
  // which brings it to the device and sends the expert that ran before to host memory (the wrapper's
  // forward, :122-157; its .to() does nothing, so Wan21.load_model's move at the end of the load leaves them).
  experts_in_turn,
};

struct ArchFacts {
  std::string name;  // gclab's arch id, AI Toolkit's spelling where AI Toolkit has one
  Family family;
  std::string preset;  // the preset it builds (spec.h)
  bool tiny = false;   // a CPU-test-size model of the family
  // A variant chosen by model.name_or_path, as AI Toolkit chooses it (FLUX.1-schnell, Z-Image-Turbo), or
  // by the arch's tag (`zimage:turbo`, as AI Toolkit's UI writes it).
  std::string variant_keyword, variant_preset;
  TransformerLoading loading = TransformerLoading::on_device_unless_low_vram;
  // Text in a model.name_or_path that names this arch when the config does not (a Hub id or a folder:
  // "FLUX.1", "Qwen-Image-Edit"); the longest match wins.
  std::vector<std::string> names = {};
  // Black Forest Labs' layout: a local model.name_or_path folder holding this one file is the transformer's
  // weights (taken before a diffusers transformer/ there), and `autoencoder_file` beside it the autoencoder's,
  // taken over model.vae_path (Flux2Model.load_model, flux2_model.py:138-148, 189-190); empty: none.
  std::string transformer_file = {}, autoencoder_file = {};
};

// The arch a name_or_path names: the registered archs' names, the longest match first, else AI Toolkit's
// archs gclab does not model (config::infer_arch_from_name).
std::optional<config::ArchGuess> infer_arch_from_name(const std::string& name_or_path);

// Every arch gclab accepts in `model.arch`, in the order they are listed to users.
const std::vector<ArchFacts>& supported_archs();
const ArchFacts* find_arch(const std::string& name);
// The arch's TransformerLoading (an arch gclab does not know: StableDiffusion's).
TransformerLoading transformer_loading(const std::string& arch);
// Whether model.low_vram moves the transformer's quantization to host memory (on_device_unless_low_vram,
// parked_while_text_encoders_load).
bool low_vram_quantizes_in_host_memory(const std::string& arch);
// Whether the load quantizes (and holds) the transformer in host memory as the model block configures it:
// per_block always, on_device_unless_low_vram and parked_while_text_encoders_load under low_vram.
bool quantizes_in_host_memory(const config::ModelConfig& model);

// Which text encoders AI Toolkit's loader quantizes, under which switch, as which qtype (read in its loaders):
// FLUX.1 / Flex (stable_diffusion_model.py, flex2.py) T5 only, under quantize_te (which defaults to
// quantize), as model.qtype — CLIP-L never; SD3 (stable_diffusion_model.py) T5 only, under model.quantize
// (quantize_te is not read), as model.qtype; Qwen-Image, Z-Image (qwen_image.py, z_image.py) the whole
// encoder, under quantize_te, as qtype_te.
struct TextEncoderQuantization {
  bool t5_only = false;         // the other encoders stay in their dtype
  bool under_quantize = false;  // switched by model.quantize instead of quantize_te
  bool as_qtype_te = true;      // stored as qtype_te, else as model.qtype
};
TextEncoderQuantization text_encoder_quantization(const ModelSpec& spec);
// A training step's guidance input for a guidance-distilled model (spec.guidance_embed): left out where the
// family's class reads train.bypass_guidance_embedding and it is set, else train.cfg_scale (SDTrainer's
// guidance_embedding_scale). Always true (nothing embedded) for a model without the embedder.
bool training_bypasses_guidance(const ModelSpec& spec, const config::TrainConfig& train);
std::string supported_arch_list();  // "flux, flex1, ..." for messages

// The autoencoder a family's pipeline decodes with: AutoencoderKL as FLUX.1's for FLUX.1, Flex and Z-Image,
// SD3's, the SD VAE for DiT; Qwen-Image's AutoencoderKLQwenImage.
// Whether AI Toolkit's model class decodes previews with the autoencoder tiled when model.low_vram is set
// (diffusers' enable_tiling() at its defaults): every Qwen-Image model class's (qwen_image.py,
// qwen_image_edit.py, qwen_image_edit_plus.py generate_single_image: `if self.model_config.low_vram:
// pipeline.vae.enable_tiling()`), Wan 2.1's and Wan 2.2 TI2V's (wan21.py use_vae_tiling), not Wan 2.1 I2V's
// nor the other families'.
bool low_vram_tiles_previews(const ModelSpec& spec);
// The text encoders a family's pipeline conditions on, in its folders' order (text_encoder, text_encoder_2,
// text_encoder_3): FLUX.1 / Flex CLIP-L (pooled) and T5-XXL; SD3.5 CLIP-L and bigG (projected) and T5-XXL;
// Qwen-Image Qwen2.5-VL; Z-Image Qwen3; DiT none (class labels).
std::vector<config::TextEncoderKind> text_encoders(const ModelSpec& spec);
// What the transformer of `spec` takes from its family's text pipeline: its text and pooled widths, its
// text length, an edit model's conditions.
text::PipelineTarget text_target(const ModelSpec& spec);
// The diffusers folder names of slot 0, 1, 2: text_encoder / text_encoder_2 / text_encoder_3 and
// tokenizer / tokenizer_2 / tokenizer_3 (also the names `--component` takes); the slot a name names.
inline constexpr size_t kTextEncoderSlots = 3;
std::string text_encoder_folder(size_t slot);
std::string tokenizer_folder(size_t slot);
std::optional<size_t> text_encoder_slot(const std::string& name);

// The checks of a loaded config that need the facts above; errors and warnings go to `diagnostics`.
void check_config(config::ProcessConfig& config, config::Diagnostics& diagnostics);

// config::load_config_* followed by check_config: what every gclab verb (and test) loads a config with.
config::LoadResult load_config_file(const std::string& path, const config::LoadOptions& options = {});
config::LoadResult load_config_text(const std::string& text, const std::string& source_name,
                                    const config::LoadOptions& options = {});

}  // namespace gclab::model
