// Meta-device kernels for the ops the networks use that LibTorch's C++ gives none (Python's meta
// registrations are not there): each allocates on meta what its device kernel allocates — its outputs in
// their layout, what autograd keeps, its own temporaries as a counted spike — so the network's forward
// walked on meta tensors under a memory::MetaCount counts what it holds when it runs.
#pragma once

#include <torch/torch.h>

#include "gclab/ckpt/saved_ops.h"
#include "gclab/memory/flops.h"

#include <optional>

namespace gclab::nn {

// scaled_dot_product_attention(q, k, v, mask, scale) on any device (no dropout): the device's kernel, or on
// meta what the fused kernel of the device the walk stands for allocates (memory::meta_target()): on the CPU
// its output, log-sum-exp and per-thread blocks; on CUDA its output and log-sum-exp; on both the copy the
// kernel makes of a mask it cannot read in place (T5's bias, a permuted view). `mask`: additive, broadcast
// to the scores. Inside a selective:ops checkpoint its output and log-sum-exp are kept by the forward and
// replayed by the recompute with the kernel's backward (ckpt/saved_ops.h; not a boolean mask, nor on CUDA one
// the kernel would pad, nor a kernel other than the fused ones: those run again).
torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& mask = {}, std::optional<double> scale = std::nullopt);

// LayerNorm over the last dimension, no affine: the output like x, and the mean and 1/std the CPU's kernel
// returns (and autograd keeps), one per row, in x's dtype (the CPU keeps a bf16 input's statistics in bf16).
torch::Tensor meta_layer_norm(const torch::Tensor& x);
// at::layer_norm over the last dimension with an affine weight and bias (CLIP's, Wan's norm2), on any device:
// on meta as meta_layer_norm, the weight and bias kept with the graph and given gradients, as
// native_layer_norm's backward gives them.
torch::Tensor layer_norm(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias, double eps);

// table.index_select(0, index) on any device (an embedding lookup): [n, D] rows of `table`.
torch::Tensor index_rows(const torch::Tensor& table, const torch::Tensor& index);
// values.index_select(0, index) for a 1-D table, without autograd (a code book's lookup: the 8-bit optimizer
// moments'), on any device: on meta its output, like `index`, in the values' dtype.
torch::Tensor lookup(const torch::Tensor& values, const torch::Tensor& index);
// x.abs() and torch::dot(a, b) on any device (the optimizers' updates): on meta their outputs.
torch::Tensor abs(const torch::Tensor& x);
torch::Tensor dot(const torch::Tensor& a, const torch::Tensor& b);
// torch::bucketize(x, boundaries) on any device: on meta its output, int64 indices like x.
torch::Tensor bucketize(const torch::Tensor& x, const torch::Tensor& boundaries);
// torch::embedding(table, ids) on any device: [ids..., D] (on meta, `ids` may be the CPU's).
torch::Tensor embedding(const torch::Tensor& table, const torch::Tensor& ids);

// F::linear(x, weight, bias) on any device; on meta, for a CPU walk whose bf16 matmuls run through oneDNN
// (memory::cpu_onednn_bf16), oneDNN's scratch beside the output for a moment
// (memory::cpu_onednn_matmul_scratch; the backward's matmuls are autograd's, without it).
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias = {});

// linear(x, weight, bias) as a selective:ops checkpoint keeps it (ckpt/saved_ops.h), `site` naming the call (its
// Linear): its output recorded by the forward, and handed back by the recompute with at::linear's backward,
// nothing run. Elsewhere linear(). `flops`, the matmul's, are counted (memory/flops.h) where it runs — not as
// recomputed where it is kept. Attention (above) is kept and replayed the same way.
torch::Tensor kept_linear(const void* site, const torch::Tensor& x, const torch::Tensor& weight,
                          const torch::Tensor& bias, double flops);
// The same for any matmul-like op at `site` whose output is `shape`: `run()` computes it (its `flops` counted
// where it runs), `replay(kept)` hands a kept output back with the op's own backward (a qfloat8 Linear's,
// nn/layers.cpp). A template: on every training step's Linear, no callable is built.
template <class Run, class Replay>
torch::Tensor kept_op(const void* site, at::IntArrayRef shape, double flops, Run&& run, Replay&& replay) {
  if (ckpt::SavedOps* replaying = ckpt::SavedOps::replaying()) {
    std::vector<torch::Tensor> kept = replaying->take(site);
    if (!kept.empty()) {
      TORCH_CHECK(kept[0].sizes() == shape, "selective:ops: the recompute's matmul is ", shape,
                  " where the forward kept ", kept[0].sizes(),
                  " (the block calls this Linear in another order when it runs again: use full)");
      return replay(kept[0]);
    }
  }
  ckpt::SavedOps* record = ckpt::SavedOps::recording();
  std::optional<memory::NotRecomputed> once;  // kept: the backward does not run it again (its FLOPs, its bytes)
  if (record) once.emplace();
  if (memory::counting_flops()) memory::add_flops(flops);
  torch::Tensor y = run();
  if (record) record->record(site, {y});
  return y;
}

// A convolution (2-D or 3-D, by the weight's axes; one group, no dilation) on any device: on meta its output,
// contiguous, with the temporaries the kernel the walk's device picks holds beside it for a moment — on the
// CPU memory::cpu_convolution_temporaries (oneDNN's blocked copies, or the slow kernels' im2col columns), on
// CUDA none (cuDNN's workspace is not modelled). For inference: on meta it records no backward.
torch::Tensor convolution(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                          at::IntArrayRef stride, at::IntArrayRef padding);

// at::group_norm(x, groups, weight, bias, eps) on any device: on meta its output like x, and the per-group
// mean and 1/std ([N, groups]; the input's dtype on the CPU, float32 on CUDA) for a moment beside it.
// For inference, as convolution.
torch::Tensor group_norm(const torch::Tensor& x, int64_t groups, const torch::Tensor& weight, const torch::Tensor& bias,
                         double eps);

// torch::where(condition, a, b) on any device; on meta with its backward (each input's gradient a tensor of
// the output's shape, summed to the input's where it was broadcast).
torch::Tensor where(const torch::Tensor& condition, const torch::Tensor& a, const torch::Tensor& b);

// x.masked_scatter(mask, source) on any device: a contiguous copy of x, filled.
torch::Tensor masked_scatter(const torch::Tensor& x, const torch::Tensor& mask, const torch::Tensor& source);

// at::upsample_bilinear2d(x, size, align_corners = false) of float images [N, C, H, W] on any device: on meta
// its output, and for a CPU walk what the kernel ATen picks holds beside it for a moment — the channels-last
// kernel's copies of the input and the output (a small output, or 3 channels on one thread), else the
// generic kernel's index and weight tables (measured for [1, 3, H, W] float32 on one thread and two; a GPU
// run resizes its control images on the CPU, in host memory).
torch::Tensor resize_bilinear(const torch::Tensor& x, at::IntArrayRef size);

// at::_upsample_bicubic2d_aa(x, size, align_corners = false) of uint8 levels [1, 3, H, W] (contiguous) on any
// device: on meta its output and, for a CPU walk, what ATen's kernel holds beside it for a moment. Per resized
// axis, its PIL-style index ranges (four int64 per output pixel) and weights (a double per output pixel and
// tap; taps 2·ceil(2·max(in/out, 1)) + 1). Where ATen runs AVX2 (memory::aten_avx2; UpSampleKernelAVXAntialias.h)
// also the input unpacked to four channels and one four-channel buffer per pass (horizontal at the input's
// height, vertical at the output's), all at once; below, the generic separable kernel: the width resized first
// into an intermediate image, beside one axis's ranges at a time. Equal sizes: a copy.
torch::Tensor resize_bicubic_aa(const torch::Tensor& x, at::IntArrayRef size);

}  // namespace gclab::nn
