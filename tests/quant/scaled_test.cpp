// qfloat8 (optimum-quanto), float8 and int8 (torchao weight-only), as AI Toolkit's qtype stores them
// (quant/scaled.h), against a torch-only Python reference written from each library's steps
// (tests/reference/scaled_reference.py): codes, scales, zero points, dequantized weights and the linear's
// output bit for bit, bf16 and float32; the bytes held equal the formula.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>

#include "../support/test_util.h"
#include "gclab/io/safetensors.h"
#include "gclab/quant/scaled.h"

namespace gclab::quant {
namespace {

namespace fs = std::filesystem;

const char* name_of(ScaledType t) {
  return t == ScaledType::qfloat8 ? "qfloat8" : t == ScaledType::float8 ? "float8" : "int8";
}

TEST(Scaled, BytesHeldEqualTheFormula) {
  torch::manual_seed(1);
  const torch::Tensor w = torch::randn({96, 256}).to(torch::kBFloat16);
  // A byte a weight, and per output row: quanto's bf16 scale; torchao float8's float32 scale; torchao
  // int8's bf16 scale and int64 zero point.
  EXPECT_EQ(quantize_scaled(w, ScaledType::qfloat8).bytes(), 96 * 256 + 96 * 2);
  EXPECT_EQ(quantize_scaled(w, ScaledType::float8).bytes(), 96 * 256 + 96 * 4);
  EXPECT_EQ(quantize_scaled(w, ScaledType::int8).bytes(), 96 * 256 + 96 * (2 + 8));
  for (ScaledType t : {ScaledType::qfloat8, ScaledType::float8, ScaledType::int8}) {
    const ScaledWeight meta =
        empty_scaled(96, 256, t, torch::TensorOptions().device(torch::kMeta).dtype(torch::kBFloat16));
    EXPECT_EQ(meta.bytes(), quantize_scaled(w, t).bytes()) << name_of(t);
  }
}

TEST(Scaled, MatchesTheReferenceBitForBit) {
  const fs::path dir = testing::fresh_dir("scaled_reference");
  torch::manual_seed(2);
  // all-positive and all-negative rows, a constant row, small values (float8 subnormals), outliers
  const torch::Tensor edges = torch::cat({torch::rand({1, 64}) + 1, -torch::rand({1, 64}) - 1,
                                          torch::full({1, 64}, 0.25), torch::randn({1, 64}) * 1e-4,
                                          torch::randn({1, 64}) * torch::where(torch::rand({1, 64}) > 0.9, 50.0, 1.0)});
  std::vector<std::pair<std::string, torch::Tensor>> tensors = {
      {"w.bf16", (torch::randn({24, 96}) * 0.05).to(torch::kBFloat16)},
      {"x.bf16", torch::randn({2, 3, 96}).to(torch::kBFloat16)},
      {"w.fp32", torch::randn({8, 32})},
      {"x.fp32", torch::randn({5, 32})},
      {"w.edges", edges.to(torch::kBFloat16)},
      {"x.edges", torch::randn({4, 64}).to(torch::kBFloat16)}};
  io::save_safetensors(dir / "in.safetensors", tensors);
  const std::string command = std::string("\"") + GCLAB_PYTHON + "\" \"" + GCLAB_SOURCE_DIR +
                              "/tests/reference/scaled_reference.py\" \"" + (dir / "in.safetensors").string() +
                              "\" \"" + (dir / "ref.safetensors").string() + "\"";
  const int rc = std::system(command.c_str());
  if (WEXITSTATUS(rc) == 77) GTEST_SKIP() << "no torch in the reference venv";
  ASSERT_EQ(rc, 0) << command;
  const auto ref = io::SafetensorsFile::open(dir / "ref.safetensors");
  std::map<std::string, torch::Tensor> in(tensors.begin(), tensors.end());
  for (const std::string name : {"bf16", "fp32", "edges"}) {
    const torch::Tensor& w = in.at("w." + name);
    for (ScaledType t : {ScaledType::qfloat8, ScaledType::float8, ScaledType::int8}) {
      const std::string tag = name + "." + name_of(t);
      const ScaledWeight q = quantize_scaled(w, t);
      // float8 codes compared as their bytes (equal() compares values; -0 and 0 would pass)
      EXPECT_TRUE(torch::equal(q.data.view(torch::kByte), ref.tensor("data." + tag).view(torch::kByte))) << tag;
      EXPECT_TRUE(torch::equal(q.scale, ref.tensor("scale." + tag))) << tag;
      if (t == ScaledType::int8) {
        EXPECT_TRUE(torch::equal(q.zero_point, ref.tensor("zero_point." + tag))) << tag;
      }
      const torch::Tensor dq = dequantize_scaled(q);
      EXPECT_EQ(dq.scalar_type(), w.scalar_type()) << tag;
      EXPECT_TRUE(torch::equal(dq, ref.tensor("dequantized." + tag))) << tag;
      // The product's own rounding is the BLAS kernel's (MKL's sgemm picks its path by CPU and by the operands'
      // alignment: float32 products differ in the last bit between processes on some CPUs), so it is held to
      // float32 rounding; the codes, scales and dequantized weights above are bit for bit.
      const torch::Tensor y = scaled_matmul(in.at("x." + name), q), y_ref = ref.tensor("y." + tag);
      if (y.scalar_type() == torch::kFloat)
        EXPECT_TRUE(torch::allclose(y, y_ref, 1e-6, 1e-6)) << tag << ": " << (y - y_ref).abs().max().item<float>();
      else
        EXPECT_TRUE(torch::equal(y, y_ref)) << tag;
      // e4m3 keeps 3 mantissa bits (a relative step of 1/8 at most, 1/16 after rounding); int8 a step of
      // the row's largest magnitude / 127.5 (w * (1 / scale) is itself rounded in bf16 before the round),
      // plus bf16's own rounding of the code times the scale.
      const torch::Tensor err = (dq.to(torch::kFloat) - w.to(torch::kFloat)).abs();
      const torch::Tensor row = w.to(torch::kFloat).abs().amax({1}, true);
      const double bound = t == ScaledType::int8 ? 1.0 / 127.5 + 1.0 / 256.0 : 1.0 / 16.0;
      EXPECT_TRUE((err <= row * bound + 1e-6).all().item<bool>()) << tag;
    }
  }
}

}  // namespace
}  // namespace gclab::quant
