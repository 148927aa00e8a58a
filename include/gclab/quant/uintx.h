// AI Toolkit's uint2 ... uint7 weight storage (`qtype: uintN`, toolkit/util/uintx_quant.py: a bit-exact
// reimplementation of torchao 0.10's UIntXWeightOnlyConfig), reproduced step for step:
//   per output row, groups of 64 input features; in the weight's own dtype (usually bf16):
//     min / max of the group, widened to include 0 (preserve_zero)
//     scale      = (max - min) / (2^N - 1), at least float32's epsilon
//     zero_point = clamp(0 - round(min / scale), 0, 2^N - 1)                       (int)
//     code       = clamp(round(w * (1 / scale)) + zero_point, 0, 2^N - 1)          (uint8)
//   codes packed in power-of-two bit shards (uint3 = a 2-bit shard then a 1-bit shard; 8 / k codes a
//   byte, code j of a byte in bits [j k, j k + k), the shard's codes split into 8 / k contiguous chunks);
//   the scale kept in the weight's dtype, the zero point in a byte per group.
//   dequantize: (code - zero_point) * scale, in the weight's dtype.
// A Linear whose in_features is not a multiple of 64 is left unquantized, as is every Linear for uint8
// (torchao 0.10 could not pack 8 bits; AI Toolkit keeps that behaviour).
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace gclab::quant {

constexpr int64_t kUIntXGroupSize = 64;

struct UIntXWeight {
  int bits = 0;
  int64_t out_features = 0, in_features = 0, group_size = kUIntXGroupSize;
  torch::Tensor packed;      // uint8, the shards one after the other
  torch::Tensor scale;       // [out, groups], the weight's dtype
  torch::Tensor zero_point;  // [out, groups], uint8
  int64_t bytes() const;     // what is held: packed codes, scales, zero points
};

// Whether AI Toolkit quantizes a Linear of this width to `bits` (2..7 and in_features % 64 == 0).
bool uintx_quantizes(int bits, int64_t in_features, int64_t group_size = kUIntXGroupSize);
// The weight [out, in] quantized as above (on its device, in its dtype). Requires uintx_quantizes.
UIntXWeight quantize_uintx(const torch::Tensor& weight, int bits, int64_t group_size = kUIntXGroupSize);
// The weight back, [out, in], in the dtype it was quantized from.
torch::Tensor dequantize_uintx(const UIntXWeight& q);
// Codes (values < 2^bits, any shape) packed into shards; and back, `numel` codes.
torch::Tensor pack_uintx(const torch::Tensor& codes, int bits);
torch::Tensor unpack_uintx(const torch::Tensor& packed, int bits, int64_t numel);
// The packed codes' bytes for `numel` codes of `bits`.
int64_t uintx_packed_bytes(int64_t numel, int bits);
// The bytes an [out, in] weight takes as uint`bits` with a `dtype_bytes`-byte scale per group.
int64_t uintx_bytes(int64_t out_features, int64_t in_features, int bits, int64_t dtype_bytes,
                    int64_t group_size = kUIntXGroupSize);
// The most quantize_uintx holds at once beyond its input (the function itself run on a meta weight under a
// memory::MetaCount: the packing's shards included), the result included.
int64_t quantize_uintx_peak_bytes(int64_t out_features, int64_t in_features, int bits, c10::ScalarType dtype,
                                  int64_t group_size = kUIntXGroupSize);

}  // namespace gclab::quant
