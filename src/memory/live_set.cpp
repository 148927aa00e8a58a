#include "gclab/memory/live_set.h"

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

int64_t cpu_flash_attention_backward_temporaries(int64_t q_len, int64_t kv_len, int threads, int64_t dtype_bytes) {
  const int64_t q_split = std::min<int64_t>(q_len, q_len >= 768 ? 256 : q_len >= 192 ? 64 : 32);
  const int64_t kv_split = std::min<int64_t>(kv_len, 512);
  const int64_t blocks = 2 * q_split * kv_split;
  return threads * (4 * blocks + (dtype_bytes < 4 ? blocks * dtype_bytes : 0) + 4 * q_split);
}

namespace {

int64_t product(const std::vector<int64_t>& v) {
  int64_t n = 1;
  for (int64_t x : v) n *= x;
  return n;
}

// oneDNN's blocked copies beside the output (cpu_convolution_temporaries).
int64_t onednn_temporaries(const CpuConvolution& c, int64_t volume, int threads) {
  const int64_t block = cpu_channel_block(), d = c.dtype_bytes;
  const int64_t in_spatial = product(c.in_sizes), out_spatial = product(c.out_sizes);
  auto padded = [&](int64_t channels) { return (channels + block - 1) / block * block; };
  const int64_t out_bytes = c.batch * c.out_c * out_spatial * d;
  const int64_t out_padded = c.batch * padded(c.out_c) * out_spatial * d;
  const int64_t in_padded = c.batch * padded(c.in_c) * in_spatial * d;
  if (volume == 1) {  // even a narrow input is copied; see the header for the rest
    if (d == 4 && c.out_c > c.in_c) return out_padded;
    const int64_t accumulators = d == 2 ? std::min<int64_t>(threads, std::max<int64_t>(1, out_spatial / 512)) : 0;
    return in_padded + out_padded + accumulators * padded(c.out_c) * out_spatial * 4 +
           padded(c.in_c) * padded(c.out_c) * d - out_bytes;
  }
  if (c.in_c < block) return out_padded;
  if (c.out_c % block == 0) return std::max(in_padded + padded(c.in_c) * c.out_c * volume * d, out_bytes);
  const int64_t weight = padded(c.in_c) * padded(c.out_c) * volume * d;
  return std::max(in_padded + weight + out_padded - out_bytes, out_padded);
}

}  // namespace

int64_t cpu_convolution_temporaries(const CpuConvolution& c, int threads) {
  const int64_t volume = product(c.kernel);
  const int64_t kw = c.kernel.back(), kh = c.kernel[c.kernel.size() - 2];
  bool onednn = false;
  if (c.dtype_bytes == 2) {
    onednn = cpu_onednn_bf16();
  } else {
    const bool worth = c.strided || c.batch >= 16 || kw != 1 || kh != 1 || threads > 1;
    const bool faster = (kw > 3 && kh > 3) || c.batch > 1 || c.batch * c.in_c * c.in_sizes[0] * c.in_sizes[1] > 20480;
    onednn = worth && faster;
  }
  if (onednn) return onednn_temporaries(c, volume, threads);
  return volume == 1 ? 0 : c.batch * c.in_c * volume * product(c.out_sizes) * c.dtype_bytes;
}

int64_t cpu_onednn_matmul_scratch(int64_t rows, int64_t contraction, int threads) {
  const int64_t blocks = (rows + 255) / 256, block_rows = blocks > 0 ? (rows + blocks - 1) / blocks : 0;
  return threads * (128 * std::min<int64_t>(contraction, 512) + 256 * block_rows + 640) + 384;
}

}  // namespace gclab::memory
