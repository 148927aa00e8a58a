// What quantizing one weight holds at its highest (quant::quantize_scaled_peak_bytes,
// quantize_uintx_peak_bytes: the functions themselves walked on the meta device) against the tracking
// allocator, for every
// storage, bf16 and float32, shapes with and without padding in the packed shards. A model's load adds this
// on top of its weights, one Linear at a time.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "gclab/memory/tracker.h"
#include "gclab/quant/scaled.h"
#include "gclab/quant/uintx.h"

namespace gclab::quant {
namespace {

// The peak above what was live when fn started, its result kept until the peak is read.
template <typename F>
int64_t measured_peak(memory::CpuMemoryTracker& tracker, F&& fn) {
  const int64_t before = tracker.stats().live_bytes;
  tracker.reset_peak();
  auto result = fn();
  return tracker.stats().peak_bytes - before;
}

// ATen wraps each Scalar operand (/ 448, * 1.0, shifts) in a one-element tensor for an instant.
constexpr int64_t kScalarSlack = 64;

TEST(QuantizeMemory, ScaledPeakIsWhatTheAllocatorMeasures) {
  memory::CpuMemoryTracker tracker;
  for (auto dtype : {torch::kBFloat16, torch::kFloat})
    for (auto [out, in] : {std::pair<int64_t, int64_t>{96, 256}, {130, 72}})
      for (ScaledType t : {ScaledType::qfloat8, ScaledType::float8, ScaledType::int8}) {
        const torch::Tensor w = torch::randn({out, in}).to(dtype);
        const int64_t measured = measured_peak(tracker, [&] { return quantize_scaled(w, t); });
        const int64_t predicted = quantize_scaled_peak_bytes(out, in, t, dtype);
        EXPECT_LE(predicted, measured) << static_cast<int>(t) << " " << dtype << " " << out << "x" << in;
        EXPECT_LE(measured, predicted + kScalarSlack) << static_cast<int>(t) << " " << dtype << " " << out << "x" << in;
      }
}

TEST(QuantizeMemory, UIntXPeakIsWhatTheAllocatorMeasures) {
  memory::CpuMemoryTracker tracker;
  for (auto dtype : {torch::kBFloat16, torch::kFloat})
    for (auto [out, in] : {std::pair<int64_t, int64_t>{96, 256}, {37, 192}})
      for (int bits = 2; bits <= 7; ++bits) {
        const torch::Tensor w = torch::randn({out, in}).to(dtype);
        const int64_t measured = measured_peak(tracker, [&] { return quantize_uintx(w, bits); });
        const int64_t predicted = quantize_uintx_peak_bytes(out, in, bits, dtype);
        EXPECT_LE(predicted, measured) << "uint" << bits << " " << dtype << " " << out << "x" << in;
        EXPECT_LE(measured, predicted + kScalarSlack) << "uint" << bits << " " << dtype << " " << out << "x" << in;
      }
}

}  // namespace
}  // namespace gclab::quant
