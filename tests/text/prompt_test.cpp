// The families' prompt encoding (text::PromptEncoder): each pipeline's composition checked against its
// encoders called by hand as diffusers' pipelines call them; the full-size presets' rows and widths on the
// meta device; encoders sized to a transformer of any width; quantize_te's float8 Linear weights.
#include <gtest/gtest.h>

#include <torch/torch.h>
#include "gclab/memory/tracker.h"

#include <filesystem>
#include <fstream>

#include "../support/test_util.h"
#include "gclab/model/family.h"
#include "gclab/model/registry.h"
#include "gclab/model/spec.h"
#include "gclab/text/prompt.h"
#include "gclab/text/qwen_vision.h"

namespace gclab::text {
namespace {

namespace fs = std::filesystem;

PromptEncoderOptions options_for(const std::string& preset, const torch::TensorOptions& where = {}) {
  const model::ModelSpec spec = model::spec_by_preset(preset);
  PromptEncoderOptions o;
  o.pipeline = model::family_of(spec.family).text_pipeline(spec);
  o.target = model::text_target(spec);
  o.target.condition_area = 0, o.target.numbered_conditions = false;  // text only (edit_options: the edit template)
  o.tiny = spec.tiny;
  o.options = where;
  return o;
}

EncodedText by_hand(PromptEncoder& p, size_t slot, const std::string& prompt) {
  const TokenizedBatch t = p.tokenize(slot, prompt);
  return p.encoder(slot).encode(t.input_ids, p.call(slot).mask() ? t.attention_mask : torch::Tensor());
}

TEST(PromptEncoder, FluxTakesT5sPaddedRowsAndClipsPooledOutput) {
  torch::manual_seed(1);
  PromptEncoder p(options_for("tiny-flux"));
  torch::NoGradGuard g;
  const auto e = p.encode("a red circle on a blue square");
  EXPECT_EQ(e.text.sizes(), (std::vector<int64_t>{1, 32, 64}));
  EXPECT_EQ(p.rows("a red circle"), 32);
  EXPECT_TRUE(torch::equal(e.text, by_hand(p, 1, "a red circle on a blue square").hidden_states));
  EXPECT_TRUE(torch::equal(e.pooled, by_hand(p, 0, "a red circle on a blue square").pooled));
  // Every row is conditioned on, the padding's too (FLUX passes no attention mask).
  EXPECT_GT(e.text[0][31].abs().sum().item<float>(), 0.0f);
  // CLIP is called at its 16 (tiny) positions: <|startoftext|>, the words, <|endoftext|>, padding.
  const auto clip = p.tokenize(0, "a red circle");
  EXPECT_EQ(clip.input_ids.size(1), 16);
  EXPECT_EQ(clip.input_ids[0][0].item<int64_t>(), 998);
  EXPECT_EQ(clip.input_ids[0][4].item<int64_t>(), 999);
}

// Wan (WanPipeline._get_t5_prompt_embeds, as AI Toolkit's Wan21 calls it at 512 rows; tiny: 16): the prompt
// cleaned (HTML references unescaped twice, runs of whitespace one space, stripped), UMT5 on the padded ids
// with the mask, the real tokens' rows (the end-of-sequence token's included) and zeros after them.
TEST(PromptEncoder, WanCleansThePromptAndZeroesThePaddingRows) {
  torch::manual_seed(4);
  PromptEncoder p(options_for("tiny-wan21"));
  ASSERT_EQ(p.encoder(0).kind(), config::TextEncoderKind::umt5_xxl);
  torch::NoGradGuard g;
  const std::string messy = "  a red\t&amp;amp;  blue\n circle &#8212; x ";
  const std::string clean = "a red & blue circle \u2014 x";
  EXPECT_TRUE(torch::equal(p.tokenize(0, messy).input_ids, p.tokenize(0, clean).input_ids));
  const auto e = p.encode(messy);
  EXPECT_EQ(e.text.sizes(), (std::vector<int64_t>{1, 16, 64}));
  const TokenizedBatch t = p.tokenize(0, clean);
  const int64_t real = t.attention_mask.sum().item<int64_t>();
  ASSERT_LT(real, 16);
  const torch::Tensor by_hand_rows = by_hand(p, 0, clean).hidden_states.narrow(1, 0, real);
  EXPECT_TRUE(torch::equal(e.text.narrow(1, 0, real), by_hand_rows));
  EXPECT_EQ(e.text.narrow(1, real, 16 - real).abs().sum().item<float>(), 0.0f);
  EXPECT_EQ(p.rows("anything at all"), 16);
}

TEST(PromptEncoder, Sd3PutsBothClipsSideBySidePaddedToT5sWidthThenT5sRows) {
  torch::manual_seed(2);
  auto o = options_for("tiny-sd3");
  o.target.text_width = 96;  // wider than the two CLIPs: the zero padding shows
  PromptEncoder p(o);
  torch::NoGradGuard g;
  const std::string prompt = "a photo of a cat";
  const auto e = p.encode(prompt);
  EXPECT_EQ(e.text.sizes(), (std::vector<int64_t>{1, 48, 96}));
  EXPECT_EQ(p.call(2).max_length(), 48 - 16);
  const auto l = by_hand(p, 0, prompt), gg = by_hand(p, 1, prompt), t5 = by_hand(p, 2, prompt);
  EXPECT_TRUE(torch::equal(e.text.slice(1, 0, 16).slice(2, 0, 32), l.hidden_states));
  EXPECT_TRUE(torch::equal(e.text.slice(1, 0, 16).slice(2, 32, 64), gg.hidden_states));
  EXPECT_EQ(e.text.slice(1, 0, 16).slice(2, 64).abs().sum().item<float>(), 0.0f);
  EXPECT_TRUE(torch::equal(e.text.slice(1, 16), t5.hidden_states));
  EXPECT_TRUE(torch::equal(e.pooled, torch::cat({l.pooled, gg.pooled}, -1)));
  EXPECT_EQ(e.pooled.size(1), 32);
}

TEST(PromptEncoder, QwenImageDropsItsTemplatesThirtyFourPrefixTokens) {
  torch::manual_seed(3);
  PromptEncoder p(options_for("tiny-qwen-image"));
  torch::NoGradGuard g;
  EXPECT_EQ(p.call(0).drop(), 34);  // diffusers' prompt_template_encode_start_idx
  const std::string prompt = "a small red house, by the sea";
  const auto t = p.tokenize(0, prompt);
  const auto e = p.encode(prompt);
  EXPECT_EQ(e.text.size(1), t.input_ids.size(1) - 34);
  EXPECT_EQ(p.rows(prompt), e.text.size(1));
  EXPECT_TRUE(torch::equal(e.text, by_hand(p, 0, prompt).hidden_states.slice(1, 34)));
  // The empty caption keeps the template's five closing tokens (<|im_end|>, \n, <|im_start|>, assistant, \n):
  // the hashing stand-in splits the 34-token prefix as Qwen's tokenizer does.
  EXPECT_EQ(p.rows(""), 5);
  EXPECT_EQ(e.text.size(2), 64);
}

TEST(PromptEncoder, ZImageTakesTheRealTokensOfAPaddedMaskedCall) {
  torch::manual_seed(4);
  PromptEncoder p(options_for("tiny-zimage"));
  torch::NoGradGuard g;
  const std::string prompt = "three green apples";
  const auto t = p.tokenize(0, prompt);
  EXPECT_EQ(t.input_ids.size(1), 64);  // padded to max_sequence_length (tiny: 64)
  const int64_t real = t.attention_mask.sum().item<int64_t>();
  EXPECT_EQ(real, 3 + 3 + 5);  // <|im_start|> user \n, the words, the closing five
  const auto e = p.encode(prompt);
  EXPECT_EQ(e.text.sizes(), (std::vector<int64_t>{1, real, 64}));
  EXPECT_EQ(p.rows(prompt), real);
  // Causal attention with the padding on the right: the real rows are what an unpadded call gives.
  const auto unpadded = p.encoder(0).encode(t.input_ids.slice(1, 0, real), t.attention_mask.slice(1, 0, real));
  EXPECT_TRUE(torch::allclose(e.text, unpadded.hidden_states, 1e-5, 1e-6));
}

// FLUX.2 klein (Flux2KleinPipeline._get_qwen3_prompt_embeds; AI Toolkit's flux2/src/pipeline.py): Qwen3's chat
// template with enable_thinking off (the empty think block after the assistant's turn opens), padded to the
// length with the mask passed, the hidden states after three layers side by side per token, every row kept —
// padding included. The tiny 2-layer decoder takes layers 9 / 18 / 27 at the same fractions of its depth (1).
// hidden_states indexes as transformers' output_hidden_states does: 0 the embeddings, i layer i's output
// (hidden_states[-2], Z-Image's, checked against transformers by ctest interop.transformers_text), the last
// after the final norm.
TEST(PromptEncoder, Flux2KleinStacksThreeLayersOfQwen3OverEveryPaddedRow) {
  torch::manual_seed(5);
  PromptEncoder p(options_for("tiny-flux2-klein"));
  torch::NoGradGuard g;
  const std::string prompt = "three green apples";
  const auto t = p.tokenize(0, prompt);
  EXPECT_EQ(t.input_ids.size(1), 32);
  const int64_t real = t.attention_mask.sum().item<int64_t>();
  const auto plain = p.tokenize(0, "");
  EXPECT_EQ(p.call(0).suffix(), std::string(kQwenChatAssistant) + "<think>\n\n</think>\n\n");
  EXPECT_EQ(p.call(0).hidden_layers(), (std::vector<int64_t>{1, 1, 1}));
  EXPECT_GT(real, plain.attention_mask.sum().item<int64_t>());
  const auto e = p.encode(prompt);
  EXPECT_EQ(e.text.sizes(), (std::vector<int64_t>{1, 32, 192}));  // all 32 rows, 3 x 64 wide
  EXPECT_EQ(p.rows(prompt), 32);
  EXPECT_FALSE(e.mask.defined());  // no mask after the encoder (pipeline.py: `return prompt_embeds, None`)
  auto& qwen = dynamic_cast<TextEncoderBase&>(p.encoder(0));
  const EncodedText by_layers = qwen.encode_layers(t.input_ids, t.attention_mask, {1, 1, 1});
  EXPECT_TRUE(torch::equal(e.text, by_layers.hidden_states));
  const EncodedText penultimate = qwen.encode(t.input_ids, t.attention_mask);  // hidden_states[-2] = [1]
  EXPECT_TRUE(torch::equal(e.text.narrow(2, 64, 64), penultimate.hidden_states));
  EXPECT_TRUE(torch::equal(e.text.narrow(2, 0, 64), e.text.narrow(2, 128, 64)));
  EXPECT_THROW(qwen.encode_layers(t.input_ids, t.attention_mask, {3}), std::invalid_argument);  // 2 layers: 0..2
  // Three distinct layers land side by side in the order asked ("b c l d -> b l (c d)"): {2, 0, 1} gives the
  // final norm's output, the embeddings, then layer 1's output (hidden_states[-2], checked above).
  const EncodedText three = qwen.encode_layers(t.input_ids, t.attention_mask, {2, 0, 1});
  const EncodedText embeddings = qwen.encode_layers(t.input_ids, t.attention_mask, {0});
  const EncodedText last = qwen.encode_layers(t.input_ids, t.attention_mask, {2});
  EXPECT_TRUE(torch::equal(three.hidden_states.narrow(2, 0, 64), last.hidden_states));
  EXPECT_TRUE(torch::equal(three.hidden_states.narrow(2, 64, 64), embeddings.hidden_states));
  EXPECT_TRUE(torch::equal(three.hidden_states.narrow(2, 128, 64), penultimate.hidden_states));
  EXPECT_FALSE(torch::equal(embeddings.hidden_states, penultimate.hidden_states));
  EXPECT_FALSE(torch::equal(last.hidden_states, penultimate.hidden_states));
}

// The full-size presets' encoders compose to their transformers' widths and text rows (meta device).
TEST(PromptEncoder, FullSizePresetsGiveTheirTransformersRowsAndWidths) {
  const auto meta = torch::TensorOptions().device(torch::kMeta);
  struct Case {
    const char* preset;
    int64_t rows;
  };
  for (const Case& c : {Case{"flux-dev", 512}, Case{"flux-schnell", 256}, Case{"sd35-large", 333}}) {
    PromptEncoder p(options_for(c.preset, meta));
    EXPECT_EQ(p.rows("anything"), c.rows) << c.preset;
    EXPECT_EQ(p.encoder(0).vocab_size(), 49408) << c.preset;  // CLIP-L at its real shape
  }
  PromptEncoder sd3(options_for("sd35-large", meta));
  EXPECT_EQ(sd3.call(0).max_length(), 77);
  EXPECT_EQ(sd3.call(2).max_length(), 256);
  PromptEncoder qwen(options_for("qwen-image", meta));
  EXPECT_EQ(qwen.encoder(0).hidden_width(), 3584);
  EXPECT_EQ(qwen.call(0).max_length(), 1024 + 34);
  PromptEncoder z(options_for("zimage", meta));
  EXPECT_EQ(z.encoder(0).hidden_width(), 2560);
  EXPECT_EQ(z.call(0).max_length(), 512);
  // klein: Qwen3-4B / -8B, layers 9 / 18 / 27 of their 36, 512 rows 3 x their width.
  for (const auto& [preset, width] : {std::pair{"flux2-klein-4b", 2560}, {"flux2-klein-9b", 4096}}) {
    PromptEncoder k(options_for(preset, meta));
    EXPECT_EQ(k.encoder(0).hidden_width(), width) << preset;
    EXPECT_EQ(k.call(0).hidden_layers(), (std::vector<int64_t>{9, 18, 27})) << preset;
    EXPECT_EQ(k.rows("anything"), 512) << preset;
  }
  // dev: Mistral-Small-3.1's language model (40 layers of 5120), layers 10 / 20 / 30, BFL's system turn
  // around the prompt; held with its Pixtral tower, projector and LM head: transformers' Mistral3 count.
  const PromptEncoderOptions dev_options = options_for("flux2-dev", meta);
  PromptEncoder dev(dev_options);
  EXPECT_EQ(dev.encoder(0).hidden_width(), 5120);
  EXPECT_EQ(dev_options.pipeline->clean("a [IMG] cat[IMG]"), "a  cat");  // format_input drops Pixtral's token
  EXPECT_EQ(dev.encoder(0).layer_count(), 40);
  EXPECT_EQ(dev.call(0).hidden_layers(), (std::vector<int64_t>{10, 20, 30}));
  EXPECT_EQ(dev.rows("anything"), 512);
  EXPECT_EQ(dev.call(0).prefix().rfind("<s>[SYSTEM_PROMPT]You are an AI that reasons about image descriptions.", 0),
            0u);
  EXPECT_EQ(dev.call(0).suffix(), "[/INST]");
  int64_t mistral = 0;
  for (const auto& p : dev.encoder(0).parameters()) mistral += p.numel();
  EXPECT_EQ(mistral, 24011361280);
  // The weights as the run holds them: T5-XXL + CLIP-L in bf16.
  PromptEncoder flux(options_for("flux-dev", meta.dtype(torch::kBFloat16)));
  EXPECT_EQ(flux.weight_bytes(), int64_t{2} * (123060480 + 4762310656));
}

// A transformer of another width (a config.json of one's own) gets CPU-test encoders at its widths; a
// width no composition gives is refused.
TEST(PromptEncoder, EncodersAreSizedToATransformerOfAnyWidth) {
  torch::manual_seed(5);
  auto o = options_for("flux-dev");
  o.target.text_width = 48, o.target.pooled_width = 24, o.target.max_tokens = 20;
  PromptEncoder p(o);
  torch::NoGradGuard g;
  const auto e = p.encode("x");
  EXPECT_EQ(e.text.sizes(), (std::vector<int64_t>{1, 20, 48}));
  EXPECT_EQ(e.pooled.sizes(), (std::vector<int64_t>{1, 24}));
  auto sd3 = options_for("sd35-large", torch::TensorOptions().device(torch::kMeta));
  sd3.target.max_tokens = 77;  // no room for T5 after CLIP's 77
  EXPECT_THROW(PromptEncoder{sd3}, std::runtime_error);
  // A folder's encoder of another width is named in the error.
  const fs::path dir = gclab::testing::fresh_dir("prompt_widths");
  fs::create_directories(dir / "text_encoder_2");
  std::ofstream(dir / "text_encoder_2" / "config.json")
      << R"({"model_type": "t5", "d_model": 32, "num_layers": 1, "num_heads": 2, "d_kv": 8, "d_ff": 64, "vocab_size": 100})";
  auto flux = options_for("tiny-flux", torch::TensorOptions().device(torch::kMeta));
  flux.encoders = {"", dir / "text_encoder_2"};
  try {
    PromptEncoder p2(flux);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("t5_xxl (" + (dir / "text_encoder_2").string() + "): hidden 32"),
              std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

TEST(PromptEncoder, QuantizeTeStoresEveryLinearWeightInFloat8) {
  torch::manual_seed(6);
  auto o = options_for("tiny-flux");
  PromptEncoder plain(o);
  int64_t linear_weights = 0, rows = 0;
  for (size_t i = 0; i < plain.slots(); ++i)
    for (auto& [name, l] : nn::named_linears(plain.encoder(i)))
      linear_weights += l->weight.numel(), rows += l->out_features();
  o.linear_storage.assign(plain.slots(), nn::WeightStorage::QFloat8);
  torch::manual_seed(6);  // the same random weights, then stored in float8
  PromptEncoder q(o);
  // Three bytes saved per float32 weight, a float32 scale per output row added (quanto's per-row scale in
  // the weight's dtype).
  EXPECT_EQ(plain.weight_bytes() - q.weight_bytes(), 3 * linear_weights - 4 * rows);
  torch::NoGradGuard g;
  const auto a = plain.encode("a dog"), b = q.encode("a dog");
  EXPECT_TRUE(torch::isfinite(b.text).all().item<bool>());
  // float8 e4m3 keeps 3 mantissa bits: the hidden states move by a few percent, not more.
  const double rel = ((a.text - b.text).norm() / a.text.norm()).item<double>();
  EXPECT_GT(rel, 0.0);
  EXPECT_LT(rel, 0.1);
}

TEST(HashingTokenizer, SplitsAsByteLevelTokenizersDoAndKeepsItsSpecialTokens) {
  HashingTokenizer t5({2, 1000, -1, 1, 0});
  const auto ids = t5.encode("Hello, world!\nAgain");
  ASSERT_EQ(ids.size(), 7u);  // hello , world ! \n again </s>
  EXPECT_EQ(ids.back(), 1);
  EXPECT_EQ(t5.encode("HELLO"), t5.encode("hello"));
  EXPECT_NE(t5.encode("hello"), t5.encode("world"));
  for (int64_t id : t5.encode("many different words here 123 <|im_start|>"))
    EXPECT_TRUE(id == 1 || (id >= 2 && id < 1000));
  const auto cut = t5.encode("one two three four five", 3);
  EXPECT_EQ(cut.size(), 3u);
  EXPECT_EQ(cut.back(), 1);
  EXPECT_EQ(t5.encode("<|im_start|>").size(), 2u);  // one special token, then </s>
  const auto batch = t5.encode_batch({"a b", "a b c d"}, 4);
  EXPECT_EQ(batch.attention_mask[0].sum().item<int64_t>(), 3);
  EXPECT_EQ(batch.attention_mask[1].sum().item<int64_t>(), 4);
  EXPECT_EQ(batch.input_ids[0][3].item<int64_t>(), 0);  // <pad>
}

PromptEncoderOptions edit_options(const std::string& preset, const torch::TensorOptions& where = {}) {
  PromptEncoderOptions o = options_for(preset, where);
  const model::ModelSpec spec = model::spec_by_preset(preset);
  o.target = model::text_target(spec);  // the edit template: its condition area, its numbering
  return o;
}

// The edit pipelines' template: the 64 dropped rows are exactly the system prompt and the user turn's start
// (the stand-in splits them as Qwen's tokenizer does), then <|vision_start|>, the control image's tokens,
// <|vision_end|>, the prompt and the closing five. Without an image the template's <|image_pad|> stays one
// text token (QwenImageEditPipeline without an image).
TEST(PromptEncoder, EditModelsReadTheControlImageInTheirTemplate) {
  torch::manual_seed(7);
  PromptEncoder p(edit_options("tiny-qwen-image-edit"));
  ASSERT_TRUE(p.reads_conditions());
  torch::NoGradGuard g;
  const std::string prompt = "make it blue";
  EXPECT_EQ(p.rows(prompt), 3 + 3 + 5);
  const torch::Tensor a = torch::rand({3, 96, 128}), b = torch::rand({3, 96, 128});
  // 112²-area at 3:4 -> 96x128 (multiples of 32) -> the processor's 84x140 -> 6x10 patches -> 15 tokens.
  EXPECT_EQ(qwen_edit_condition_size(96, 128, 112 * 112, false), std::make_pair(int64_t{96}, int64_t{128}));
  EXPECT_EQ(p.rows(prompt, {a}), 1 + 15 + 1 + 3 + 5);
  const auto t = p.tokenize(0, prompt, {a});
  EXPECT_EQ((t.input_ids == p.encoder(0).image_token_id()).sum().item<int64_t>(), 15);
  EXPECT_EQ(t.input_ids[0][64].item<int64_t>(), p.tokenize(0, "<|vision_start|>").input_ids[0][64].item<int64_t>());
  const auto ea = p.encode(prompt, {a}), eb = p.encode(prompt, {b});
  EXPECT_EQ(ea.text.size(1), p.rows(prompt, {a}));
  // Causal: the <|vision_start|> row does not see the image; every row after it does.
  EXPECT_TRUE(torch::equal(ea.text.slice(1, 0, 1), eb.text.slice(1, 0, 1)));
  EXPECT_FALSE(torch::allclose(ea.text.slice(1, 1), eb.text.slice(1, 1)));
  EXPECT_THROW(p.rows(prompt, {torch::rand({96, 128})}), std::invalid_argument);
}

// Each edit preset's condition_text_rows (the rows one square control image adds, used where no image is
// at hand: estimate, check, the OOM report) is what the pipeline's rule gives: full size at 1024² (1369
// tokens for Qwen-Image-Edit, 196 for the Plus models and "Picture 1: "), tiny at 112².
TEST(PromptEncoder, EditPresetsConditionRowsFollowThePipelinesRule) {
  const auto meta = torch::TensorOptions().device(torch::kMeta);
  for (const std::string& preset : model::preset_names()) {
    const model::ModelSpec spec = model::spec_by_preset(preset);
    if (!spec.reference_tokens || spec.condition_area == 0) {  // FLUX.1 Kontext's text reads no image
      EXPECT_EQ(spec.condition_text_rows, 0) << preset;
      continue;
    }
    PromptEncoder p(edit_options(preset, meta));
    const torch::Tensor square = torch::empty({3, 1024, 1024}, meta);
    // Without an image the Qwen-Image-Edit template keeps its three literal tokens.
    const int64_t literal = model::text_target(spec).numbered_conditions ? 0 : 3;
    EXPECT_EQ(p.rows("a cat", {square}) - p.rows("a cat") + literal, spec.condition_text_rows) << preset;
    EXPECT_EQ(model::encoder_tokens(spec, 7), 7 + spec.condition_text_rows) << preset;
  }
  // AI Toolkit's Plus model computes the width from the height-over-width ratio: a landscape control
  // image's condition image comes out portrait (qwen_image_edit_plus.py); the plain edit model's keeps it.
  EXPECT_EQ(qwen_edit_condition_size(512, 1024, 384 * 384, true), std::make_pair(int64_t{544}, int64_t{256}));
  EXPECT_EQ(qwen_edit_condition_size(512, 1024, 1024 * 1024, false), std::make_pair(int64_t{736}, int64_t{1440}));
}

// A prompt's encode as the run calls it — tokenizers, each slot in turn beside what the ones before returned,
// the composition, an edit model's control image through the processor and the vision tower — against what
// PromptEncoder::predict_encode walks, with the tracking allocator, for every tiny family.
TEST(PromptEncoder, ThePredictedEncodePeakIsWhatTheAllocatorMeasures) {
  memory::CpuMemoryTracker tracker;
  EncodeMemoryOptions kernels;
  const std::string prompt = "a small red fox sitting in the snow, looking at the camera";
  // FLUX.2: every hidden state held and the LM head's logits over every row (klein's tied to the embedding,
  // dev's Mistral's own head).
  for (const std::string preset : {"tiny-flux", "tiny-sd3", "tiny-qwen-image", "tiny-zimage", "tiny-qwen-image-edit",
                                   "tiny-flux2-klein", "tiny-flux2-dev"}) {
    PromptEncoder p(edit_options(preset));
    // Edit models: a control image the processor resizes again, and two of which one is already its size.
    std::vector<ConditionImages> cases = {{}};
    if (p.reads_conditions())
      cases = {{torch::rand({3, 384, 256})}, {torch::rand({3, 512, 512}), torch::rand({3, 200, 300})}};
    for (const ConditionImages& conditions : cases) {
      p.encode(prompt, conditions);  // warms the kernels' lazy state
      const int64_t before = tracker.stats().live_bytes;
      tracker.reset_peak();
      p.encode(prompt, conditions);
      const int64_t measured = tracker.stats().peak_bytes - before;
      const int64_t predicted = p.predict_encode(prompt, conditions, kernels).peak_bytes;
      std::printf("%s, %zu control image(s): predicted %lld, measured %lld (%.3f)\n", preset.c_str(), conditions.size(),
                  static_cast<long long>(predicted), static_cast<long long>(measured),
                  static_cast<double>(predicted) / static_cast<double>(measured));
      EXPECT_NEAR(static_cast<double>(predicted) / static_cast<double>(measured), 1.0, 0.02) << preset;
    }
  }
}

}  // namespace
}  // namespace gclab::text
