#include "gclab/text/prompt.h"

#include <algorithm>
#include <stdexcept>
#include <tuple>

#include "gclab/text/bpe.h"
#include "gclab/text/qwen_vision.h"

namespace gclab::text {

namespace {

using Kind = config::TextEncoderKind;

// The encoders each composition takes, in slot order (which kinds they are is the family's,
// model::text_encoders; the options carry them).
size_t slots_of(Composition c) {
  switch (c) {
    case Composition::flux:
      return 2;
    case Composition::sd3:
      return 3;
    case Composition::qwen_image:
    case Composition::zimage:
      return 1;
    case Composition::none:
      break;
  }
  return 0;
}

// QwenImagePipeline.prompt_template_encode; the pipeline drops its first prompt_template_encode_start_idx = 34
// rows, the prefix's tokens under Qwen's tokenizer (and under the hashing stand-in's split).
constexpr int64_t kQwenImageDrop = 34;
constexpr const char* kQwenImagePrefix =
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, spatial "
    "relationships of the objects and background:<|im_end|>\n<|im_start|>user\n";
// QwenImageEditPipeline's / QwenImageEditPlusPipeline's prompt_template_encode up to the user's turn (its
// prompt_template_encode_start_idx = 64 tokens, dropped); then each control image — "Picture i: " in the
// Plus template — as <|vision_start|>, its run of <|image_pad|>, <|vision_end|>; then the prompt.
constexpr int64_t kQwenEditDrop = 64;
constexpr const char* kQwenEditPrefix =
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, objects, "
    "background), then explain how the user's text instruction should alter or modify the image. Generate a new "
    "image that meets the user's requirements while maintaining consistency with the original input where "
    "appropriate.<|im_end|>\n<|im_start|>user\n";
constexpr const char* kVisionStart = "<|vision_start|>";
constexpr const char* kVisionEnd = "<|vision_end|>";
constexpr const char* kImagePad = "<|image_pad|>";
// Qwen's chat template for one user turn with add_generation_prompt (Z-Image: enable_thinking=True adds
// nothing after it).
constexpr const char* kQwenUserPrefix = "<|im_start|>user\n";
constexpr const char* kQwenAssistantSuffix = "<|im_end|>\n<|im_start|>assistant\n";

// The widths each slot's CPU-test encoder is built at so the composition gives the transformer's widths.
std::vector<TinyWidths> tiny_widths(Composition c, int64_t text_width, int64_t pooled_width) {
  switch (c) {
    case Composition::flux:
      return {{pooled_width, 0}, {text_width, 0}};
    case Composition::sd3: {
      int64_t clip = std::min<int64_t>(32, text_width / 2);
      if (clip >= 4) clip -= clip % 4;
      return {{clip, pooled_width / 2}, {clip, pooled_width - pooled_width / 2}, {text_width, 0}};
    }
    case Composition::qwen_image:
    case Composition::zimage:
      return {{text_width, 0}};
    case Composition::none:
      break;
  }
  return {};
}

// Whether encoders of these widths (hidden, pooled per slot) give what the transformer takes.
bool composes(Composition c, const std::vector<TinyWidths>& w, int64_t text_width, int64_t pooled_width) {
  switch (c) {
    case Composition::flux:
      return w[1].hidden == text_width && w[0].projection == pooled_width;
    case Composition::sd3:
      return w[2].hidden == text_width && w[0].hidden + w[1].hidden <= text_width &&
             w[0].projection + w[1].projection == pooled_width;
    case Composition::qwen_image:
    case Composition::zimage:
      return w[0].hidden == text_width;
    case Composition::none:
      break;
  }
  return true;
}

}  // namespace

HashingVocabulary hashing_vocabulary(const TextEncoderBase& encoder) {
  const int64_t v = encoder.vocab_size();
  switch (encoder.kind()) {
    case Kind::clip_l:
    case Kind::clip_l_projected:
    case Kind::clip_g_projected:
      // <|startoftext|> and <|endoftext|> are CLIP's last two ids; FLUX's and SD3's CLIP-L pad with
      // <|endoftext|>.
      return {0, v - 2, v - 2, v - 1, v - 1};
    case Kind::t5_xxl:
      return {2, v, -1, 1, 0};  // <pad> 0, </s> 1
    case Kind::qwen25_vl:
    case Kind::qwen3:
      break;
  }
  // Qwen adds no special tokens and pads with <|endoftext|>; hashed ids stay below the image token (the
  // tiny vocabulary's 998) so that no word reads as an image.
  const int64_t end = encoder.takes_images() ? std::min(v, encoder.image_token_id()) : v;
  return {0, end, -1, -1, std::max<int64_t>(v - 1, 0), true};
}

PromptEncoder::PromptEncoder(const PromptEncoderOptions& o) : text_width_(o.text_width) {
  memory_.dtype = c10::typeMetaToScalarType(o.options.dtype());
  const Composition c = o.composition;
  if (o.kinds.size() != slots_of(c))
    throw std::runtime_error("this pipeline composes " + std::to_string(slots_of(c)) + " text encoder(s), not " +
                             std::to_string(o.kinds.size()));
  if (c == Composition::none) return;
  std::vector<TinyWidths> presets;
  for (Kind k : o.kinds) presets.push_back(preset_widths(k));
  const bool full = !o.tiny && composes(c, presets, o.text_width, o.pooled_width);
  const std::vector<TinyWidths> tiny = tiny_widths(c, o.text_width, o.pooled_width);
  std::vector<TinyWidths> built;
  for (size_t i = 0; i < o.kinds.size(); ++i) {
    const std::filesystem::path folder = i < o.encoders.size() ? o.encoders[i] : std::filesystem::path();
    // The vision tower only where the pipeline reads control images through it (the edit models).
    LoadedTextEncoder e = build_text_encoder(o.kinds[i], !full, folder, o.options, !o.options.device().is_meta(),
                                             full ? TinyWidths{} : tiny[i], o.condition_area > 0);
    LoadStep step;
    step.built_bytes = nn::module_bytes(*e.encoder);
    const std::optional<nn::WeightStorage> storage = i < o.linear_storage.size() ? o.linear_storage[i] : std::nullopt;
    if (storage) step.quantized = nn::store_weights(nn::named_linears(*e.encoder), *storage);
    load_steps_.push_back(step);
    quantized_.push_back(storage && nn::is_quantized(*storage));
    Slot s;
    s.encoder = e.encoder;
    s.random = e.random;
    built.push_back({s.encoder->hidden_width(), s.encoder->pooled_width()});
    const std::filesystem::path tok = i < o.tokenizers.size() ? o.tokenizers[i] : std::filesystem::path();
    std::error_code ec;
    if (o.kinds[i] == Kind::t5_xxl && !tok.empty() && std::filesystem::is_regular_file(tok / "spiece.model", ec)) {
      s.tokenizer = std::make_unique<T5Tokenizer>(tok);
      s.hashing = false;
    } else if (o.kinds[i] != Kind::t5_xxl && has_bpe_files(tok)) {
      if (c == Composition::flux || c == Composition::sd3)  // FLUX's and SD3's BPE slots are CLIPs
        s.tokenizer = std::make_unique<ClipTokenizer>(tok);
      else
        s.tokenizer = std::make_unique<QwenTokenizer>(tok);
      s.hashing = false;
    } else {
      s.tokenizer = std::make_unique<HashingTokenizer>(hashing_vocabulary(*s.encoder));
    }
    slots_.push_back(std::move(s));
  }
  if (!composes(c, built, o.text_width, o.pooled_width)) {
    std::string each;
    for (size_t i = 0; i < built.size(); ++i) {
      const std::filesystem::path folder = i < o.encoders.size() ? o.encoders[i] : std::filesystem::path();
      each += std::string(i ? "; " : "") + std::string(config::name_of(o.kinds[i])) +
              (folder.empty() ? "" : " (" + folder.string() + ")") + ": hidden " + std::to_string(built[i].hidden) +
              ", pooled " + std::to_string(built[i].projection);
    }
    throw std::runtime_error("the text encoders' widths do not give the transformer's text width " +
                             std::to_string(o.text_width) + " and pooled width " + std::to_string(o.pooled_width) +
                             " (" + each + ")");
  }
  switch (c) {
    case Composition::flux:
      slots_[0].call = {"", "", slots_[0].encoder->max_positions(), true, false, 0};
      slots_[1].call = {"", "", o.max_tokens, true, false, 0};
      fixed_rows_ = o.max_tokens;
      break;
    case Composition::sd3: {
      const int64_t clip = slots_[0].encoder->max_positions();
      if (o.max_tokens <= clip)
        throw std::runtime_error("the transformer takes " + std::to_string(o.max_tokens) +
                                 " text rows, not more than "
                                 "CLIP's " +
                                 std::to_string(clip) + ": no room for T5's");
      slots_[0].call = {"", "", clip, true, false, 0};
      slots_[1].call = {"", "", slots_[1].encoder->max_positions(), true, false, 0};
      slots_[2].call = {"", "", o.max_tokens - clip, true, false, 0};
      fixed_rows_ = o.max_tokens;
      break;
    }
    case Composition::qwen_image:
      if (o.condition_area > 0) {
        if (!slots_[0].encoder->takes_images())
          throw std::runtime_error("an edit model's text encoder needs Qwen2.5-VL's vision tower (vision_config)");
        // The edit pipelines do not cut the prompt (the processor pads, it does not truncate).
        slots_[0].call = {kQwenEditPrefix,  kQwenAssistantSuffix, 0, false, true, kQwenEditDrop,
                          o.condition_area, o.numbered_conditions};
      } else {
        slots_[0].call = {kQwenImagePrefix, kQwenAssistantSuffix, o.max_tokens + kQwenImageDrop, false, true,
                          kQwenImageDrop};
      }
      break;
    case Composition::zimage:
      slots_[0].call = {kQwenUserPrefix, kQwenAssistantSuffix, o.max_tokens, true, true, 0};
      break;
    case Composition::none:
      break;
  }
}

namespace {

// The sizes an edit model's control images take in the vision tower (AI Toolkit's resize to the condition
// area), each [3, H, W].
std::pair<int64_t, int64_t> condition_size(const torch::Tensor& image, const PipelineCall& call) {
  if (image.dim() != 3 || image.size(0) != 3)
    throw std::invalid_argument("a control image is [3, H, W], got " + c10::str(image.sizes()));
  return qwen_edit_condition_size(image.size(1), image.size(2), call.condition_area, call.numbered);
}

}  // namespace

TokenizedBatch PromptEncoder::tokenize(size_t slot, const std::string& prompt,
                                       const ConditionImages& conditions) const {
  const Slot& s = slots_.at(slot);
  if (s.call.condition_area > 0) {
    // The edit templates, piece by piece at the special tokens (where the tokenizer splits them anyway), the
    // processor's runs of <|image_pad|> at each image's token count.
    std::vector<int64_t> ids = s.tokenizer->encode(s.call.prefix);
    auto append = [&](const std::string& text) {
      const auto more = s.tokenizer->encode(text);
      ids.insert(ids.end(), more.begin(), more.end());
    };
    if (conditions.empty() && !s.call.numbered) append(std::string(kVisionStart) + kImagePad + kVisionEnd);
    for (size_t i = 0; i < conditions.size(); ++i) {
      if (s.call.numbered) append("Picture " + std::to_string(i + 1) + ": ");
      append(kVisionStart);
      const auto [h, w] = condition_size(conditions[i], s.call);
      ids.insert(ids.end(), static_cast<size_t>(qwen_vl_image_tokens(h, w, *s.encoder->vision_config())),
                 s.encoder->image_token_id());
      append(kVisionEnd);
    }
    append(prompt + s.call.suffix);
    const auto n = static_cast<int64_t>(ids.size());
    return {torch::tensor(ids, torch::kLong).view({1, n}), torch::ones({1, n}, torch::kLong)};
  }
  const std::string text = s.call.prefix + prompt + s.call.suffix;
  if (s.call.pad) return s.tokenizer->encode_batch({text}, s.call.max_length);
  const auto ids = s.tokenizer->encode(text, s.call.max_length);
  const auto n = static_cast<int64_t>(ids.size());
  return {torch::tensor(ids, torch::kLong).view({1, n}), torch::ones({1, n}, torch::kLong)};
}

int64_t PromptEncoder::rows(const std::string& prompt, const ConditionImages& conditions) const {
  if (slots_.empty()) return 0;
  if (fixed_rows_ > 0) return fixed_rows_;
  const Slot& s = slots_.back();
  const int64_t tokens = tokenize(slots_.size() - 1, prompt, conditions).attention_mask.sum().item<int64_t>();
  return std::max<int64_t>(tokens - s.call.drop, 0);
}

PromptEmbedding PromptEncoder::encode(const std::string& prompt, const ConditionImages& conditions) {
  PromptEmbedding out;
  if (slots_.empty()) return out;
  torch::NoGradGuard no_grad;
  std::vector<EncodedText> e;
  std::vector<int64_t> valid;
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    const TokenizedBatch t = tokenize(i, prompt, conditions);
    const torch::Device device = s.encoder->parameters().front().device();
    const torch::Tensor ids = t.input_ids.to(device);
    const torch::Tensor mask = s.call.mask ? t.attention_mask.to(device) : torch::Tensor();
    if (s.call.condition_area > 0 && !conditions.empty()) {
      // Each control image resized to its condition size (bilinear, as AI Toolkit's F.interpolate), then the
      // processor; the images' patches side by side, as the processor batches them.
      std::vector<QwenVisionInput> images;
      for (const torch::Tensor& image : conditions) {
        const auto [h, w] = condition_size(image, s.call);
        const torch::Tensor resized =
            at::upsample_bilinear2d(image.to(torch::kCPU, torch::kFloat).unsqueeze(0), {h, w}, /*align_corners=*/false)
                .squeeze(0)
                .clamp(0, 1);
        images.push_back(qwen_vl_image_input(resized, *s.encoder->vision_config()));
      }
      const QwenVisionInput all = qwen_vl_batch(images, device, s.encoder->parameters().front().scalar_type());
      e.push_back(s.encoder->encode_with_images(ids, mask, all));
    } else {
      e.push_back(s.encoder->encode(ids, mask));
    }
    valid.push_back(t.attention_mask.sum().item<int64_t>());
  }
  std::vector<torch::Tensor> pooled;
  for (const auto& x : e)
    if (x.pooled.defined()) pooled.push_back(x.pooled);
  if (!pooled.empty()) out.pooled = pooled.size() == 1 ? pooled[0] : torch::cat(pooled, -1);
  if (slots_.size() == 3) {
    // SD3: the CLIPs' states side by side, zero-padded to T5's width, then T5's rows.
    torch::Tensor clip = torch::cat({e[0].hidden_states, e[1].hidden_states}, -1);
    clip = torch::constant_pad_nd(clip, {0, text_width_ - clip.size(-1)});
    out.text = torch::cat({clip, e[2].hidden_states}, 1);
  } else {
    const Slot& s = slots_.back();
    torch::Tensor h = e.back().hidden_states;
    // A masked, padded call keeps only the real tokens' rows (Z-Image); Qwen-Image drops the template.
    if (s.call.mask && s.call.pad) h = h.slice(1, 0, valid.back());
    out.text = h.slice(1, s.call.drop);
  }
  return out;
}

std::vector<PromptEncoder::ConditionShape> PromptEncoder::condition_shapes(const ConditionImages& conditions) const {
  std::vector<ConditionShape> out;
  if (!reads_conditions()) return out;
  const PipelineCall& call = slots_.back().call;
  const QwenVisionConfig& v = *slots_.back().encoder->vision_config();
  for (const torch::Tensor& image : conditions) {
    ConditionShape c;
    c.height = image.size(1), c.width = image.size(2);
    std::tie(c.condition_height, c.condition_width) = condition_size(image, call);
    std::tie(c.processed_height, c.processed_width) = qwen_vl_smart_resize(
        c.condition_height, c.condition_width, v.patch_size * v.spatial_merge_size, kQwenVlMinPixels, kQwenVlMaxPixels);
    out.push_back(c);
  }
  return out;
}

EncodePrediction PromptEncoder::predict_encode(const std::string& prompt, const ConditionImages& conditions,
                                               const EncodeMemoryOptions& device) const {
  std::vector<int64_t> tokens;
  for (size_t i = 0; i < slots_.size(); ++i) tokens.push_back(tokenize(i, prompt, conditions).input_ids.size(1));
  return predict(tokens, condition_shapes(conditions), device);
}

EncodePrediction PromptEncoder::predict_encode(int64_t prompt_tokens, int square_conditions,
                                               const EncodeMemoryOptions& device) const {
  // The template's tokens (with the conditions' image tokens) around an empty prompt, then the caption's.
  ConditionImages conditions;
  if (reads_conditions())
    for (int i = 0; i < square_conditions; ++i)
      conditions.push_back(torch::empty({3, 1024, 1024}, torch::TensorOptions().device(torch::kMeta)));
  std::vector<int64_t> tokens;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const PipelineCall& call = slots_[i].call;
    int64_t n = call.pad ? call.max_length
                         : tokenize(i, "", conditions).input_ids.size(1) + std::max<int64_t>(prompt_tokens, 0);
    if (call.max_length > 0) n = std::min(n, call.max_length);
    tokens.push_back(n);
  }
  return predict(tokens, condition_shapes(conditions), device);
}

EncodePrediction PromptEncoder::predict(const std::vector<int64_t>& tokens,
                                        const std::vector<ConditionShape>& conditions,
                                        const EncodeMemoryOptions& device) const {
  EncodeMemoryOptions o = device;
  o.dtype = memory_.dtype;
  const auto dtype_bytes = static_cast<int64_t>(c10::elementSize(o.dtype));
  EncodePrediction p;
  p.tokens = tokens;
  // An edit model's control images through encode()'s resize and the processor (float32, on the CPU), one
  // after the other, each one's patches kept: the bilinear resize holds a float copy of the control image
  // beside the resized one and its clamp; the processor, where it resizes again, the resized image times
  // 255, rounded and clamped beside its uint8 levels; then the normalised image (before, during, after the
  // normalisation) until its patches are made (the patches are the encoder's walk's from there).
  std::vector<VisionGrid> grids;
  int64_t patches = 0;
  for (const ConditionShape& c : conditions) {
    const int64_t control = 4 * 3 * c.height * c.width, resized = 4 * 3 * c.condition_height * c.condition_width;
    const int64_t processed = 4 * 3 * c.processed_height * c.processed_width;
    const bool again = c.processed_height != c.condition_height || c.processed_width != c.condition_width;
    p.peak_bytes =
        std::max({p.peak_bytes, patches + control + 2 * resized,
                  patches + resized + (again ? 3 * resized + resized / 4 : 0), patches + resized + 3 * processed});
    const QwenVisionConfig& v = *slots_.back().encoder->vision_config();
    grids.push_back({c.processed_height / v.patch_size, c.processed_width / v.patch_size});
    patches += 2 * processed;  // [N, 3 x 2 x 14 x 14] float32: the still image twice over the temporal patch
  }
  int64_t kept = 0;  // what the slots before returned (EncodedText), alive while the next one encodes
  for (size_t i = 0; i < slots_.size(); ++i) {
    const TextEncoderBase& e = *slots_[i].encoder;
    const bool images = slots_[i].call.condition_area > 0;
    o.quantized_linears = quantized_[i];
    p.bytes.push_back(
        e.predicted_encode_bytes(1, tokens[i], slots_[i].call.mask, o, images ? grids : std::vector<VisionGrid>{}));
    p.peak_bytes = std::max(p.peak_bytes, kept + p.bytes.back());
    kept += dtype_bytes * (tokens[i] * e.hidden_width() + e.pooled_width());
  }
  if (slots_.size() == 3) {
    // SD3's composition: the CLIPs' states side by side, zero-padded to T5's width, then T5's rows after.
    const int64_t clip = tokens[0], widths = slots_[0].encoder->hidden_width() + slots_[1].encoder->hidden_width();
    p.peak_bytes = std::max(
        p.peak_bytes, kept + dtype_bytes * (clip * widths + clip * text_width_ + (clip + tokens[2]) * text_width_));
  }
  return p;
}

int64_t PromptEncoder::weight_bytes(size_t slot) const { return nn::module_bytes(*slots_.at(slot).encoder); }

int64_t PromptEncoder::weight_bytes() const {
  int64_t b = 0;
  for (size_t i = 0; i < slots_.size(); ++i) b += weight_bytes(i);
  return b;
}

void PromptEncoder::to(torch::Device device) {
  for (auto& s : slots_) s.encoder->to(device);
}

}  // namespace gclab::text
