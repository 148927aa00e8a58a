// Meta-device kernels for the ops the networks use that LibTorch's C++ gives none (Python's meta
// registrations are not there): each allocates on meta what its device kernel allocates — its outputs in
// their layout, what autograd keeps, its own temporaries as a counted spike — so the network's forward
// walked on meta tensors under a memory::MetaCount counts what it holds when it runs.
#pragma once

#include <torch/torch.h>

namespace gclab::nn {

// scaled_dot_product_attention(q, k, v) as the CPU's fused kernel runs it (no mask, no dropout).
torch::Tensor meta_flash_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v);

// LayerNorm over the last dimension, no affine: the output like x, and the mean and 1/std the CPU's kernel
// returns (and autograd keeps), one per row, in x's dtype (the CPU keeps a bf16 input's statistics in bf16).
torch::Tensor meta_layer_norm(const torch::Tensor& x);

// table.index_select(0, index) on any device (an embedding lookup): [n, D] rows of `table`.
torch::Tensor index_rows(const torch::Tensor& table, const torch::Tensor& index);

}  // namespace gclab::nn
