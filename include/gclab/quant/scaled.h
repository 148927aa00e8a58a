// The 8-bit weight storages AI Toolkit's model.qtype selects besides its packed uintN (toolkit/util/
// quantize.py), each as its library builds it, step for step in the same dtypes:
//
//   qfloat8 (optimum-quanto: quantize_weight(w, qfloat8_e4m3fn, axis=0) with its AbsmaxOptimizer and
//            SymmetricQuantizer): per output row, in the weight's dtype,
//              scale = amax(|w|, row) / 448;   data = clamp(w / scale, -448, 448) -> float8_e4m3fn
//            used as scale * data (in the scale's dtype) — quanto's qbytes_mm.
//   float8  (torchao 0.10 Float8WeightOnlyConfig: per-row block, choose_qparams_affine_float8 /
//            quantize_affine_float8):
//              scale = (amax(|w|, row) / 448 in the weight's dtype) -> float32
//              data  = clamp(float32(w) / scale, -448, 448) -> float8_e4m3fn
//            used as (float32(data) * scale) -> the weight's dtype, then F.linear.
//   int8    (torchao 0.10 Int8WeightOnlyConfig: symmetric, block (1, in), eps = float32 eps, int64 zero
//            point): per row, in the weight's dtype,
//              scale = clamp(max(-min(w, 0), max(w, 0)) / 127.5, eps)   zero_point = 0 (int64)
//              data  = clamp(round(w * (1 / scale)) + zero_point, -128, 127) -> int8
//            used as torchao's weight-only int8 matmul: (x @ data^T in x's dtype) * scale.
// A zero row gives quanto and torchao's float8 a zero scale (0 / 0: NaN codes); gclab keeps that too.
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace gclab::quant {

enum class ScaledType { qfloat8, float8, int8 };

struct ScaledWeight {
  ScaledType type = ScaledType::qfloat8;
  torch::Tensor data;                       // [out, in]: float8_e4m3fn, or int8
  torch::Tensor scale;                      // [out, 1]: the weight's dtype (qfloat8, int8) or float32 (float8)
  torch::Tensor zero_point;                 // [out, 1] int64 (int8 only)
  torch::ScalarType dtype = torch::kFloat;  // the weight's dtype: what it dequantizes to
  int64_t bytes() const;
};

ScaledWeight quantize_scaled(const torch::Tensor& w, ScaledType type);
// Shapes only (the meta device): what quantize_scaled would hold for a [out, in] weight of `options`.
ScaledWeight empty_scaled(int64_t out, int64_t in, ScaledType type, const torch::TensorOptions& options);
// The weight as the library rebuilds it, in the weight's dtype.
torch::Tensor dequantize_scaled(const ScaledWeight& q);
// y = x W^T as the library's linear computes it for a weight-only quantized weight (no bias).
torch::Tensor scaled_matmul(const torch::Tensor& x, const ScaledWeight& q);

// The most quantize_scaled holds at once beyond its input, for a [out, in] weight of `dtype`: the function
// itself run on a meta weight under a memory::MetaCount, the result included. What quantizing a model's
// Linears one at a time adds on top of the weights (a load's peak).
int64_t quantize_scaled_peak_bytes(int64_t out, int64_t in, ScaledType type, c10::ScalarType dtype);

}  // namespace gclab::quant
