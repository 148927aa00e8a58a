#include "gclab/text/prompt.h"

#include <algorithm>
#include <stdexcept>
#include <tuple>

#include "gclab/memory/meta_count.h"
#include "gclab/text/bpe.h"
#include "gclab/text/qwen_vision.h"

namespace gclab::text {

namespace {

using Kind = config::TextEncoderKind;

// Qwen2.5-VL's markers around an image's tokens (the edit templates' control images).
constexpr const char* kVisionStart = "<|vision_start|>";
constexpr const char* kVisionEnd = "<|vision_end|>";
constexpr const char* kImagePad = "<|image_pad|>";

bool is_clip(Kind k) { return k == Kind::clip_l || k == Kind::clip_l_projected || k == Kind::clip_g_projected; }

// The tokenizer slot `kind` reads from `folder`: T5's SentencePiece model, CLIP's or Qwen's BPE files; null:
// none there (the hashing stand-in then).
std::unique_ptr<Tokenizer> folder_tokenizer(Kind kind, const std::filesystem::path& folder) {
  std::error_code ec;
  if (kind == Kind::t5_xxl)
    return !folder.empty() && std::filesystem::is_regular_file(folder / "spiece.model", ec)
               ? std::make_unique<T5Tokenizer>(folder)
               : nullptr;
  if (!has_bpe_files(folder)) return nullptr;
  if (is_clip(kind)) return std::make_unique<ClipTokenizer>(folder);
  return std::make_unique<QwenTokenizer>(folder);
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

PromptEncoder::PromptEncoder(const PromptEncoderOptions& o) : pipeline_(o.pipeline), target_(o.target) {
  memory_.dtype = c10::typeMetaToScalarType(o.options.dtype());
  if (!pipeline_) return;
  const std::vector<Kind> kinds = pipeline_->encoders();
  std::vector<TinyWidths> presets;
  for (Kind k : kinds) presets.push_back(preset_widths(k));
  const bool full = !o.tiny && pipeline_->composes(presets, target_);
  const std::vector<TinyWidths> tiny = pipeline_->tiny_widths(target_);
  std::vector<TinyWidths> built;
  for (size_t i = 0; i < kinds.size(); ++i) {
    const std::filesystem::path folder = i < o.encoders.size() ? o.encoders[i] : std::filesystem::path();
    // The vision tower only where the pipeline reads control images through it (the edit models).
    LoadedTextEncoder e = build_text_encoder(kinds[i], !full, folder, o.options, !o.options.device().is_meta(),
                                             full ? TinyWidths{} : tiny.at(i), target_.condition_area > 0);
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
    s.tokenizer = folder_tokenizer(kinds[i], i < o.tokenizers.size() ? o.tokenizers[i] : std::filesystem::path());
    s.hashing = !s.tokenizer;
    if (!s.tokenizer) s.tokenizer = std::make_unique<HashingTokenizer>(hashing_vocabulary(*s.encoder));
    slots_.push_back(std::move(s));
  }
  if (!pipeline_->composes(built, target_)) {
    std::string each;
    for (size_t i = 0; i < built.size(); ++i) {
      const std::filesystem::path folder = i < o.encoders.size() ? o.encoders[i] : std::filesystem::path();
      each += std::string(i ? "; " : "") + std::string(config::name_of(kinds[i])) +
              (folder.empty() ? "" : " (" + folder.string() + ")") + ": hidden " + std::to_string(built[i].hidden) +
              ", pooled " + std::to_string(built[i].projection);
    }
    throw std::runtime_error("the text encoders' widths do not give the transformer's text width " +
                             std::to_string(target_.text_width) + " and pooled width " +
                             std::to_string(target_.pooled_width) + " (" + each + ")");
  }
  std::vector<const TextEncoderBase*> encoders;
  for (const Slot& s : slots_) encoders.push_back(s.encoder.get());
  const std::vector<PipelineCall> calls = pipeline_->calls(encoders, target_);
  for (size_t i = 0; i < slots_.size(); ++i) slots_[i].call = calls.at(i);
  fixed_rows_ = pipeline_->fixed_rows(target_);
}

PromptEmbedding TextPipeline::compose(const std::vector<EncodedText>& e, const std::vector<int64_t>& valid,
                                      const std::vector<PipelineCall>& calls, const PipelineTarget&) const {
  PromptEmbedding out;
  std::vector<torch::Tensor> pooled;
  for (const auto& x : e)
    if (x.pooled.defined()) pooled.push_back(x.pooled);
  if (!pooled.empty()) out.pooled = pooled.size() == 1 ? pooled[0] : torch::cat(pooled, -1);
  const PipelineCall& call = calls.back();
  torch::Tensor h = e.back().hidden_states;
  if (call.mask() && call.pad()) h = h.slice(1, 0, valid.back());  // a masked, padded call: the real tokens' rows
  out.text = h.slice(1, call.drop());
  return out;
}

namespace {

// The sizes an edit model's control images take in the vision tower (AI Toolkit's resize to the condition
// area), each [3, H, W].
std::pair<int64_t, int64_t> condition_size(const torch::Tensor& image, const PipelineCall& call) {
  if (image.dim() != 3 || image.size(0) != 3)
    throw std::invalid_argument("a control image is [3, H, W], got " + c10::str(image.sizes()));
  return qwen_edit_condition_size(image.size(1), image.size(2), call.condition_area(), call.numbered());
}

}  // namespace

TokenizedBatch PromptEncoder::tokenize(size_t slot, const std::string& prompt,
                                       const ConditionImages& conditions) const {
  const Slot& s = slots_.at(slot);
  if (s.call.condition_area() > 0) {
    // The edit templates, piece by piece at the special tokens (where the tokenizer splits them anyway), the
    // processor's runs of <|image_pad|> at each image's token count.
    std::vector<int64_t> ids = s.tokenizer->encode(s.call.prefix());
    auto append = [&](const std::string& text) {
      const auto more = s.tokenizer->encode(text);
      ids.insert(ids.end(), more.begin(), more.end());
    };
    if (conditions.empty() && !s.call.numbered()) append(std::string(kVisionStart) + kImagePad + kVisionEnd);
    for (size_t i = 0; i < conditions.size(); ++i) {
      if (s.call.numbered()) append("Picture " + std::to_string(i + 1) + ": ");
      append(kVisionStart);
      const auto [h, w] = condition_size(conditions[i], s.call);
      ids.insert(ids.end(), static_cast<size_t>(qwen_vl_image_tokens(h, w, *s.encoder->vision_config())),
                 s.encoder->image_token_id());
      append(kVisionEnd);
    }
    append(prompt + s.call.suffix());
    const auto n = static_cast<int64_t>(ids.size());
    return {torch::tensor(ids, torch::kLong).view({1, n}), torch::ones({1, n}, torch::kLong)};
  }
  const std::string text = s.call.prefix() + prompt + s.call.suffix();
  if (s.call.pad()) return s.tokenizer->encode_batch({text}, s.call.max_length());
  const auto ids = s.tokenizer->encode(text, s.call.max_length());
  const auto n = static_cast<int64_t>(ids.size());
  return {torch::tensor(ids, torch::kLong).view({1, n}), torch::ones({1, n}, torch::kLong)};
}

int64_t PromptEncoder::rows(const std::string& prompt, const ConditionImages& conditions) const {
  if (slots_.empty()) return 0;
  if (fixed_rows_ > 0) return fixed_rows_;
  const Slot& s = slots_.back();
  const int64_t tokens = tokenize(slots_.size() - 1, prompt, conditions).attention_mask.sum().item<int64_t>();
  return std::max<int64_t>(tokens - s.call.drop(), 0);
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
    const torch::Tensor mask = s.call.mask() ? t.attention_mask.to(device) : torch::Tensor();
    if (s.call.condition_area() > 0 && !conditions.empty()) {
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
  return pipeline_->compose(e, valid, calls(), target_);
}

std::vector<PipelineCall> PromptEncoder::calls() const {
  std::vector<PipelineCall> out;
  for (const Slot& s : slots_) out.push_back(s.call);
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
    int64_t n = call.pad() ? call.max_length()
                           : tokenize(i, "", conditions).input_ids.size(1) + std::max<int64_t>(prompt_tokens, 0);
    if (call.max_length() > 0) n = std::min(n, call.max_length());
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
    const bool images = slots_[i].call.condition_area() > 0;
    o.quantized_linears = quantized_[i];
    p.bytes.push_back(
        e.predicted_encode_bytes(1, tokens[i], slots_[i].call.mask(), o, images ? grids : std::vector<VisionGrid>{}));
    p.peak_bytes = std::max(p.peak_bytes, kept + p.bytes.back());
    kept += dtype_bytes * (tokens[i] * e.hidden_width() + e.pooled_width());
  }
  // The composition, walked on the meta device beside what every slot returned (kept).
  if (!slots_.empty()) {
    memory::MetaCount count;
    const auto meta = torch::TensorOptions().device(torch::kMeta).dtype(o.dtype);
    std::vector<EncodedText> returned;
    for (size_t i = 0; i < slots_.size(); ++i) {
      const TextEncoderBase& e = *slots_[i].encoder;
      returned.push_back({torch::empty({1, tokens[i], e.hidden_width()}, meta),
                          e.pooled_width() > 0 ? torch::empty({1, e.pooled_width()}, meta) : torch::Tensor()});
    }
    PromptEmbedding composed;
    memory::run_walk([&] { composed = pipeline_->compose(returned, tokens, calls(), target_); });
    p.peak_bytes = std::max(p.peak_bytes, count.peak());
    if (composed.text.defined()) p.dtype = composed.text.scalar_type();
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
