// T5's tokenizer on a SentencePiece model trained here (libsentencepiece's trainer, a small generated text):
// ids end with </s>, a cut keeps </s> last, batches pad with <pad> and mark padding in the mask, a missing
// or broken model file is an error naming it. Its ids against transformers': ctest
// interop.transformers_t5_tokenizer.
#include <gtest/gtest.h>
#include <sentencepiece_trainer.h>

#include <fstream>
#include <random>

#include "../support/test_util.h"
#include "gclab/text/bpe.h"
#include "gclab/text/tokenizer.h"

namespace gclab::text {
namespace {

namespace fs = std::filesystem;

fs::path train_model(const fs::path& dir) {
  const std::vector<std::string> words = {"a", "photo", "of", "the", "cat", "dog", "red", "blue", "on", "street"};
  std::mt19937 rng(0);
  std::ofstream corpus(dir / "corpus.txt");
  for (int line = 0; line < 500; ++line) {
    for (int w = 0; w < 8; ++w) corpus << (w ? " " : "") << words[rng() % words.size()];
    corpus << "\n";
  }
  corpus.close();
  const auto status = sentencepiece::SentencePieceTrainer::Train(
      "--input=" + (dir / "corpus.txt").string() + " --model_prefix=" + (dir / "spiece").string() +
      " --vocab_size=40 --hard_vocab_limit=false --model_type=unigram --pad_id=0 --eos_id=1 --unk_id=2 --bos_id=-1"
      " --minloglevel=2");
  EXPECT_TRUE(status.ok()) << status.ToString();
  return dir / "spiece.model";
}

TEST(T5Tokenizer, IdsEndWithEosCutsKeepItAndBatchesPad) {
  const fs::path dir = testing::fresh_dir("t5_tokenizer");
  const T5Tokenizer tok(train_model(dir).parent_path());  // the folder: its spiece.model
  EXPECT_EQ(tok.eos_id(), 1);
  EXPECT_EQ(tok.pad_id(), 0);
  const std::vector<int64_t> ids = tok.encode("a red cat on the street");
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.back(), 1);
  EXPECT_EQ(tok.encode(""), std::vector<int64_t>{1});
  const std::vector<int64_t> cut = tok.encode("a red cat on the street", 3);
  ASSERT_EQ(cut.size(), 3u);
  EXPECT_EQ(cut[0], ids[0]);
  EXPECT_EQ(cut[1], ids[1]);
  EXPECT_EQ(cut[2], 1);
  const TokenizedBatch b = tok.encode_batch({"a red cat on the street", "dog"}, 10);
  ASSERT_EQ(b.input_ids.sizes(), (std::vector<int64_t>{2, 10}));
  const auto n = static_cast<int64_t>(tok.encode("dog").size());
  EXPECT_EQ(b.attention_mask[1].sum().item<int64_t>(), n);
  EXPECT_EQ(b.input_ids[1][n - 1].item<int64_t>(), 1);
  EXPECT_TRUE(b.input_ids[1].slice(0, n).eq(0).all().item<bool>());
  fs::remove_all(dir);
}

TEST(T5Tokenizer, AMissingOrBrokenModelIsAnErrorNamingTheFile) {
  const fs::path dir = testing::fresh_dir("t5_tokenizer_bad");
  try {
    T5Tokenizer tok(dir);
    ADD_FAILURE() << "a folder without spiece.model loaded";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("spiece.model"), std::string::npos) << e.what();
  }
  std::ofstream(dir / "spiece.model") << "not a model";
  try {
    T5Tokenizer tok(dir / "spiece.model");
    ADD_FAILURE() << "a broken model loaded";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("not a SentencePiece model"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// CLIP's byte-level BPE on a vocabulary written here: lower-cased words, "</w>" on the last symbol, merges by
// rank, <|startoftext|> ... <|endoftext|> around, a cut keeping both, pad_token from tokenizer_config.json;
// missing files are errors naming them. Against transformers' CLIPTokenizer on a trained vocabulary: ctest
// interop.transformers_clip_tokenizer.
TEST(ClipTokenizer, MergesByRankAndKeepsItsSpecialTokens) {
  const fs::path dir = testing::fresh_dir("clip_tokenizer");
  std::ofstream(dir / "vocab.json")
      << R"({"<|startoftext|>": 0, "<|endoftext|>": 1, "a": 2, "b": 3, "a</w>": 4, "b</w>": 5, "ab</w>": 6, "!": 7})";
  std::ofstream(dir / "merges.txt") << "#version: 0.2\na b</w>\n";
  std::ofstream(dir / "tokenizer_config.json") << R"({"pad_token": {"content": "!"}})";
  ASSERT_TRUE(has_bpe_files(dir));
  const ClipTokenizer t(dir);
  EXPECT_EQ(t.encode("AB"), (std::vector<int64_t>{0, 6, 1}));
  EXPECT_EQ(t.encode("ba  a"), (std::vector<int64_t>{0, 3, 4, 4, 1}));
  EXPECT_EQ(t.encode("ab ab ab", 3), (std::vector<int64_t>{0, 6, 1}));
  EXPECT_EQ(t.pad_id(), 7);
  EXPECT_EQ(t.encode("ab!"), (std::vector<int64_t>{0, 6, 7, 1}));  // the pad token is an added token
  const auto batch = t.encode_batch({"ab"}, 5);
  EXPECT_EQ(batch.input_ids[0][4].item<int64_t>(), 7);
  fs::remove(dir / "merges.txt");
  EXPECT_FALSE(has_bpe_files(dir));
  try {
    ClipTokenizer broken(dir);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("merges.txt"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// Qwen's byte-level BPE: no suffix, no tokens around the text, spaces carried by the next word (Ġ), the
// chat tokens from tokenizer_config.json's added_tokens_decoder matched first. Against transformers'
// Qwen2Tokenizer with both pipelines' chat templates: ctest interop.transformers_qwen_tokenizer.
TEST(QwenTokenizer, AddedTokensFirstThenBytesMergedByRank) {
  const fs::path dir = testing::fresh_dir("qwen_tokenizer");
  std::ofstream(dir / "vocab.json") << R"({"a": 0, "b": 1, "ab": 2, "\u0120": 3, "\u0120a": 4, "<|endoftext|>": 5})";
  std::ofstream(dir / "merges.txt") << "#version: 0.2\na b\n\u0120 a\n";
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"pad_token": "<|endoftext|>", "added_tokens_decoder": {"10": {"content": "<|im_start|>"}}})";
  const QwenTokenizer t(dir);
  EXPECT_EQ(t.encode("ab a"), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(t.encode("<|im_start|>ab"), (std::vector<int64_t>{10, 2}));
  EXPECT_EQ(t.encode("ab a ab", 2), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(t.pad_id(), 5);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gclab::text
