#include "gclab/quant/scaled.h"

#include "gclab/memory/meta_count.h"

#include <limits>

namespace gclab::quant {

namespace {

constexpr double kE4m3Max = 448.0;  // torch.finfo(torch.float8_e4m3fn).max

// |w|: LibTorch's C++ has no meta kernel for abs, whose output is w's shape (quantize_scaled_peak_bytes
// walks this function on meta).
torch::Tensor magnitude(const torch::Tensor& w) { return w.is_meta() ? torch::empty_like(w) : w.abs(); }

}  // namespace

int64_t ScaledWeight::bytes() const {
  int64_t b = static_cast<int64_t>(data.nbytes() + scale.nbytes());
  if (zero_point.defined()) b += static_cast<int64_t>(zero_point.nbytes());
  return b;
}

ScaledWeight quantize_scaled(const torch::Tensor& w, ScaledType type) {
  TORCH_CHECK(w.dim() == 2 && w.is_floating_point(), "a scaled weight is a 2-D float tensor, got ", w.sizes());
  torch::NoGradGuard no_grad;
  ScaledWeight q;
  q.type = type;
  q.dtype = w.scalar_type();
  switch (type) {
    case ScaledType::qfloat8: {
      q.scale = magnitude(w).amax({1}, /*keepdim=*/true) / kE4m3Max;
      q.data = torch::clamp(w / q.scale, -kE4m3Max, kE4m3Max).to(torch::kFloat8_e4m3fn);
      break;
    }
    case ScaledType::float8: {
      q.scale = (magnitude(w).amax({1}, /*keepdim=*/true) / kE4m3Max).to(torch::kFloat);
      q.data = torch::clamp(w.to(torch::kFloat) / q.scale, -kE4m3Max, kE4m3Max).to(torch::kFloat8_e4m3fn);
      break;
    }
    case ScaledType::int8: {
      const torch::Tensor lo = torch::min(w.amin({1}, true), torch::zeros({1}, w.options()));
      const torch::Tensor hi = torch::max(w.amax({1}, true), torch::zeros({1}, w.options()));
      const torch::Tensor top = torch::max(-lo, hi);
      q.scale = torch::clamp(top / 127.5, std::numeric_limits<float>::epsilon());
      q.zero_point = torch::zeros(q.scale.sizes(), w.options().dtype(torch::kLong));
      q.data = torch::clamp(torch::round(w * (1.0 / q.scale)) + q.zero_point, -128, 127).to(torch::kChar);
      break;
    }
  }
  return q;
}

ScaledWeight empty_scaled(int64_t out, int64_t in, ScaledType type, const torch::TensorOptions& options) {
  ScaledWeight q;
  q.type = type;
  q.dtype = options.dtype().toScalarType();
  q.data = torch::empty({out, in}, options.dtype(type == ScaledType::int8 ? torch::kChar : torch::kFloat8_e4m3fn));
  q.scale = torch::empty({out, 1}, type == ScaledType::float8 ? options.dtype(torch::kFloat) : options);
  if (type == ScaledType::int8) q.zero_point = torch::empty({out, 1}, options.dtype(torch::kLong));
  return q;
}

torch::Tensor dequantize_scaled(const ScaledWeight& q) {
  switch (q.type) {
    case ScaledType::qfloat8:
      return q.scale * q.data.to(q.scale.scalar_type());
    case ScaledType::float8:
      return (q.data.to(torch::kFloat) * q.scale).to(q.dtype);
    case ScaledType::int8:
      return (q.data.to(torch::kInt) - q.zero_point.to(torch::kInt)).to(q.dtype) * q.scale;
  }
  return {};
}

torch::Tensor scaled_matmul(const torch::Tensor& x, const ScaledWeight& q) {
  if (q.type != ScaledType::int8) return torch::matmul(x, dequantize_scaled(q).to(x.scalar_type()).t());
  // torchao's _linear_fp_act_int8_weight_impl: the int8 codes in x's dtype, the scale on the output.
  const torch::Tensor m = torch::mm(x.reshape({-1, x.size(-1)}), q.data.t().to(x.scalar_type()));
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end() - 1);
  shape.push_back(q.data.size(0));
  return (m * q.scale.view({1, -1}).to(m.scalar_type())).reshape(shape);
}

int64_t quantize_scaled_peak_bytes(int64_t out, int64_t in, ScaledType type, c10::ScalarType dtype) {
  const torch::Tensor w = torch::empty({out, in}, torch::TensorOptions().device(torch::kMeta).dtype(dtype));
  return memory::inference_peak(memory::meta_target(), [&] { quantize_scaled(w, type); });
}

}  // namespace gclab::quant
