#include "gclab/memory/live_set.h"

#include <ATen/cpu/Utils.h>

namespace gclab::memory {

int64_t cpu_flash_attention_temporaries(int64_t batch_heads, int64_t q_len, int64_t kv_len, int64_t head_dim,
                                        int threads, int64_t dtype_bytes) {
  const int64_t q_split = std::min<int64_t>(q_len, q_len >= 768 ? 256 : q_len >= 192 ? 64 : 32);
  const int64_t kv_split = std::min<int64_t>(kv_len, 512);
  const int64_t per_thread = q_split * kv_split + 2 * q_split + q_split * head_dim;
  const int64_t reduced = dtype_bytes < 4 ? q_split * kv_split * dtype_bytes : 0;
  return threads * (4 * per_thread + reduced) + 4 * batch_heads * q_len;
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
