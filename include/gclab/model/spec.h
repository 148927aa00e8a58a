// The shapes of each model family's transformer (docs/models.md), the presets that name them, and
// the token accounting shared by the model, the estimator and the reports.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gclab/config/config.h"
#include "gclab/model/family_id.h"
#include "gclab/model/sample_shape.h"

namespace gclab::model {

struct ModelSpec {
  std::string preset;  // "flux-dev", "tiny-flux", ...
  Family family;       // set by the family's presets (registry.h)
  std::string arch;    // the config's model.arch
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
  int double_blocks = 0;   // flux / qwen: two-stream blocks; sd3: joint blocks
  int single_blocks = 0;   // flux: single-stream blocks; zimage: main layers; dit: blocks
  int refiner_blocks = 0;  // zimage: noise and context refiners, each
  int64_t mlp_hidden = 0;
  // The latent geometry (latent_shape, image_tokens): the autoencoder's channels, its spatial factor (pixels
  // per latent cell along each side) and temporal factor (a video VAE's frames per latent frame after the
  // first; 1: an image family, 4-D latents [B, C, H/s, W/s]; above 1: 5-D [B, C, 1 + (F-1)/t, H/s, W/s]), and
  // the transformer's patch (latent cells per token along each side) and patch over frames.
  int64_t latent_channels = 16;
  int64_t latent_spatial = 8;
  int64_t latent_temporal = 1;
  int64_t out_channels = 16;  // predicted channels (dit: 8 = learned sigma)
  int64_t patch = 2;
  int64_t patch_frames = 1;
  // flex2: packed input features beyond the latent's (inpaint latent 64 + mask 4 + control latent 64,
  // x_embedder 196 wide); without an inpainting or control input, a zero latent, a mask of ones and a zero
  // control, as AI Toolkit feeds them (flex2.py:462-482).
  int64_t extra_input_features = 0;
  // Image-to-video models: channels concatenated on the noisy latents before the patch embedding (Wan I2V's
  // first-frame mask 4 + first-frame latent 16), and the width and count of the image tokens the blocks
  // cross-attend beside the text (Wan 2.1 I2V's CLIP hidden states, 1280 x 257); 0: none.
  int64_t condition_input_channels = 0;
  int64_t image_embed_dim = 0;
  int64_t image_embed_tokens = 0;
  int64_t text_dim = 0;    // text-encoder width (0: no text, dit)
  int64_t pooled_dim = 0;  // pooled text vector width (flux: CLIP 768, sd3: 2048)
  int64_t max_text_tokens = 0;
  bool guidance_embed = false;  // flux-dev / flex: distilled guidance as an input
  std::vector<int64_t> rope_axes;
  double rope_theta = 10000.0;
  int64_t adaln_dim = 0;      // zimage: width of the adaLN input (min(hidden, 256))
  int64_t t_embed_mid = 0;    // zimage: the timestep MLP's hidden width
  int64_t num_classes = 0;    // dit
  int64_t pos_embed_max = 0;  // sd3: side of the fixed position-embedding grid
  int64_t sd3_base_size = 0;  // sd3: sample_size / patch
  // How a dataset's control images (control_path) and a preview's ctrl_img enter the transformer: as
  // reference latents whose tokens join the image sequence (the edit models), and then — in training, each
  // at the training image's size, and in previews, each resized to the preview's size first — or else at
  // reference_area of its own aspect (the reference-token accounting below, the loader, the previews).
  bool reference_tokens = false;
  bool references_at_image_size = false;
  bool zero_cond_t = false;  // Qwen-Image-Edit-2511: reference tokens modulated by the embedding of t = 0
  // FLUX.2: each control image taken raw — at its own size, not flipped, scaled or cropped with its image
  // (AI Toolkit's use_raw_control_images) — and prepared as the pipeline prepares a reference: scaled down
  // to reference_area only when larger, centre-cropped to multiples of 16 (data::raw_reference_size).
  bool raw_references = false;
  // Which of its model classes a family's preset is, in the family's own words (the Qwen-Image folder names
  // AI Toolkit's qwen_image_edit_plus class); read by the family's folder only.
  std::string variant;
  // Edit models: the control image also goes through the text encoder's vision tower, resized to this area
  // first (AI Toolkit's get_prompt_embeds: Qwen-Image-Edit 1024², the Plus models 384²; tiny presets 112²).
  // The rows one square control image adds to the text sequence: its Qwen2.5-VL tokens and their markers
  // (1024²: 1369 + 2; 384²: 196 + 2 + 5; the text module's rule gives them — ctest
  // PromptEncoder.EditPresetsConditionRowsFollowThePipelinesRule checks each preset's figure against it).
  int64_t condition_area = 0;
  int64_t condition_text_rows = 0;
  // Edit models: a control image is encoded as reference latents beside the noisy ones at this area (sides
  // rounded to multiples of 32: the pipelines' calculate_dimensions(1024 * 1024, ratio)) — by the Plus models
  // in training and previews, by Qwen-Image-Edit in previews only (it trains them at the image's size:
  // trains_references_at_image_size); tiny presets 512², as their condition_area is scaled down. 0: FLUX.1
  // Kontext's pipeline, each preview's reference at the preview's own size.
  int64_t reference_area = 1024 * 1024;
  // Bucket sides are multiples of this, as AI Toolkit's model class rounds them (get_bucket_divisibility):
  // FLUX.1 / Flex.1, SD3 (StableDiffusion, stable_diffusion_model.py:289-297) and Qwen-Image
  // (qwen_image.py:84-85) 32; Flex.2 (flex2.py:88-89) and Z-Image (z_image.py:81-82) 16; DiT (gclab's) 16.
  int divisibility = 32;
  // A preview's width and height are rounded down to a multiple of this: the pipeline's own rounding where
  // AI Toolkit passes the sample size through (FluxPipeline, StableDiffusion3Pipeline: the VAE's 8 x the
  // 2x2 packing, 16), the model class's divisibility where it rounds first (qwen_image.py:287-289 32,
  // z_image.py:358-360 16).
  int preview_divisibility = 16;
  bool tiny = false;
  // A model of several experts, each a whole transformer of this shape (experts.h: Wan 2.2 A14B's high- and
  // low-noise transformers): expert i runs at the flow times above expert_boundaries[i] and at or below the
  // boundary before it (1 for the first), AI Toolkit's multistage_boundaries ([0.875, 0]). Empty: one.
  std::vector<double> expert_boundaries;

  int total_blocks() const { return double_blocks + single_blocks + 2 * refiner_blocks; }
};

// The shape a config's `model` block selects: model.arch (already resolved by the config loader from
// arch / is_flux / name_or_path) plus name_or_path for variants (schnell, Turbo); when name_or_path is a
// local diffusers folder, the shape its config.json gives (any width and depth), on the arch's preset for
// everything config.json does not say. Throws UserError for a folder whose config.json is unusable,
// std::invalid_argument for an arch gclab does not model.
ModelSpec spec_for(const config::ModelConfig& model);
// The same for a run: a model whose reference images are optional (raw_references: FLUX.2) takes reference
// tokens only where the run gives control images — a dataset's control_path or a sample's ctrl_img
// (get_noise_prediction's `if batch_control_tensor_list is not None`). What the plan, summaries and reports use.
ModelSpec spec_for(const config::ProcessConfig& config);
// model.name_or_path as a local diffusers folder: `<dir>/transformer/config.json` (or `<dir>/config.json`)
// gives the transformer's shape, and its weights file (`diffusion_pytorch_model.safetensors`, or the
// sharded `.index.json`) when there is one. A name that is not a local folder (a Hub id) gives nothing.
// A single `.safetensors` file as name_or_path is the weights alone: the shape comes from its tensors.
struct LocalModel {
  std::filesystem::path config;   // the config.json read (empty: a single weights file)
  std::filesystem::path weights;  // empty: a shape only, random weights
  std::filesystem::path vae;      // the folder's vae/ (a diffusers autoencoder), when it has one
  // A BFL-layout folder's autoencoder file (ArchFacts::autoencoder_file), read in place of model.vae_path.
  bool vae_over_vae_path = false;
  // The folder's text_encoder/, text_encoder_2/, text_encoder_3/ (transformers models), in that order, up to
  // the last one it has (an absent one: empty).
  std::vector<std::filesystem::path> text_encoders;
  std::vector<std::filesystem::path> tokenizers;  // tokenizer/, tokenizer_2/, tokenizer_3/, the same way
  // An image-to-video pipeline's image_encoder/ (a transformers model) and image_processor/, when it has them.
  std::filesystem::path image_encoder, image_processor;
  // A pipeline of several experts' further transformers' weights (transformer_2/, ...; experts.h), `weights`
  // the first's; an empty path where a folder has no weights.
  std::vector<std::filesystem::path> expert_weights;
};
std::optional<LocalModel> local_model(const config::ModelConfig& model);
// The same for a folder named elsewhere (`what`, e.g. "--weights", names it in the error).
LocalModel local_model_at(const std::filesystem::path& dir, const std::string& what);

// Every preset by name ("flux-dev", "flux-schnell", "flex1", "flex2", "qwen-image", "qwen-image-edit",
// "qwen-image-edit-2509", "zimage", "zimage-turbo", "sd35-large", "dit-xl2", "tiny-*").
ModelSpec spec_by_preset(const std::string& preset);
std::vector<std::string> preset_names();

// Token accounting: the sequence lengths the transformer sees.
// The caption the predictions assume where a family's text length follows it (Qwen-Image, Z-Image, the
// text encoders' encode): 77 tokenizer tokens, CLIP's window; an edit model's with one square control image.
constexpr int64_t kNominalCaptionTokens = 77;
// The latents of a sample shape as the family's geometry shapes them: an image family's [B, C, H/s, W/s]
// (frames must be 1), a video family's [B, C, 1 + (F-1)/t, H/s, W/s].
std::vector<int64_t> latent_shape(const ModelSpec& spec, const SampleShape& shape);
// Image tokens of one sample: the latent cut into patch x patch (x patch_frames) pieces — (H/16)(W/16) for
// the 8x autoencoders and 2x2 patches, times the latent frames over patch_frames for a video family.
int64_t image_tokens(const ModelSpec& spec, const SampleShape& shape);
// Whether the family's latents carry frames (its autoencoder's temporal factor above 1): the sample shapes
// it takes have any number of frames; an image family's take one.
inline bool takes_frames(const ModelSpec& spec) { return spec.latent_temporal > 1; }
// The latent frames `frames` frames give (1 + (F - 1) / t; an image family: 1), and the frames that give
// `latent` latent frames (1 + t (k - 1): the counts the family's autoencoder takes whole).
inline int64_t latent_frames(const ModelSpec& spec, int64_t frames) {
  return takes_frames(spec) ? 1 + (frames - 1) / spec.latent_temporal : 1;
}
inline int64_t frames_of_latent(const ModelSpec& spec, int64_t latent) {
  return 1 + spec.latent_temporal * (latent - 1);
}
// The num_frames lever (advise, the OOM report): half the latent frames after the first of `frames`.
inline int64_t fewer_frames(const ModelSpec& spec, int64_t frames) {
  return frames_of_latent(spec, 1 + (latent_frames(spec, frames) - 1) / 2);
}
// Text tokens the text encoder hands the transformer for a prompt of `prompt_tokens` tokenizer tokens:
// FLUX-dev 512 and schnell 256 (T5 padded to max length); SD3 333 (77 CLIP + 256 T5); Qwen-Image and
// Z-Image the prompt's own length (the padding masked out), at most 1024 / 512, and an edit model's one
// square control image's condition_text_rows after it; DiT none (a class label).
int64_t encoder_tokens(const ModelSpec& spec, int64_t prompt_tokens);
// The rows the transformer takes when the pipeline gave `pipeline_rows` (images included): FLUX and SD3
// pad to max_text_tokens; the others take them as they are (their pipelines already cut the prompt).
int64_t sequence_rows(const ModelSpec& spec, int64_t pipeline_rows);
// Text tokens in the transformer's sequence: the encoder's, except Z-Image, which pads the caption to a
// multiple of 32 with its learned cap_pad_token.
int64_t text_tokens(const ModelSpec& spec, int64_t prompt_tokens);
// references_at_image_size: Qwen-Image-Edit (AI Toolkit's qwen_image_edit, not the Plus class) trains each control
// image scaled and cropped as its image (dataloader_mixins.py:1174-1198) and encodes it at that size
// (qwen_image_edit.py:148- 182, condition_noisy_latents): its reference latents are the noisy latents' size. The Plus
// class encodes each raw control image at reference_area of its aspect (qwen_image_edit_plus.py:240-306). The same
// class difference sizes the previews' references: Qwen-Image-Edit resizes the control image to the preview first
// (qwen_image_edit.py:98-105; train::preview_reference_size), the Plus pipeline keeps its aspect.
inline bool trains_references_at_image_size(const ModelSpec& spec) {
  return spec.reference_tokens && spec.references_at_image_size;
}
// Whether an edit model's text encoder reads its control images too (Qwen-Image-Edit's vision tower, sized by
// condition_area), beside their reference tokens; FLUX.1 Kontext's text does not.
inline bool text_reads_controls(const ModelSpec& spec) { return spec.reference_tokens && spec.condition_area > 0; }
// Reference-image tokens of an edit model training on (height, width) images: a latent of the image's size
// per control image (trains_references_at_image_size), else one of reference_area (4096 tokens at the
// pipelines' 1024², counted square).
int64_t reference_tokens(const ModelSpec& spec, int control_images, int64_t height, int64_t width);
// The size one control image's reference latent is made at in training, for a width x height image: the
// image's own (references_at_image_size, and `at_image_size` callers that say so: Flex.2's control channels)
// or reference_area of its aspect, sides multiples of the divisibility (data::reference_size). {width, height}.
std::pair<int64_t, int64_t> training_reference_size(const ModelSpec& spec, int64_t width, int64_t height,
                                                    bool at_image_size = false);
// The tokens a training step's blocks see for a sample of `shape`: the image's with an edit model's one
// control image's reference tokens, and the text's (`text_tokens`; 0: a 77-token caption's).
struct StepTokens {
  int64_t image = 0, text = 0;
};
StepTokens step_tokens(const ModelSpec& spec, const SampleShape& shape, int64_t text_tokens = 0);
// The size a preview of width x height encodes a control image of image_width x image_height at: the preview's
// own (reference_area 0: FLUX.1 Kontext's pipeline), else reference_area at the preview's aspect
// (references_at_image_size: Qwen-Image-Edit resizes the control to the preview first) or the image's (the
// Plus pipeline), sides multiples of the divisibility. {width, height}.
std::pair<int64_t, int64_t> preview_reference_size(const ModelSpec& spec, int64_t image_width, int64_t image_height,
                                                   int64_t width, int64_t height);
// A preview's of height x width: one reference latent per control image, a square one's
// (preview_reference_size).
int64_t preview_reference_tokens(const ModelSpec& spec, int control_images, int64_t height, int64_t width);

}  // namespace gclab::model
