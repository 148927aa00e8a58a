#include "gclab/text/prompt.h"

#include <algorithm>
#include <stdexcept>
#include <tuple>

#include "gclab/memory/meta_count.h"
#include "gclab/memory/placement.h"
#include "gclab/memory/tracker.h"
#include "gclab/nn/meta_kernels.h"
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

// The tokenizer slot `kind` reads from `folder`: T5's SentencePiece model, CLIP's or Qwen's BPE files, a
// tokenizer.json alone (Mistral's); null: none there (the hashing stand-in then).
std::unique_ptr<Tokenizer> folder_tokenizer(Kind kind, const std::filesystem::path& folder) {
  std::error_code ec;
  if (config::t5_structured(kind))
    return !folder.empty() && std::filesystem::is_regular_file(folder / "spiece.model", ec)
               ? std::make_unique<T5Tokenizer>(folder)
               : nullptr;
  if (!is_clip(kind) && has_tokenizer_json_only(folder)) return std::make_unique<TokenizerJsonBpe>(folder);
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
    case Kind::umt5_xxl:
      return {2, v, -1, 1, 0};  // <pad> 0, </s> 1
    case Kind::qwen25_vl:
    case Kind::qwen3:
    case Kind::qwen3_8b:
    case Kind::mistral3:
      break;
  }
  // Qwen adds no special tokens and pads with <|endoftext|> (Mistral's template writes its <s>); hashed ids stay below
  // the image token (the tiny vocabulary's 998) so that no word reads as an image.
  const int64_t end = encoder.takes_images() ? std::min(v, encoder.image_token_id()) : v;
  return {0, end, -1, -1, std::max<int64_t>(v - 1, 0), true};
}

PromptEncoder::PromptEncoder(const PromptEncoderOptions& o) : pipeline_(o.pipeline), target_(o.target) {
  dtype_ = c10::typeMetaToScalarType(o.options.dtype());
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
    storage_.push_back(storage);
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

std::vector<PipelineCall> ZeroPaddedPipeline::calls(const std::vector<const TextEncoderBase*>&,
                                                    const PipelineTarget& t) const {
  return {PipelineCall().max_length(t.max_tokens).pad(true).mask(true)};
}

PromptEmbedding ZeroPaddedPipeline::compose(const std::vector<EncodedText>& e, const std::vector<int64_t>& valid,
                                            const std::vector<PipelineCall>& calls, const PipelineTarget& t) const {
  PromptEmbedding out = TextPipeline::compose(e, valid, calls, t);  // the real tokens' rows
  const torch::Tensor& h = out.text;
  out.text = torch::cat({h, torch::zeros({h.size(0), t.max_tokens - h.size(1), h.size(2)}, h.options())}, 1);
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

TokenizedBatch PromptEncoder::tokenize(size_t slot, const std::string& given, const ConditionImages& conditions) const {
  const Slot& s = slots_.at(slot);
  const std::string prompt = pipeline_->clean(given);
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

EncodedText PromptEncoder::encode_slot(size_t slot, TextEncoderBase& encoder, const TokenizedBatch& t,
                                       const ConditionImages& conditions) const {
  const PipelineCall& call = slots_.at(slot).call;
  const torch::Device device = encoder.parameters().front().device();
  const bool images = call.condition_area() > 0 && !conditions.empty();
  // A walk (meta encoders) keeps the ids and mask of a call with images on the CPU: their values place the
  // image tokens and the multimodal positions (so a walk leaves out their device copies and the positions
  // a run makes on the device from them: some 40 bytes a token).
  const torch::Device at = images && device.is_meta() ? torch::Device(torch::kCPU) : device;
  const torch::Tensor ids = t.input_ids.to(at);
  const torch::Tensor mask = call.mask() ? t.attention_mask.to(at) : torch::Tensor();
  if (!call.hidden_layers().empty()) return encoder.encode_layers(ids, mask, call.hidden_layers(), call.lm_logits());
  if (!images) return encoder.encode(ids, mask);
  // Each control image resized to its condition size (bilinear, as AI Toolkit's F.interpolate), then the
  // processor; the images' patches side by side, as the processor batches them. The CPU's work (host memory
  // on a GPU run).
  std::vector<QwenVisionInput> inputs;
  {
    const memory::CpuWork cpu;
    for (const torch::Tensor& image : conditions) {
      const auto [h, w] = condition_size(image, call);
      const torch::Tensor resized =
          nn::resize_bilinear(memory::to_cpu(image).to(torch::kFloat).unsqueeze(0), {h, w}).squeeze(0).clamp(0, 1);
      inputs.push_back(qwen_vl_image_input(resized, *encoder.vision_config()));
    }
  }
  const QwenVisionInput all = qwen_vl_batch(inputs, device, encoder.parameters().front().scalar_type());
  return encoder.encode_with_images(ids, mask, all);
}

PromptEmbedding PromptEncoder::encode(const std::string& prompt, const ConditionImages& conditions) {
  PromptEmbedding out;
  if (slots_.empty()) return out;
  torch::NoGradGuard no_grad;
  std::vector<EncodedText> e;
  std::vector<int64_t> valid;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const TokenizedBatch t = tokenize(i, prompt, conditions);
    e.push_back(encode_slot(i, *slots_[i].encoder, t, conditions));
    valid.push_back(t.attention_mask.sum().item<int64_t>());
  }
  return pipeline_->compose(e, valid, calls(), target_);
}

std::vector<PipelineCall> PromptEncoder::calls() const {
  std::vector<PipelineCall> out;
  for (const Slot& s : slots_) out.push_back(s.call);
  return out;
}

EncodePrediction PromptEncoder::predict_encode(const std::string& prompt, const ConditionImages& conditions,
                                               const EncodeMemoryOptions& device) const {
  std::vector<TokenizedBatch> tokens;
  for (size_t i = 0; i < slots_.size(); ++i) tokens.push_back(tokenize(i, prompt, conditions));
  return predict(tokens, conditions, device);
}

EncodePrediction PromptEncoder::predict_encode(int64_t prompt_tokens, int square_conditions,
                                               const EncodeMemoryOptions& device) const {
  // The template's tokens (with the conditions' image tokens) around an empty prompt, then the caption's —
  // ids that are no image token — cut at the call's length (padded calls give that length already).
  ConditionImages conditions;
  if (reads_conditions())
    for (int i = 0; i < square_conditions; ++i)
      conditions.push_back(torch::empty({3, 1024, 1024}, torch::TensorOptions().device(torch::kMeta)));
  std::vector<TokenizedBatch> tokens;
  for (size_t i = 0; i < slots_.size(); ++i) {
    TokenizedBatch t = tokenize(i, "", conditions);
    const PipelineCall& call = slots_[i].call;
    int64_t caption = call.pad() ? 0 : std::max<int64_t>(prompt_tokens, 0);
    if (call.max_length() > 0) caption = std::min(caption, call.max_length() - t.input_ids.size(1));
    if (caption > 0) {
      t.input_ids = torch::cat({t.input_ids, torch::zeros({1, caption}, torch::kLong)}, 1);
      t.attention_mask = torch::cat({t.attention_mask, torch::ones({1, caption}, torch::kLong)}, 1);
    }
    tokens.push_back(t);
  }
  return predict(tokens, conditions, device);
}

EncodePrediction PromptEncoder::predict(const std::vector<TokenizedBatch>& tokens, const ConditionImages& conditions,
                                        const EncodeMemoryOptions& device) const {
  EncodePrediction p;
  p.dtype = dtype_;
  for (const TokenizedBatch& t : tokens) p.tokens.push_back(t.input_ids.size(1));
  if (slots_.empty()) return p;
  // encode() itself on the encoders' meta twins: each slot's tokens and control images through the same code,
  // beside what the slots before it returned, then the composition. The control images as the run's come:
  // float [3, H, W] in host memory (the loader's, a preview's).
  const std::vector<std::shared_ptr<TextEncoderBase>>& encoders = meta_encoders();
  ConditionImages images;
  {
    const memory::HostScope host;
    for (const torch::Tensor& c : conditions)
      images.push_back(torch::empty(c.sizes(), torch::TensorOptions().device(torch::kMeta)));
  }
  const c10::DeviceType target = device.cpu ? c10::kCPU : c10::kCUDA;
  torch::NoGradGuard no_grad;
  memory::MetaCount whole(target);
  memory::run_walk([&] {
    std::vector<EncodedText> e;
    std::vector<int64_t> valid;
    for (size_t i = 0; i < slots_.size(); ++i) {
      const int64_t before = whole.live();  // what the slots before returned (less what they freed)
      memory::MetaCount slot(target);
      e.push_back(encode_slot(i, *encoders[i], tokens[i], images));
      valid.push_back(tokens[i].attention_mask.sum().item<int64_t>());
      p.bytes.push_back(before + slot.peak());
    }
    const PromptEmbedding composed = pipeline_->compose(e, valid, calls(), target_);
    if (composed.text.defined()) p.dtype = composed.text.scalar_type();
  });
  p.peak_bytes = whole.peak();
  // A walk ended early by an op without a meta kernel (run_walk): the slots it did not reach get what it
  // saw, a lower bound, as the whole does.
  p.bytes.resize(slots_.size(), p.peak_bytes);
  return p;
}

const std::vector<std::shared_ptr<TextEncoderBase>>& PromptEncoder::meta_encoders() const {
  if (meta_.size() == slots_.size()) return meta_;
  std::vector<std::shared_ptr<TextEncoderBase>> built;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const std::shared_ptr<TextEncoderBase>& e = slots_[i].encoder;
    if (e->parameters().front().is_meta()) {  // a meta build's own encoders, as the Session stored them
      built.push_back(e);
      continue;
    }
    std::shared_ptr<TextEncoderBase> twin = e->meta_twin(dtype_);
    if (storage_[i]) nn::store_weights(nn::named_linears(*twin), *storage_[i]);
    built.push_back(twin);
  }
  meta_ = std::move(built);
  return meta_;
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
