#include "gclab/config/choices.h"

namespace gclab::config {

// Spellings from AI Toolkit (toolkit/config_modules.py, toolkit/train_tools.py get_torch_dtype).
template <>
const std::vector<Spelling<DType>>& spellings() {
  static const std::vector<Spelling<DType>> s = {{DType::fp32, "fp32", {"float32", "float", "full"}},
                                                 {DType::bf16, "bf16", {"bfloat16"}},
                                                 {DType::fp16, "fp16", {"float16", "half"}}};
  return s;
}

template <>
const std::vector<Spelling<OptimizerKind>>& spellings() {
  // AI Toolkit's names (toolkit/optimizer.py lower-cases them; any "prodigy..." but prodigy8bit is Prodigy).
  static const std::vector<Spelling<OptimizerKind>> s = {
      {OptimizerKind::adamw, "adamw", {"AdamW"}},
      {OptimizerKind::adamw8bit, "adamw8bit", {"adamw_8bit", "AdamW8bit"}},
      {OptimizerKind::adam, "adam", {"Adam"}},
      {OptimizerKind::adam8bit, "adam8bit", {"adam_8bit", "Adam8bit"}},
      {OptimizerKind::lion, "lion", {"Lion"}},
      {OptimizerKind::lion8bit, "lion8bit", {"lion_8bit", "Lion8bit"}},
      {OptimizerKind::adafactor, "adafactor", {"Adafactor"}},
      {OptimizerKind::prodigy, "prodigy", {"Prodigy"}},
      {OptimizerKind::sgd, "sgd", {"SGD"}}};
  return s;
}

template <>
const std::vector<Spelling<OomPolicy>>& spellings() {
  static const std::vector<Spelling<OomPolicy>> s = {{OomPolicy::abort, "abort", {}}, {OomPolicy::skip, "skip", {}}};
  return s;
}

template <>
const std::vector<Spelling<TimestepType>>& spellings() {
  static const std::vector<Spelling<TimestepType>> s = {{TimestepType::sigmoid, "sigmoid", {}},
                                                        {TimestepType::linear, "linear", {}},
                                                        {TimestepType::shift, "shift", {}},
                                                        {TimestepType::weighted, "weighted", {}},
                                                        {TimestepType::flux_shift, "flux_shift", {}},
                                                        {TimestepType::lumina2_shift, "lumina2_shift", {}},
                                                        {TimestepType::lognorm_blend, "lognorm_blend", {}},
                                                        {TimestepType::next_sample, "next_sample", {}},
                                                        {TimestepType::one_step, "one_step", {}}};
  return s;
}

template <>
const std::vector<Spelling<ContentOrStyle>>& spellings() {
  static const std::vector<Spelling<ContentOrStyle>> s = {{ContentOrStyle::balanced, "balanced", {}},
                                                          {ContentOrStyle::content, "content", {}},
                                                          {ContentOrStyle::style, "style", {}}};
  return s;
}

template <>
const std::vector<Spelling<LossType>>& spellings() {
  static const std::vector<Spelling<LossType>> s = {{LossType::mse, "mse", {}}, {LossType::mae, "mae", {}}};
  return s;
}

template <>
const std::vector<Spelling<LrScheduler>>& spellings() {
  static const std::vector<Spelling<LrScheduler>> s = {{LrScheduler::constant, "constant", {}},
                                                       {LrScheduler::constant_with_warmup, "constant_with_warmup", {}},
                                                       {LrScheduler::linear, "linear", {}},
                                                       {LrScheduler::cosine, "cosine", {}}};
  return s;
}

template <>
const std::vector<Spelling<TextEncoderKind>>& spellings() {
  static const std::vector<Spelling<TextEncoderKind>> s = {{TextEncoderKind::clip_l, "clip_l", {}},
                                                           {TextEncoderKind::clip_l_projected, "clip_l_projected", {}},
                                                           {TextEncoderKind::clip_g_projected, "clip_g_projected", {}},
                                                           {TextEncoderKind::t5_xxl, "t5_xxl", {}},
                                                           {TextEncoderKind::umt5_xxl, "umt5_xxl", {}},
                                                           {TextEncoderKind::qwen25_vl, "qwen25_vl", {}},
                                                           {TextEncoderKind::qwen3, "qwen3", {}},
                                                           {TextEncoderKind::qwen3_8b, "qwen3_8b", {}},
                                                           {TextEncoderKind::mistral3, "mistral3", {}}};
  return s;
}

template <>
const std::vector<Spelling<QType>>& spellings() {
  static const std::vector<Spelling<QType>> s = {{QType::qfloat8, "qfloat8", {}}, {QType::float8, "float8", {}},
                                                 {QType::int8, "int8", {}},       {QType::uint2, "uint2", {}},
                                                 {QType::uint3, "uint3", {}},     {QType::uint4, "uint4", {}},
                                                 {QType::uint5, "uint5", {}},     {QType::uint6, "uint6", {}},
                                                 {QType::uint7, "uint7", {}},     {QType::uint8, "uint8", {}}};
  return s;
}

std::optional<QType> parse_qtype(const std::string& qtype) { return parse_choice<QType>(qtype); }

template <>
const std::vector<Spelling<VaeChoice>>& spellings() {
  static const std::vector<Spelling<VaeChoice>> s = {{VaeChoice::autoencoder, "autoencoder", {"auto"}},
                                                     {VaeChoice::dct, "dct", {}}};
  return s;
}

template <>
const std::vector<Spelling<SaveFormat>>& spellings() {
  static const std::vector<Spelling<SaveFormat>> s = {{SaveFormat::safetensors, "safetensors", {}},
                                                      {SaveFormat::diffusers, "diffusers", {}}};
  return s;
}

int dtype_bytes(DType dtype) { return dtype == DType::fp32 ? 4 : 2; }

}  // namespace gclab::config
