// Config values with a fixed set of meanings, as enums: each one's spellings are listed once, here, and
// the loader reads, validates and writes them through that list. Nothing above `config` compares these
// values as strings.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gclab::config {

enum class DType { fp32, bf16, fp16 };
enum class OptimizerKind { adamw, adamw8bit, adam, adam8bit, lion, lion8bit, adafactor, prodigy, sgd };
enum class OomPolicy { abort, skip };
enum class TimestepType {
  sigmoid,
  linear,
  shift,
  weighted,
  flux_shift,
  lumina2_shift,
  lognorm_blend,
  next_sample,
  one_step
};
// train.content_or_style: which of the scheduler's 1000 timesteps a batch draws (AI Toolkit's TrainConfig).
enum class ContentOrStyle { balanced, content, style };
// train.loss_type: SDTrainer's element-wise loss (mse, or l1 for mae); its other losses are not modelled.
enum class LossType { mse, mae };
// save.save_format: one .safetensors file, or (a full fine-tune) a diffusers folder; a LoRA is one file either way.
enum class SaveFormat { safetensors, diffusers };
enum class LrScheduler { constant, constant_with_warmup, linear, cosine };
// The autoencoders the families decode with (which family uses which is model/family.h's autoencoder_kind):
// AutoencoderKL in FLUX.1's configuration (also Flex's and Z-Image's), SD3's, the SD VAE's (DiT)
// (vae/autoencoder_kl.h); Qwen-Image's AutoencoderKLQwenImage, the Wan 2.1 VAE (vae/qwen_image_vae.h).
// The text encoders the families condition on, each as its pipeline uses it (which family uses which is
// model/family.h's text_encoders; the networks are text/): CLIP ViT-L/14's pooled output (FLUX.1); CLIP-L
// and OpenCLIP bigG with their projections, penultimate hidden states and projected pooled outputs (SD3.5);
// T5 v1.1 XXL's encoder (FLUX.1, SD3.5); Qwen2.5-VL-7B (Qwen-Image); Qwen3-4B (Z-Image, FLUX.2 klein 4B);
// Qwen3-8B (klein 9B); Mistral-Small-3.1-24B's language model (FLUX.2-dev).
enum class TextEncoderKind {
  clip_l,
  clip_l_projected,
  clip_g_projected,
  t5_xxl,
  umt5_xxl,
  qwen25_vl,
  qwen3,
  qwen3_8b,
  mistral3
};
// T5's structure and SentencePiece tokenizer (T5-XXL; UMT5-XXL, its bias in every block).
inline bool t5_structured(TextEncoderKind k) { return k == TextEncoderKind::t5_xxl || k == TextEncoderKind::umt5_xxl; }
// model.vae (gclab's): what turns images into latents and previews back into images — the family's
// autoencoder (the default), or the deterministic DCT stand-in (an explicit choice for random-weight CPU
// runs, where a random autoencoder's previews would be noise).
enum class VaeChoice { autoencoder, dct };
// model.qtype / qtype_te: how AI Toolkit stores quantized weights (toolkit/util/quantize.py) — the ones
// gclab reproduces: optimum-quanto's qfloat8, torchao's float8 and int8 (weight-only), the packed uint2 ...
// uint7 (uint8 leaves every layer unquantized, as in AI Toolkit). An accuracy-recovery adapter may follow
// after '|' (`uint3|ostris/accuracy_recovery_adapters/...safetensors`): the loader moves it to
// model.accuracy_recovery_adapter, as AI Toolkit's ModelConfig does.
enum class QType { qfloat8, float8, int8, uint2, uint3, uint4, uint5, uint6, uint7, uint8 };
// nullopt for a type gclab does not store (orbit*, nvfp4, float8_e4m3fn, ...).
std::optional<QType> parse_qtype(const std::string& qtype);

// One value: its canonical spelling (written back) and the other spellings AI Toolkit accepts.
template <class E>
struct Spelling {
  E value;
  const char* name;
  std::vector<const char*> aliases;
};

// Specialised once per enum below (choices.cpp).
template <class E>
const std::vector<Spelling<E>>& spellings();

template <class E>
std::string_view name_of(E value) {
  for (const auto& s : spellings<E>())
    if (s.value == value) return s.name;
  return "?";
}

template <class E>
std::optional<E> parse_choice(std::string_view text) {
  for (const auto& s : spellings<E>()) {
    if (text == s.name) return s.value;
    for (const char* a : s.aliases)
      if (text == a) return s.value;
  }
  return std::nullopt;
}

// "a, b, c": the canonical spellings, for error messages.
template <class E>
std::string choice_list() {
  std::string out;
  for (const auto& s : spellings<E>()) out += (out.empty() ? "" : ", ") + std::string(s.name);
  return out;
}

// Bytes per element of a dtype.
int dtype_bytes(DType dtype);

}  // namespace gclab::config
