// AI Toolkit's uint2..uint7 storage (quant/uintx.h) against a torch-only Python reference written from
// the same documented steps (tests/reference/uintx_reference.py): packed bytes, scales, zero points and
// dequantized weights bit for bit, bf16 and float32; the codes round-trip through the packing; the bytes
// held equal the formula; the widths AI Toolkit leaves unquantized are refused.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>

#include "../support/test_util.h"
#include "gclab/io/safetensors.h"
#include "gclab/quant/uintx.h"

namespace gclab::quant {
namespace {

namespace fs = std::filesystem;

TEST(UIntX, PackingRoundTripsEveryWidth) {
  torch::manual_seed(0);
  for (int bits = 1; bits <= 8; ++bits)
    for (int64_t n : {1, 7, 64, 1000}) {
      const torch::Tensor codes = torch::randint(0, 1 << bits, {n}, torch::kByte);
      const torch::Tensor packed = pack_uintx(codes, bits);
      EXPECT_TRUE(torch::equal(unpack_uintx(packed, bits, n), codes)) << bits << " bits, " << n;
    }
  // uint3 = a 2-bit shard (4 codes a byte) then a 1-bit shard (8 a byte): 64 codes in 16 + 8 bytes.
  EXPECT_EQ(pack_uintx(torch::zeros({64}, torch::kByte), 3).numel(), 24);
}

TEST(UIntX, BytesHeldEqualTheFormula) {
  torch::manual_seed(1);
  for (int bits = 2; bits <= 7; ++bits) {
    const torch::Tensor w = torch::randn({96, 256}).to(torch::kBFloat16);
    const UIntXWeight q = quantize_uintx(w, bits);
    EXPECT_EQ(q.bytes(), uintx_bytes(96, 256, bits, 2)) << bits;
    EXPECT_EQ(q.scale.sizes(), (std::vector<int64_t>{96, 4}));
  }
  // uint3 at FLUX.1-dev's 3072 x 3072 attention projection: 3/8 byte a weight, a bf16 scale and a byte
  // of zero point per 64 — 0.42 byte a weight against bf16's 2.
  EXPECT_EQ(uintx_bytes(3072, 3072, 3, 2), 3072 * 3072 * 3 / 8 + 3072 * 48 * 3);
  EXPECT_FALSE(uintx_quantizes(3, 100));  // not a multiple of 64: left in its dtype
  EXPECT_FALSE(uintx_quantizes(8, 128));  // uint8: AI Toolkit leaves every layer unquantized
  EXPECT_TRUE(uintx_quantizes(2, 128));
  EXPECT_THROW(quantize_uintx(torch::randn({4, 100}), 3), c10::Error);
}

TEST(UIntX, MatchesTheReferenceBitForBit) {
  const fs::path dir = testing::fresh_dir("uintx_reference");
  torch::manual_seed(2);
  std::vector<std::pair<std::string, torch::Tensor>> weights = {
      {"w.bf16", (torch::randn({24, 192}) * 0.05).to(torch::kBFloat16)},
      {"w.fp32", torch::randn({8, 128})},
      // all-positive and all-negative groups (preserve_zero widens them to 0), a constant group, zeros
      {"w.edges", torch::cat({torch::rand({2, 64}) + 1, -torch::rand({2, 64}) - 1, torch::full({2, 64}, 0.25),
                              torch::zeros({2, 64})})
                      .view({4, 128})
                      .to(torch::kBFloat16)}};
  io::save_safetensors(dir / "in.safetensors", weights);
  const std::string command = std::string("\"") + GCLAB_PYTHON + "\" \"" + GCLAB_SOURCE_DIR +
                              "/tests/reference/uintx_reference.py\" \"" + (dir / "in.safetensors").string() + "\" \"" +
                              (dir / "ref.safetensors").string() + "\"";
  const int rc = std::system(command.c_str());
  if (WEXITSTATUS(rc) == 77) GTEST_SKIP() << "no torch in the reference venv";
  ASSERT_EQ(rc, 0) << command;
  const auto ref = io::SafetensorsFile::open(dir / "ref.safetensors");
  for (const auto& [key, w] : weights) {
    const std::string name = key.substr(2);
    for (int bits = 2; bits <= 7; ++bits) {
      const std::string tag = name + "." + std::to_string(bits);
      const UIntXWeight q = quantize_uintx(w, bits);
      EXPECT_TRUE(torch::equal(q.packed, ref.tensor("packed." + tag))) << tag;
      EXPECT_TRUE(torch::equal(q.scale, ref.tensor("scale." + tag))) << tag;
      EXPECT_TRUE(torch::equal(q.zero_point, ref.tensor("zero_point." + tag))) << tag;
      const torch::Tensor dq = dequantize_uintx(q);
      EXPECT_EQ(dq.scalar_type(), w.scalar_type()) << tag;
      EXPECT_TRUE(torch::equal(dq, ref.tensor("dequantized." + tag))) << tag;
      // Within a step of the group's scale (half a step of rounding, and w * (1 / scale) itself rounded in
      // the weight's dtype, as is the product (code - zero point) * scale: bf16 keeps 8 bits).
      const torch::Tensor step = q.scale.to(torch::kFloat).repeat_interleave(kUIntXGroupSize, 1);
      const torch::Tensor error = (dq.to(torch::kFloat) - w.to(torch::kFloat)).abs() / step;
      EXPECT_LE(error.max().item<double>(), w.scalar_type() == torch::kFloat ? 0.5001 : 1.01) << tag;
    }
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gclab::quant
