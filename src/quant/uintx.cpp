#include "gclab/quant/uintx.h"

#include "gclab/memory/meta_count.h"

#include <limits>
#include <vector>

namespace gclab::quant {

namespace {

// The shard widths a code of `bits` splits into, lowest bits first.
std::vector<int> shards_of(int bits) {
  std::vector<int> out;
  for (int k : {8, 4, 2, 1})
    if (bits & k) out.push_back(k);
  return out;
}

int64_t shard_bytes(int64_t numel, int k) {
  const int64_t per_byte = 8 / k;
  return (numel + per_byte - 1) / per_byte;
}

// Values < 2^k, flat uint8: 8 / k of them a byte, in 8 / k contiguous chunks (chunk j in bits [j k, j k + k)).
torch::Tensor pack_shard(torch::Tensor values, int k) {
  const int64_t per_byte = 8 / k;
  if (per_byte == 1) return values.clone();
  const int64_t pad = (per_byte - values.numel() % per_byte) % per_byte;
  if (pad) values = torch::cat({values, torch::zeros({pad}, values.options())});
  const torch::Tensor chunks = values.view({per_byte, -1});
  torch::Tensor out = chunks[0].clone();
  for (int64_t j = 1; j < per_byte; ++j) out.bitwise_or_(chunks[j].bitwise_left_shift(j * k));
  return out;
}

torch::Tensor unpack_shard(const torch::Tensor& packed, int k, int64_t numel) {
  const int64_t per_byte = 8 / k;
  if (per_byte == 1) return packed.slice(0, 0, numel).clone();
  torch::Tensor out = torch::empty({per_byte, packed.numel()}, packed.options());
  for (int64_t j = 0; j < per_byte; ++j) out[j].copy_(packed.bitwise_right_shift(j * k));
  out.bitwise_and_((1 << k) - 1);
  return out.view({-1}).slice(0, 0, numel);
}

}  // namespace

bool uintx_quantizes(int bits, int64_t in_features, int64_t group_size) {
  return bits >= 2 && bits <= 7 && group_size > 0 && in_features % group_size == 0;
}

torch::Tensor pack_uintx(const torch::Tensor& codes, int bits) {
  const torch::Tensor flat = codes.flatten().to(torch::kByte);
  std::vector<torch::Tensor> shards;
  int offset = 0;
  for (int k : shards_of(bits)) {
    shards.push_back(pack_shard(k == bits ? flat : flat.bitwise_right_shift(offset).bitwise_and((1 << k) - 1), k));
    offset += k;
  }
  return shards.size() == 1 ? shards[0] : torch::cat(shards);
}

torch::Tensor unpack_uintx(const torch::Tensor& packed, int bits, int64_t numel) {
  torch::Tensor out;
  int offset = 0;
  int64_t at = 0;
  for (int k : shards_of(bits)) {
    const int64_t n = shard_bytes(numel, k);
    torch::Tensor values = unpack_shard(packed.slice(0, at, at + n), k, numel);
    out = out.defined() ? out.bitwise_or(values.bitwise_left_shift(offset)) : values;
    offset += k;
    at += n;
  }
  return out;
}

UIntXWeight quantize_uintx(const torch::Tensor& w, int bits, int64_t group_size) {
  TORCH_CHECK(w.dim() == 2 && uintx_quantizes(bits, w.size(1), group_size), "uint", bits,
              " quantizes [out, in] weights with in a multiple of ", group_size, ", got ", w.sizes());
  torch::NoGradGuard no_grad;
  UIntXWeight q;
  q.bits = bits, q.out_features = w.size(0), q.in_features = w.size(1), q.group_size = group_size;
  const int64_t groups = q.in_features / group_size;
  const double qmax = static_cast<double>((1 << bits) - 1);
  const torch::Tensor wv = w.contiguous().view({q.out_features, groups, group_size});
  // Every step in the weight's dtype, as torchao computed it.
  const torch::Tensor min_neg = torch::minimum(wv.amin(2), torch::zeros({}, w.options()));
  const torch::Tensor max_pos = torch::maximum(wv.amax(2), torch::zeros({}, w.options()));
  torch::Tensor scale = (max_pos - min_neg) / qmax;
  scale = torch::clamp_min(scale, static_cast<double>(std::numeric_limits<float>::epsilon()));
  torch::Tensor zero_point = torch::rsub(torch::round(min_neg / scale), 0);
  zero_point = torch::clamp(zero_point, 0, qmax).to(torch::kInt);
  const torch::Tensor inverse = torch::reciprocal(scale) * 1.0;  // Python's 1.0 / scale
  const torch::Tensor codes = torch::clamp(torch::round(wv * inverse.view({q.out_features, groups, 1})) +
                                               zero_point.view({q.out_features, groups, 1}),
                                           0, qmax)
                                  .view({q.out_features, q.in_features})
                                  .to(torch::kByte);
  q.packed = pack_uintx(codes, bits);
  q.scale = scale.contiguous();
  q.zero_point = zero_point.to(torch::kByte);
  return q;
}

torch::Tensor dequantize_uintx(const UIntXWeight& q) {
  const int64_t groups = q.in_features / q.group_size;
  torch::Tensor dq = unpack_uintx(q.packed, q.bits, q.out_features * q.in_features)
                         .view({q.out_features, groups, q.group_size})
                         .to(q.scale.scalar_type());
  dq.sub_(q.zero_point.to(q.scale.scalar_type()).view({q.out_features, groups, 1}));
  dq.mul_(q.scale.view({q.out_features, groups, 1}));
  return dq.view({q.out_features, q.in_features});
}

int64_t uintx_packed_bytes(int64_t numel, int bits) {
  int64_t packed = 0;
  for (int k : shards_of(bits)) packed += shard_bytes(numel, k);
  return packed;
}

int64_t uintx_bytes(int64_t out_features, int64_t in_features, int bits, int64_t dtype_bytes, int64_t group_size) {
  const int64_t groups = out_features * (in_features / group_size);
  return uintx_packed_bytes(out_features * in_features, bits) + groups * dtype_bytes + groups;
}

int64_t UIntXWeight::bytes() const {
  return static_cast<int64_t>(packed.nbytes() + scale.nbytes() + zero_point.nbytes());
}

int64_t quantize_uintx_peak_bytes(int64_t out_features, int64_t in_features, int bits, c10::ScalarType dtype,
                                  int64_t group_size) {
  const torch::Tensor w =
      torch::empty({out_features, in_features}, torch::TensorOptions().device(torch::kMeta).dtype(dtype));
  return memory::inference_peak(memory::meta_target(), [&] { quantize_uintx(w, bits, group_size); });
}

}  // namespace gclab::quant
