// The live set of a memory walk: a network run statement by statement on shapes alone (the autoencoders'
// vae/memory.h), counting the bytes allocated now and the highest count
// seen — what the tracking allocator measures when the network runs.
#pragma once

#include <algorithm>
#include <cstdint>

namespace gclab::memory {

class LiveSet {
 public:
  void alloc(int64_t bytes) {
    live_ += bytes;
    peak_ = std::max(peak_, live_);
  }
  void free(int64_t bytes) { live_ -= bytes; }
  // A kernel's own temporaries: held for a moment on top of the live set, freed before it returns.
  void spike(int64_t bytes) { peak_ = std::max(peak_, live_ + bytes); }
  int64_t live() const { return live_; }
  int64_t peak() const { return peak_; }

 private:
  int64_t live_ = 0, peak_ = 0;
};

// What PyTorch's CPU flash-attention kernel (scaled_dot_product_attention on the CPU,
// aten/src/ATen/native/cpu/FlashAttentionKernel.cpp) allocates beside its output for `batch_heads` heads of
// q_len queries over kv_len keys: per thread, a q-split x kv-split score block, the split's running max and
// sum and a q-split x head_dim accumulator, in float32 (plus the score block in the inputs' dtype when that
// is a half type), and the log-sum-exp it returns, [batch_heads, q_len] float32. The query split is 256
// rows from 768 queries, 64 from 192, else 32; the key split 512 (both at most the lengths).
int64_t cpu_flash_attention_temporaries(int64_t batch_heads, int64_t q_len, int64_t kv_len, int64_t head_dim,
                                        int threads, int64_t dtype_bytes);

// What a CPU convolution allocates beside its output for a moment (measured with the tracking allocator),
// for `batch` inputs of `in_c` channels over `in_spatial` positions (a 3-D input already padded) to `out_c`
// channels over `out_spatial`, a kernel of `volume` elements, in a dtype of `dtype_bytes`: oneDNN's blocked
// layout (`channel_block`: cpu_channel_block) — a 1x1 kernel needs none; an input of fewer channels than a
// block is read as it is and the output computed in the blocked layout (padded) and reordered; a wider input
// is copied into the blocked layout (padded) beside a copy of the weight, and the output is computed in
// place when its channels fill whole blocks, else in a padded buffer (the weight's copy padded too) that is
// then reordered. With `im2col` (a bf16 convolution on a CPU without oneDNN's bf16: slow_conv2d) the whole
// batch's im2col columns instead.
int64_t cpu_conv_temporaries(int64_t batch, int64_t in_c, int64_t out_c, int64_t in_spatial, int64_t out_spatial,
                             int64_t volume, int64_t dtype_bytes, int64_t channel_block, bool im2col);

// oneDNN's channel block on this CPU: 16 with AVX-512, else 8.
int cpu_channel_block();

// A flag of this CPU as PyTorch reads it (at::cpu::get_cpu_capabilities: "avx512_f", "avx512_bw", ...).
bool cpu_has(const char* flag);

// Whether this CPU runs bf16 matmuls and convolutions through oneDNN (PyTorch's mkldnn_bf16_device_check:
// AVX-512 BW, VL and DQ). Where it does, a bf16 matmul allocates oneDNN's scratch for a moment beside its
// output — measured at one thread for a Linear: 128 bytes per contraction element, 256 per output row (of
// at most 256 rows) and 1 KiB, more for a transposed operand, about twice at two threads — which the walks
// do not hold (listed in the estimate's not_modelled). Where it does not, a bf16 convolution runs
// slow_conv2d with its im2col columns (vae/memory.h).
bool cpu_onednn_bf16();

}  // namespace gclab::memory
