// The live set of a memory walk written as bookkeeping (the loading plan, the quantization's temporaries),
// counting the bytes allocated now and the highest count seen — what the tracking allocator measures when
// the code runs — and the CPU kernels' own temporaries the meta kernels (nn/meta_kernels.h) allocate.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gclab/memory/cpu_isa.h"

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
// What its backward (cpu_flash_attention_backward) allocates beside the gradients while it runs, at the same
// splits: per thread a score block and its gradient in float32 (again in the inputs' dtype when that is a
// half type) and a q-split row sum, float32. (Only where nothing larger is live does it set the backward's
// peak: behind a kept [B, H, L, L] mask, Chroma's.)
int64_t cpu_flash_attention_backward_temporaries(int64_t q_len, int64_t kv_len, int threads, int64_t dtype_bytes);

// A convolution as the CPU runs it: `batch` inputs of `in_c` channels over `in_sizes` (the input as the
// kernel gets it: a causal 3-D convolution's input already padded) to `out_c` channels over `out_sizes`,
// a kernel of `kernel` (2 or 3 axes), in a dtype of `dtype_bytes`, strided or not.
struct CpuConvolution {
  int64_t batch = 1, in_c = 0, out_c = 0;
  std::vector<int64_t> in_sizes, out_sizes, kernel;
  bool strided = false;
  int64_t dtype_bytes = 4;
};

// What that convolution allocates for a moment beside its output (allocated first) (measured with the tracking
// allocator), on the kernel PyTorch picks (aten/src/ATen/native/Convolution.cpp, ConvParams::use_mkldnn): oneDNN for
// bf16 where the CPU runs bf16 through it (cpu_onednn_bf16), and for float32 when (strided, a batch of 16 or
// more, a kernel wider than 1x1, or more than one thread) and (a kernel above 3x3, a batch above one, or
// N x C x the first two spatial sizes above 20480); otherwise slow_conv2d / slow_conv3d.
//   - oneDNN works in a blocked layout of cpu_channel_block() channels: an input of fewer channels than a
//     block is read as it is and the output computed blocked (padded) and reordered; a wider input is
//     copied into the blocked layout (padded) beside a copy of the weight, and the output is computed in
//     place when its channels fill whole blocks (then a buffer of the output's size is held once those
//     copies are gone: the larger of the two counts, which is the output when it widens the channels enough,
//     e.g. 24 -> 64 at 32²), else in a padded buffer (the weight's copy padded, in its input channels too)
//     that is then reordered (3x3: measured for 3 to 512 channels, 16² to 256², on AVX2 and AVX-512). A 1x1
//     kernel copies even a narrow input and its weight, and in bf16 accumulates in float32: a padded output
//     for each thread with at least 512 positions; a float32 one that widens the channels holds a second
//     output instead (1x1: measured on AVX-512 for 3 to 256 channels, 16² to 64², batch 1 and 2, one and
//     two threads);
//   - slow_conv2d and slow_conv3d hold the whole batch's im2col columns, batch x in_c x kernel volume x
//     output positions (measured exact on Qwen-Image's autoencoder and the AutoencoderKL in bf16); a 1x1
//     kernel needs none.
int64_t cpu_convolution_temporaries(const CpuConvolution& conv, int threads);

// oneDNN's scratch beside a bf16 matmul of `rows` x `contraction` elements on such a CPU, held for a moment
// (measured for at::linear's forward, 1 to 4096 rows, 64 to 768 contraction elements, one and two threads):
// per thread 128 bytes per contraction element (at most 512 of them), 256 per row of a row block (the rows
// split evenly into blocks of at most 256) and 640, and 384 once.
int64_t cpu_onednn_matmul_scratch(int64_t rows, int64_t contraction, int threads);

}  // namespace gclab::memory
