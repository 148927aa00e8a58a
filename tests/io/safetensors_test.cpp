#include "gclab/io/safetensors.h"
#include "gclab/io/sha256.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "../support/test_util.h"

namespace fs = std::filesystem;
using gclab::io::SafetensorsError;
using gclab::io::SafetensorsFile;
using gclab::testing::fresh_dir;

namespace {

// A file with its header written by hand, to build exactly the corruptions the reader must refuse.
std::string file_with_header(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  out += header;
  out.append(data_bytes, '\x01');
  return out;
}

std::string error_of(const std::string& bytes) {
  try {
    SafetensorsFile::from_bytes(bytes, "f.safetensors");
  } catch (const SafetensorsError& e) {
    return e.what();
  }
  return "";
}

std::vector<std::pair<std::string, torch::Tensor>> sample_tensors() {
  torch::manual_seed(3);
  return {
      {"blocks.0.attn.to_q.weight", torch::randn({8, 4})},
      {"blocks.0.norm.weight", torch::randn({4}).to(torch::kBFloat16)},
      {"half", torch::randn({3, 5}).to(torch::kHalf)},
      {"double", torch::randn({2}, torch::kDouble)},
      {"fp8", (torch::randn({6, 2}) * 4).to(torch::kFloat8_e4m3fn)},
      {"fp8b", torch::randn({3}).to(torch::kFloat8_e5m2)},
      {"mask", torch::rand({7}) > 0.5},
      {"ids", torch::arange(5, torch::kLong)},
      {"i32", torch::arange(3, torch::kInt)},
      {"bytes", torch::arange(9, torch::kByte)},
      {"scalar", torch::tensor(2.5f)},
      {"empty", torch::empty({0, 3})},
      {"non_contiguous", torch::randn({4, 6}).t()},
  };
}

}  // namespace

TEST(Safetensors, EveryDtypeAndShapeRoundTripsBitwise) {
  const auto tensors = sample_tensors();
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"ss_network_dim", "16"}};
  const auto file = SafetensorsFile::from_bytes(gclab::io::serialize_safetensors(tensors, metadata));
  EXPECT_EQ(file.metadata(), metadata);
  ASSERT_EQ(file.entries().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    const torch::Tensor back = file.tensor(name);
    EXPECT_EQ(back.scalar_type(), t.scalar_type()) << name;
    EXPECT_EQ(back.sizes(), t.sizes()) << name;
    // Compare the raw bytes: float8 has no equality kernel, and bitwise is the contract anyway.
    const auto bytes = [](const torch::Tensor& x) { return x.contiguous().reshape({-1}).view(torch::kByte); };
    EXPECT_TRUE(torch::equal(bytes(t), bytes(back))) << name;
  }
}

TEST(Safetensors, SavedFileMapsBackAndEditsDoNotReachTheFile) {
  const fs::path dir = fresh_dir("io_map");
  const fs::path path = dir / "w.safetensors";
  const torch::Tensor w = torch::arange(12, torch::kFloat).view({3, 4});
  gclab::io::save_safetensors(path, {{"w", w}});
  torch::Tensor view;
  {
    const auto file = SafetensorsFile::open(path);
    view = file.tensor("w");
  }  // the tensor keeps the mapping alive after the file object is gone
  EXPECT_TRUE(torch::equal(view, w));
  view.add_(1);  // copy-on-write mapping: the process sees the edit, the file does not
  EXPECT_TRUE(torch::equal(SafetensorsFile::open(path).tensor("w"), w));
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename(), "w.safetensors") << "temporary file left behind";
  fs::remove_all(dir);
}

TEST(Safetensors, SaveReplacesAnExistingFileWhole) {
  const fs::path dir = fresh_dir("io_replace");
  const fs::path path = dir / "w.safetensors";
  gclab::io::save_safetensors(path, {{"a", torch::ones({1000})}});
  gclab::io::save_safetensors(path, {{"b", torch::zeros({2})}});
  const auto file = SafetensorsFile::open(path);
  EXPECT_FALSE(file.contains("a"));
  EXPECT_TRUE(torch::equal(file.tensor("b"), torch::zeros({2})));
  fs::remove_all(dir);
}

TEST(Safetensors, ShardedCheckpointLoadsThroughItsIndex) {
  const fs::path dir = fresh_dir("io_shards");
  gclab::io::save_safetensors(dir / "model-00001-of-00002.safetensors", {{"a", torch::ones({2})}});
  gclab::io::save_safetensors(dir / "model-00002-of-00002.safetensors", {{"b", torch::full({3}, 2.0f)}});
  std::ofstream(dir / "model.safetensors.index.json")
      << R"({"metadata": {"total_size": 20}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                                            "b": "model-00002-of-00002.safetensors"}})";
  const auto tensors = gclab::io::load_safetensors(dir / "model.safetensors.index.json");
  ASSERT_EQ(tensors.size(), 2u);
  EXPECT_TRUE(torch::equal(tensors.at("b"), torch::full({3}, 2.0f)));
  std::ofstream(dir / "bad.safetensors.index.json") << R"({"weight_map": {"a": "../../etc/passwd"}})";
  EXPECT_THROW(gclab::io::load_safetensors(dir / "bad.safetensors.index.json"), SafetensorsError);
  fs::remove_all(dir);
}

TEST(Safetensors, CorruptHeadersAreRefusedWithTheReason) {
  const auto ok = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_EQ(error_of(file_with_header(ok, 8)), "");
  EXPECT_NE(error_of("abc").find("truncated"), std::string::npos);
  EXPECT_NE(error_of(file_with_header(ok, 4)).find("outside"), std::string::npos);
  EXPECT_NE(error_of(file_with_header(ok, 12)).find("not indexed"), std::string::npos);
  EXPECT_NE(error_of(file_with_header(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)).find("needs 12"),
            std::string::npos);
  EXPECT_NE(error_of(file_with_header(R"({"w":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", 8)).find("Q4"),
            std::string::npos);
  EXPECT_NE(error_of(file_with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                      R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                      8))
                .find("overlaps"),
            std::string::npos);
  EXPECT_NE(
      error_of(file_with_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8)).find("unindexed"),
      std::string::npos);
  EXPECT_NE(
      error_of(file_with_header(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8)).find("non-negative"),
      std::string::npos);
  EXPECT_NE(error_of(file_with_header(R"({"w":{"dtype":"F64","shape":[4294967296,4294967296,4294967296]},)"
                                      R"("x":1})",
                                      0))
                .find("data_offsets must be"),
            std::string::npos);
  EXPECT_NE(error_of(file_with_header(R"({"w":{"dtype":"U8","shape":[18446744073709551615,2],)"
                                      R"("data_offsets":[0,8]}})",
                                      8))
                .find("overflow"),
            std::string::npos);
  EXPECT_NE(error_of(file_with_header("[1,2]", 0)).find("not a JSON object"), std::string::npos);
  EXPECT_NE(error_of(file_with_header("{\"w\": ", 0)).find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of(file_with_header(std::string(100000, '[') + std::string(100000, ']'), 0)).find("nests"),
            std::string::npos);
  std::string huge(8, '\xff');
  EXPECT_NE(error_of(huge + "{}").find("100 MB"), std::string::npos);
}

TEST(Safetensors, EveryTruncationAndRandomBitFlipIsAnErrorOrAValidFileNeverACrash) {
  const std::string good = gclab::io::serialize_safetensors(sample_tensors(), {{"k", "v"}});
  for (size_t n = 0; n < good.size(); ++n)
    EXPECT_THROW(SafetensorsFile::from_bytes(good.substr(0, n)), SafetensorsError) << "prefix " << n;
  std::mt19937 rng(7);
  int valid = 0;
  for (int round = 0; round < 3000; ++round) {
    std::string bytes = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      // Mostly the length and header, where the structure lives; data bytes cannot make a file invalid.
      const size_t at = rng() % std::min<size_t>(bytes.size(), 8 + 600);
      bytes[at] = static_cast<char>(bytes[at] ^ (1u << (rng() % 8)));
    }
    try {
      const auto file = SafetensorsFile::from_bytes(bytes);
      for (const auto& e : file.entries()) (void)file.tensor(e.name).clone();  // reads every byte: views stay in bounds
      ++valid;
    } catch (const SafetensorsError&) {
    }
  }
  RecordProperty("valid_after_flips", valid);
}

TEST(Safetensors, MissingFilesAndNamesAreClearErrors) {
  try {
    SafetensorsFile::open("/nonexistent/w.safetensors");
    FAIL();
  } catch (const SafetensorsError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/w.safetensors"), std::string::npos);
  }
  const auto file = SafetensorsFile::from_bytes(gclab::io::serialize_safetensors({{"a", torch::ones({1})}}));
  EXPECT_THROW(file.tensor("b"), SafetensorsError);
  EXPECT_THROW(gclab::io::serialize_safetensors({{"a", torch::ones({1})}, {"a", torch::ones({1})}}), SafetensorsError);
  EXPECT_THROW(gclab::io::serialize_safetensors({{"c", torch::ones({1}, torch::kComplexFloat)}}), SafetensorsError);
}

// Files gclab writes open with the reference implementation (huggingface safetensors, in .venv), and
// files it writes open here, bitwise — including bf16 and float8.
TEST(Safetensors, FilesRoundTripThroughTheReferenceImplementation) {
  const fs::path dir = fresh_dir("io_interop");
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& [name, t] : sample_tensors()) tensors.emplace_back(name, t);
  gclab::io::save_safetensors(dir / "ours.safetensors", tensors, {{"format", "pt"}});
  const std::string script =
      "import sys, torch\n"
      "from safetensors.torch import load_file, save_file\n"
      "from safetensors import safe_open\n"
      "d = sys.argv[1]\n"
      "t = load_file(d + '/ours.safetensors')\n"
      "with safe_open(d + '/ours.safetensors', 'pt') as f: assert f.metadata() == {'format': 'pt'}\n"
      "t = {k + '.py': v.clone() for k, v in t.items()}\n"
      "save_file(t, d + '/theirs.safetensors', metadata={'writer': 'python'})\n";
  { std::ofstream(dir / "interop.py") << script; }
  const std::string command =
      std::string("\"") + GCLAB_PYTHON + "\" \"" + (dir / "interop.py").string() + "\" \"" + dir.string() + "\"";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  const auto theirs = SafetensorsFile::open(dir / "theirs.safetensors");
  EXPECT_EQ(theirs.metadata().at("writer"), "python");
  const auto bytes = [](const torch::Tensor& x) { return x.contiguous().reshape({-1}).view(torch::kByte); };
  for (const auto& [name, t] : tensors) {
    const torch::Tensor back = theirs.tensor(name + ".py");
    EXPECT_EQ(back.scalar_type(), t.scalar_type()) << name;
    EXPECT_EQ(back.sizes(), t.sizes()) << name;
    EXPECT_TRUE(torch::equal(bytes(back), bytes(t))) << name;
  }
  fs::remove_all(dir);
}

namespace gclab::io {
namespace {

// Shards as diffusers writes them: tensors in order, a new shard when the next would overflow, an index
// with the weight map; reading the index gives every tensor back.
TEST(Safetensors, ShardedSaveWritesDiffusersShardsAndAnIndexThatReadsBack) {
  const auto dir = std::filesystem::temp_directory_path() / ("gclab_shards_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (int i = 0; i < 5; ++i) tensors.emplace_back("block." + std::to_string(i) + ".weight", torch::randn({64, 64}));
  // 16 KiB a tensor, at most 40 KiB a shard: two a shard, three shards.
  const auto files = save_sharded_safetensors(dir, "diffusion_pytorch_model", tensors, 40 << 10);
  ASSERT_EQ(files.size(), 4u);
  EXPECT_EQ(files[0].filename(), "diffusion_pytorch_model-00001-of-00003.safetensors");
  EXPECT_EQ(files[3].filename(), "diffusion_pytorch_model.safetensors.index.json");
  const auto loaded = load_safetensors(files[3]);
  ASSERT_EQ(loaded.size(), 5u);
  for (const auto& [name, t] : tensors) EXPECT_TRUE(torch::equal(loaded.at(name), t)) << name;
  // Everything in one shard: one file, no index.
  const auto single = save_sharded_safetensors(dir / "one", "diffusion_pytorch_model", tensors);
  ASSERT_EQ(single.size(), 1u);
  EXPECT_EQ(single[0].filename(), "diffusion_pytorch_model.safetensors");
  std::filesystem::remove_all(dir);
}

}  // namespace
// SHA-256 (io/sha256.h) against FIPS 180-4's examples: one block, the two-block padding edge (56 bytes),
// the empty string, and a million bytes.
TEST(Sha256, MatchesTheStandardsExamples) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

}  // namespace gclab::io
