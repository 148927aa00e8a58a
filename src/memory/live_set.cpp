#include "gclab/memory/live_set.h"

#include <ATen/cpu/Utils.h>

#include <algorithm>

namespace gclab::memory {

int64_t cpu_flash_attention_temporaries(int64_t batch_heads, int64_t q_len, int64_t kv_len, int64_t head_dim,
                                        int threads, int64_t dtype_bytes) {
  const int64_t q_split = std::min<int64_t>(q_len, q_len >= 768 ? 256 : q_len >= 192 ? 64 : 32);
  const int64_t kv_split = std::min<int64_t>(kv_len, 512);
  const int64_t per_thread = q_split * kv_split + 2 * q_split + q_split * head_dim;
  const int64_t reduced = dtype_bytes < 4 ? q_split * kv_split * dtype_bytes : 0;
  return threads * (4 * per_thread + reduced) + 4 * batch_heads * q_len;
}

int64_t cpu_conv_temporaries(int64_t batch, int64_t in_c, int64_t out_c, int64_t in_spatial, int64_t out_spatial,
                             int64_t volume, int64_t dtype_bytes, int64_t channel_block, bool im2col) {
  if (volume == 1) return 0;
  if (dtype_bytes == 2 && im2col) return batch * in_c * volume * out_spatial * dtype_bytes;
  const int64_t block = channel_block;
  auto padded = [&](int64_t c) { return (c + block - 1) / block * block; };
  const int64_t out_bytes = batch * out_c * out_spatial * dtype_bytes;
  const int64_t out_padded = batch * padded(out_c) * out_spatial * dtype_bytes;
  if (in_c < block) return out_padded + out_bytes;
  const bool whole = out_c % block == 0;
  const int64_t in_padded = batch * padded(in_c) * in_spatial * dtype_bytes;
  const int64_t weight = in_c * (whole ? out_c : padded(out_c)) * volume * dtype_bytes;
  return std::max(in_padded + weight + (whole ? out_bytes : out_padded), whole ? 0 : out_padded + out_bytes);
}

int cpu_channel_block() {
  static const int block = cpu_has("avx512_f") ? 16 : 8;
  return block;
}

bool cpu_has(const char* flag) {
  static const auto caps = at::cpu::get_cpu_capabilities();
  const auto it = caps.find(flag);
  return it != caps.end() && it->second.isBool() && it->second.toBool();
}

bool cpu_onednn_bf16() {
  static const bool onednn = cpu_has("avx512_bw") && cpu_has("avx512_vl") && cpu_has("avx512_dq");
  return onednn;
}

}  // namespace gclab::memory
