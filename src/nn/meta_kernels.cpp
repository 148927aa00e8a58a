#include "gclab/nn/meta_kernels.h"

#include "gclab/memory/flops.h"

#include <ATen/SDPBackend.h>
#include <ATen/autocast_mode.h>

#include <algorithm>
#include <cmath>

#include "gclab/ckpt/saved_ops.h"

#include "gclab/memory/cpu_isa.h"
#include "gclab/memory/live_set.h"
#include "gclab/memory/meta_count.h"

namespace gclab::nn {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// aten/src/ATen/native/transformers/attention.cpp (_scaled_dot_product_flash_attention_cpu) and
// native/cpu/FlashAttentionKernel.cpp: the output allocated like q (its strides kept: merging the heads
// afterwards copies it when q was head-major, as a concatenated q is), the log-sum-exp [B, L, H] float32
// returned as [B, H, L], both kept with q, k, v for the backward; the kernel's per-thread blocks beside
// them while it runs (memory::cpu_flash_attention_temporaries). Checked op by op against the CPU's
// allocations by tests/model/meta_walk_test.cpp.
class FlashAttention : public torch::autograd::Function<FlashAttention> {
 public:
  // `kept`: the output and log-sum-exp a selective:ops forward kept (replayed: nothing runs), or none.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, bool masked, int64_t mask_copy, const torch::Tensor& kept_mask,
                               const std::vector<torch::Tensor>& kept) {
    auto [out, lse] = kept.empty() ? outputs(q, k, v, masked, mask_copy) : std::pair{kept[0].variable_data(), kept[1]};
    ctx->save_for_backward({q, k, v, out, lse, kept_mask});
    return out;
  }
  // The output and log-sum-exp as the kernel makes them, its temporaries beside them for a moment.
  static std::pair<torch::Tensor, torch::Tensor> outputs(const torch::Tensor& q, const torch::Tensor& k,
                                                         const torch::Tensor& v, bool masked, int64_t mask_copy) {
    const int64_t B = q.size(0), H = q.size(1), L = q.size(2), d = q.size(3), S = k.size(2);
    (void)v;
    torch::Tensor out = torch::empty_like(q);  // q's layout (memory format preserved)
    torch::Tensor lse = torch::empty({B, L, H}, q.options().dtype(torch::kFloat)).transpose(1, 2);
    if (memory::meta_target() != c10::kCPU && masked) {
      // A masked call on CUDA runs the memory-efficient kernel (flash takes no mask): its output is made
      // [B, L, H, d] and handed back transposed (so merging the heads after it is a view), its log-sum-exp
      // padded to a multiple of 32 (torch/_meta_registrations.py meta__scaled_dot_product_efficient_attention).
      out = torch::empty({B, L, H, d}, q.options()).transpose(1, 2);
      lse = torch::empty({B, H, (L + 31) / 32 * 32}, q.options().dtype(torch::kFloat));
    }
    if (memory::meta_target() == c10::kCPU) {
      const int64_t temporaries = memory::cpu_flash_attention_temporaries(B * H, L, S, d, at::get_num_threads(),
                                                                          static_cast<int64_t>(q.element_size()));
      memory::meta_spike(temporaries - 4 * B * H * L + mask_copy);  // the log-sum-exp is counted above
    } else {
      memory::meta_spike(mask_copy);
    }
    return {out, lse};
  }
  static tensor_list backward(AutogradContext* ctx, const tensor_list& incoming) {
    const auto saved = ctx->get_saved_variables();
    if (memory::meta_target() != c10::kCPU)
      return {torch::empty_like(saved[0]),
              torch::empty_like(saved[1]),
              torch::empty_like(saved[2]),
              torch::Tensor(),
              torch::Tensor(),
              torch::Tensor(),
              torch::Tensor()};
    // _scaled_dot_product_flash_attention_cpu_backward: each gradient made [B, L, H, d] and handed back
    // transposed; the kernel's blocks beside them while it runs (cpu_flash_attention_backward_temporaries).
    auto grad = [](const torch::Tensor& x) {
      return torch::zeros({x.size(0), x.size(2), x.size(1), x.size(3)}, x.options()).transpose(1, 2);
    };
    tensor_list grads = {grad(saved[0]),  grad(saved[1]),  grad(saved[2]), torch::Tensor(),
                         torch::Tensor(), torch::Tensor(), torch::Tensor()};
    // flash_attention_backward_kernel_impl: grad_out.transpose(1, 2).contiguous(), a copy unless it is laid out so.
    const torch::Tensor grad_out = incoming[0].transpose(1, 2).contiguous();
    memory::meta_spike(memory::cpu_flash_attention_backward_temporaries(
        saved[0].size(2), saved[1].size(2), at::get_num_threads(), static_cast<int64_t>(saved[0].element_size())));
    return grads;
  }
};

// at::layer_norm (native_layer_norm's CPU kernel): the output, and the statistics [rows, 1] kept for the
// backward with the input.
class LayerNorm : public torch::autograd::Function<LayerNorm> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x) {
    const int64_t rows = x.numel() / x.size(-1);
    // The statistics: float32 on CUDA whatever the input, the input's dtype on the CPU (measured).
    const auto stats = x.options().dtype(memory::meta_target() == c10::kCPU ? x.scalar_type() : torch::kFloat);
    torch::Tensor mean = torch::empty({rows, 1}, stats), rstd = torch::empty({rows, 1}, stats);
    ctx->save_for_backward({x, mean, rstd});
    return torch::empty(x.sizes(), x.options());
  }
  static tensor_list backward(AutogradContext* ctx, const tensor_list& /*grads*/) {
    return {torch::empty_like(ctx->get_saved_variables()[0])};
  }
};

// at::layer_norm with an affine weight and bias: the same, the weight and bias kept for the backward too
// (native_layer_norm saves them: a float32 copy a bf16 model makes of them stays with the graph), and their
// gradients made by the backward where they need one.
class AffineLayerNorm : public torch::autograd::Function<AffineLayerNorm> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               const torch::Tensor& bias) {
    const int64_t rows = x.numel() / x.size(-1);
    const auto stats = x.options().dtype(memory::meta_target() == c10::kCPU ? x.scalar_type() : torch::kFloat);
    torch::Tensor mean = torch::empty({rows, 1}, stats), rstd = torch::empty({rows, 1}, stats);
    ctx->save_for_backward({x, weight, bias, mean, rstd});
    return torch::empty(x.sizes(), x.options());
  }
  static tensor_list backward(AutogradContext* ctx, const tensor_list& /*grads*/) {
    const auto saved = ctx->get_saved_variables();
    return {torch::empty_like(saved[0]), torch::empty_like(saved[1]), torch::empty_like(saved[2])};
  }
};

// index_select along rows: a new [n, D] tensor; the backward needs only the index.
class IndexRows : public torch::autograd::Function<IndexRows> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& table, const torch::Tensor& index) {
    ctx->saved_data["rows"] = table.size(0);
    return torch::empty({index.size(0), table.size(1)}, table.options());
  }
  static tensor_list backward(AutogradContext* ctx, const tensor_list& grads) {
    return {torch::zeros({ctx->saved_data["rows"].toInt(), grads[0].size(1)}, grads[0].options()), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor meta_layer_norm(const torch::Tensor& x) { return LayerNorm::apply(x); }

torch::Tensor index_rows(const torch::Tensor& table, const torch::Tensor& index) {
  if (table.is_meta()) return IndexRows::apply(table, index);
  return table.index_select(0, index);
}

torch::Tensor lookup(const torch::Tensor& values, const torch::Tensor& index) {
  if (values.is_meta() || index.is_meta()) return torch::empty(index.sizes(), index.options().dtype(values.dtype()));
  return values.index_select(0, index);
}

torch::Tensor abs(const torch::Tensor& x) { return x.is_meta() ? torch::empty_like(x) : x.abs(); }

torch::Tensor dot(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.is_meta() || b.is_meta()) return torch::empty({}, a.options());
  return torch::dot(a, b);
}

torch::Tensor bucketize(const torch::Tensor& x, const torch::Tensor& boundaries) {
  if (x.is_meta() || boundaries.is_meta()) return torch::empty(x.sizes(), x.options().dtype(torch::kLong));
  return torch::bucketize(x, boundaries);
}

namespace {

// The copy the device's attention makes of an additive mask it cannot read as it is, held while the kernel
// runs: on the CPU a contiguous copy of one that is not contiguous (measured: T5's bias, a permuted view of
// [T, T, heads]); on CUDA (aten/src/ATen/native/transformers/attention.cpp, preprocess_mask) a padded copy
// of one whose last dimension is not unit-stride or whose other strides are not multiples of 8 (pad_bias:
// its last dimension rounded up to 8).
// Whether CUDA's memory-efficient kernel reads the additive mask as it is (aligned_tensor<8>: unit stride last,
// the other strides multiples of 8).
bool cuda_mask_aligned(const torch::Tensor& mask) {
  bool aligned = mask.stride(-1) == 1;
  for (int64_t i = 0; i + 1 < mask.dim(); ++i) aligned = aligned && mask.stride(i) % 8 == 0;
  return aligned;
}

int64_t attention_mask_copy_bytes(const torch::Tensor& mask) {
  const int64_t element = static_cast<int64_t>(mask.element_size());
  if (memory::meta_target() == c10::kCPU) return mask.is_contiguous() ? 0 : mask.numel() * element;
  if (cuda_mask_aligned(mask)) return 0;
  const int64_t last = mask.size(-1);
  return mask.numel() / std::max<int64_t>(last, 1) * ((last + 7) / 8 * 8) * element;
}

}  // namespace

namespace {

// The kernels whose saved outputs a selective:ops forward keeps and its recompute replays (none: it runs again).
enum class Replayable { none, meta, cpu_flash, cuda_flash, cuda_efficient };

// The kernel scaled_dot_product_attention runs for these inputs, if its outputs can be kept: on meta, the
// one the walk stands for (FlashAttention above); elsewhere the fused kernel ATen picks (at::_fused_sdp_choice,
// as scaled_dot_product_attention asks). Run again instead: a boolean mask (converted first) or one that needs
// a gradient; autocast (which casts q, k, v first); on CUDA the flash kernel where it would pad the head size
// (not a multiple of 8) and the memory-efficient one where it would pad the mask (cuda_mask_aligned) — the
// walk for CUDA asks the same of its shapes — and a kernel other than those two (cuDNN, math).
Replayable replayable(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& mask,
                      std::optional<double> scale) {
  if (mask.defined() && (mask.scalar_type() == torch::kBool || mask.requires_grad())) return Replayable::none;
  const bool cuda = q.is_meta() ? memory::meta_target() != c10::kCPU : q.is_cuda();
  if (cuda && mask.defined() && !cuda_mask_aligned(mask)) return Replayable::none;
  if (cuda && !mask.defined() && q.size(-1) % 8 != 0) return Replayable::none;
  if (q.is_meta()) return Replayable::meta;
  if ((!q.is_cpu() && !q.is_cuda()) || at::autocast::is_autocast_enabled(q.device().type())) return Replayable::none;
  const auto backend = static_cast<at::SDPBackend>(at::_fused_sdp_choice(
      q, k, v, mask.defined() ? std::optional<torch::Tensor>(mask) : std::nullopt, 0.0, false, scale));
  if (backend == at::SDPBackend::flash_attention)
    return q.is_cpu() ? Replayable::cpu_flash : q.size(-1) % 8 == 0 ? Replayable::cuda_flash : Replayable::none;
  if (backend == at::SDPBackend::efficient_attention && q.is_cuda()) return Replayable::cuda_efficient;
  return Replayable::none;
}

// The kernel a kept record came from, by what it kept (kept_attention: 2 tensors on the CPU or meta, 8 for
// CUDA's flash, 4 for its memory-efficient kernel): the replay's backward is that kernel's, whatever ATen would
// pick now (its choice may differ with grad on).
Replayable kept_kind(const torch::Tensor& q, const std::vector<torch::Tensor>& kept) {
  if (q.is_meta()) return Replayable::meta;
  if (q.is_cpu() && kept.size() == 2) return Replayable::cpu_flash;
  if (q.is_cuda() && kept.size() == 8) return Replayable::cuda_flash;
  if (q.is_cuda() && kept.size() == 4) return Replayable::cuda_efficient;
  TORCH_CHECK(false, "selective:ops: an attention call kept ", kept.size(), " tensors on ", q.device(),
              ", which no kernel's replay takes");
}

// What the kernel returns that its backward needs: the output first, its log-sum-exp, and on CUDA the
// kernel's own (flash: the sequence offsets and lengths, the random seed and offset; efficient: the seed
// and offset), lengths as int64 scalars.
std::vector<torch::Tensor> kept_attention(Replayable kind, const torch::Tensor& q, const torch::Tensor& k,
                                          const torch::Tensor& v, const torch::Tensor& mask,
                                          std::optional<double> scale) {
  const auto optional_mask = mask.defined() ? std::optional<torch::Tensor>(mask) : std::nullopt;
  switch (kind) {
    case Replayable::meta: {
      auto [out, lse] =
          FlashAttention::outputs(q, k, v, mask.defined(), mask.defined() ? attention_mask_copy_bytes(mask) : 0);
      return {out, lse};
    }
    case Replayable::cpu_flash: {
      auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, false, optional_mask, scale);
      return {out, lse};
    }
    case Replayable::cuda_flash: {
      auto r = at::_scaled_dot_product_flash_attention(q, k, v, 0.0, false, false, scale);
      const auto length = [](const c10::SymInt& n) { return torch::tensor(n.expect_int(), torch::kLong); };
      return {std::get<0>(r),         std::get<1>(r),         std::get<2>(r), std::get<3>(r),
              length(std::get<4>(r)), length(std::get<5>(r)), std::get<6>(r), std::get<7>(r)};
    }
    case Replayable::cuda_efficient: {
      // As scaled_dot_product_attention hands it over (preprocess_mask): broadcast to [B, H, L, S], a view.
      const auto bias = mask.defined()
                            ? std::optional<torch::Tensor>(mask.expand({q.size(0), q.size(1), q.size(2), k.size(2)}))
                            : std::nullopt;
      auto r = at::_scaled_dot_product_efficient_attention(q, k, v, bias, true, 0.0, false, scale);
      return {std::get<0>(r), std::get<1>(r), std::get<2>(r), std::get<3>(r)};
    }
    case Replayable::none:
      break;
  }
  return {};
}

// Attention on a device, replayed from what kept_attention kept: the output handed back, and the backward the
// kernel's autograd formula runs (tools/autograd/derivatives.yaml: _scaled_dot_product_flash_attention_for_cpu,
// _scaled_dot_product_flash_attention, _scaled_dot_product_efficient_attention).
class ReplayedAttention : public torch::autograd::Function<ReplayedAttention> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& mask, Replayable kind,
                               std::vector<torch::Tensor> kept, std::optional<double> scale) {
    torch::Tensor out = kept[0].variable_data();
    std::vector<torch::Tensor> saved = {q, k, v, mask};
    saved.insert(saved.end(), kept.begin(), kept.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["kind"] = static_cast<int64_t>(kind);
    ctx->saved_data["scale"] = scale.has_value() ? c10::IValue(*scale) : c10::IValue();
    return out;
  }
  static tensor_list backward(AutogradContext* ctx, const tensor_list& grads) {
    const auto s = ctx->get_saved_variables();
    const auto kind = static_cast<Replayable>(ctx->saved_data["kind"].toInt());
    const c10::IValue& scale_value = ctx->saved_data["scale"];
    const std::optional<double> scale = scale_value.isNone() ? std::nullopt : std::optional(scale_value.toDouble());
    const auto mask = s[3].defined() && s[3].numel() > 0 ? std::optional<torch::Tensor>(s[3]) : std::nullopt;
    std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> g;
    if (kind == Replayable::cpu_flash) {
      g = at::_scaled_dot_product_flash_attention_for_cpu_backward(grads[0], s[0], s[1], s[2], s[4], s[5], 0.0, false,
                                                                   mask, scale);
    } else if (kind == Replayable::cuda_flash) {
      g = at::_scaled_dot_product_flash_attention_backward(grads[0], s[0], s[1], s[2], s[4], s[5], s[6], s[7],
                                                           s[8].item<int64_t>(), s[9].item<int64_t>(), 0.0, false,
                                                           s[10], s[11], scale);
    } else {
      TORCH_CHECK(kind == Replayable::cuda_efficient, "selective:ops: no backward for this attention replay");
      const torch::Tensor bias =
          mask ? mask->expand({s[0].size(0), s[0].size(1), s[0].size(2), s[1].size(2)}) : torch::Tensor();
      auto r = at::_scaled_dot_product_efficient_attention_backward(
          grads[0], s[0], s[1], s[2], bias, s[4], s[5], s[6], s[7], 0.0,
          {ctx->needs_input_grad(0), ctx->needs_input_grad(1), ctx->needs_input_grad(2), false}, false, scale);
      g = {std::get<0>(r), std::get<1>(r), std::get<2>(r)};
    }
    return {std::get<0>(g),  std::get<1>(g),  std::get<2>(g), torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// The attention calls' site in a selective:ops record (ckpt/saved_ops.h).
constexpr char kAttentionSite = 0;

}  // namespace

torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& mask, std::optional<double> scale) {
  const torch::Tensor no_mask = q.is_meta() ? torch::empty({0}, q.options()) : torch::Tensor();
  if (ckpt::SavedOps* replay = ckpt::SavedOps::replaying()) {
    std::vector<torch::Tensor> kept = replay->take(&kAttentionSite);
    if (!kept.empty()) {
      const std::vector<int64_t> expected = {q.size(0), q.size(1), q.size(2), v.size(-1)};
      TORCH_CHECK(kept[0].sizes() == c10::IntArrayRef(expected), "selective:ops: the recompute's attention call is ",
                  c10::IntArrayRef(expected), " where the forward kept ", kept[0].sizes(),
                  " (the block calls attention in another order when it runs again: use full)");
      if (q.is_meta()) return FlashAttention::apply(q, k, v, mask.defined(), 0, no_mask, kept);
      return ReplayedAttention::apply(q, k, v, mask.defined() ? mask : torch::empty({0}, q.options()),
                                      kept_kind(q, kept), std::move(kept), scale);
    }
  }
  ckpt::SavedOps* record = ckpt::SavedOps::recording();
  const Replayable kind = record ? replayable(q, k, v, mask, scale) : Replayable::none;
  std::optional<memory::NotRecomputed> once;  // kept: the backward does not run it again (its FLOPs, its bytes)
  if (kind != Replayable::none) once.emplace();
  // The scores and the weighted sum: 2·Sq·Skv·D each, per batch and head ([.., Sq, D] and [.., Skv, D]).
  if (memory::counting_flops())
    memory::add_flops(4.0 * static_cast<double>(q.numel()) * static_cast<double>(k.size(-2)));
  if (record) {
    std::vector<torch::Tensor> kept = kept_attention(kind, q, k, v, mask, scale);
    record->record(&kAttentionSite, kept);
    if (!kept.empty()) return kept[0];
  }
  if (q.is_meta()) {
    // A boolean mask becomes an additive one in q's dtype first (convert_boolean_attn_mask in
    // aten/src/ATen/native/transformers/attention.cpp: zeros_like, then masked_fill_ with its logical_not, a
    // bool temporary), which the kernel keeps for its backward (measured on the CPU: the flash kernel's saved
    // attn_mask; CUDA's efficient kernel keeps its attn_bias) — a copy per call, held with the graph.
    if (mask.defined() && mask.scalar_type() == torch::kBool) {
      const torch::Tensor additive = torch::empty(mask.sizes(), q.options());
      memory::meta_spike(mask.numel());
      return FlashAttention::apply(q, k, v, true, attention_mask_copy_bytes(additive), additive,
                                   std::vector<torch::Tensor>{});
    }
    return FlashAttention::apply(q, k, v, mask.defined(), mask.defined() ? attention_mask_copy_bytes(mask) : 0,
                                 no_mask,  // nothing kept (apply takes no undefined tensor)
                                 std::vector<torch::Tensor>{});
  }
  return at::scaled_dot_product_attention(q, k, v, mask.defined() ? std::optional<torch::Tensor>(mask) : std::nullopt,
                                          0.0, false, scale);
}

torch::Tensor layer_norm(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias, double eps) {
  if (x.is_meta()) return weight.defined() ? AffineLayerNorm::apply(x, weight, bias) : meta_layer_norm(x);
  return at::layer_norm(x, {x.size(-1)}, weight, bias, eps);
}

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  torch::Tensor y = torch::nn::functional::linear(x, weight, bias);
  if (x.is_meta() && memory::meta_target() == c10::kCPU && x.scalar_type() == torch::kBFloat16 &&
      weight.scalar_type() == torch::kBFloat16 && memory::cpu_onednn_bf16())
    memory::meta_spike(memory::cpu_onednn_matmul_scratch(x.numel() / std::max<int64_t>(x.size(-1), 1), x.size(-1),
                                                         at::get_num_threads()));
  return y;
}

namespace {

// at::linear's backward for an output a selective:ops forward kept: addmm's and mm's formulas
// (torch/csrc/autograd/FunctionsManual.cpp mm_mat1_backward: grad.mm(W); mm_mat2_backward for the transposed
// weight: grad.t().mm(x)), on the rows flattened as at::linear flattens them, and the bias's gradient summed
// over the rows as the engine sums a broadcast input's (at::sum_to).
class ReplayedLinear : public torch::autograd::Function<ReplayedLinear> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               const torch::Tensor& /*bias*/, const torch::Tensor& kept) {
    ctx->save_for_backward(
        {weight.requires_grad() ? x : torch::Tensor(), x.requires_grad() ? weight : torch::Tensor()});
    ctx->saved_data["sizes"] = x.sizes().vec();
    return kept.variable_data();
  }
  static tensor_list backward(AutogradContext* ctx, const tensor_list& grads) {
    const auto saved = ctx->get_saved_variables();
    const std::vector<int64_t> sizes = ctx->saved_data["sizes"].toIntVector();
    const torch::Tensor dy = grads[0].reshape({-1, grads[0].size(-1)});
    torch::Tensor dx, dw, db;
    if (ctx->needs_input_grad(0)) dx = dy.mm(saved[1]).view(sizes);
    if (ctx->needs_input_grad(1)) dw = dy.t().mm(saved[0].reshape({-1, sizes.back()}));
    if (ctx->needs_input_grad(2)) db = dy.sum(0);
    return {dx, dw, db, torch::Tensor()};
  }
};

}  // namespace

torch::Tensor kept_linear(const void* site, const torch::Tensor& x, const torch::Tensor& weight,
                          const torch::Tensor& bias, double flops) {
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = weight.size(0);
  return kept_op(
      site, shape, flops, [&] { return linear(x, weight, bias); },
      [&](const torch::Tensor& kept) {
        // Under autocast the kept output is in autocast's dtype: the operands are cast as autocast casts them.
        const auto cast = [&](const torch::Tensor& t) { return t.defined() ? t.to(kept.scalar_type()) : t; };
        const torch::Tensor b = bias.defined() ? cast(bias) : torch::empty({0}, kept.options());
        return ReplayedLinear::apply(cast(x), cast(weight), b, kept);
      });
}

torch::Tensor convolution(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                          at::IntArrayRef stride, at::IntArrayRef padding) {
  if (!x.is_meta()) return at::convolution(x, weight, bias, stride, padding, {1}, false, {0}, 1);
  const int64_t axes = weight.dim() - 2;
  memory::CpuConvolution c;
  c.batch = x.size(0), c.in_c = x.size(1), c.out_c = weight.size(0), c.dtype_bytes = x.element_size();
  for (int64_t i = 0; i < axes; ++i) {
    const int64_t s = stride.size() == 1 ? stride[0] : stride[i], p = padding.size() == 1 ? padding[0] : padding[i];
    c.in_sizes.push_back(x.size(2 + i));
    c.kernel.push_back(weight.size(2 + i));
    c.out_sizes.push_back((x.size(2 + i) + 2 * p - weight.size(2 + i)) / s + 1);
    c.strided = c.strided || s != 1;
  }
  std::vector<int64_t> shape = {c.batch, c.out_c};
  shape.insert(shape.end(), c.out_sizes.begin(), c.out_sizes.end());
  torch::Tensor out = torch::empty(shape, x.options());
  if (memory::meta_target() == c10::kCPU)
    memory::meta_spike(memory::cpu_convolution_temporaries(c, at::get_num_threads()));
  return out;
}

torch::Tensor group_norm(const torch::Tensor& x, int64_t groups, const torch::Tensor& weight, const torch::Tensor& bias,
                         double eps) {
  if (!x.is_meta()) return at::group_norm(x, groups, weight, bias, eps);
  const int64_t stats = memory::meta_target() == c10::kCPU ? x.element_size() : 4;
  torch::Tensor out = torch::empty(x.sizes(), x.options());
  memory::meta_spike(2 * x.size(0) * groups * stats);
  return out;
}

namespace {

// where.self on meta with its backward as autograd's (WhereBackward0 saves only the condition): each input's
// gradient is where(condition, grad, 0) — a tensor of the output's shape — summed to the input's shape
// where it was broadcast.
class MetaWhere : public torch::autograd::Function<MetaWhere> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& condition, const torch::Tensor& a,
                               const torch::Tensor& b) {
    ctx->saved_data["a"] = a.sizes().vec();
    ctx->saved_data["b"] = b.sizes().vec();
    const auto shape = at::infer_size(condition.sizes(), at::infer_size(a.sizes(), b.sizes()));
    return torch::empty(shape, a.options().dtype(at::promote_types(a.scalar_type(), b.scalar_type())));
  }
  static tensor_list backward(AutogradContext* ctx, const tensor_list& grads) {
    const torch::Tensor& g = grads[0];
    auto input_grad = [&](const char* which, bool needed) {
      if (!needed) return torch::Tensor();
      return torch::empty(g.sizes(), g.options()).sum_to_size(ctx->saved_data[which].toIntVector());
    };
    return {torch::Tensor(), input_grad("a", ctx->needs_input_grad(1)), input_grad("b", ctx->needs_input_grad(2))};
  }
};

}  // namespace

torch::Tensor where(const torch::Tensor& condition, const torch::Tensor& a, const torch::Tensor& b) {
  if (!condition.is_meta() && !a.is_meta()) return torch::where(condition, a, b);
  return MetaWhere::apply(condition, a, b);
}

torch::Tensor masked_scatter(const torch::Tensor& x, const torch::Tensor& mask, const torch::Tensor& source) {
  if (x.is_meta()) return torch::empty(x.sizes(), x.options());
  return x.masked_scatter(mask, source);
}

torch::Tensor embedding(const torch::Tensor& table, const torch::Tensor& ids) {
  if (!table.is_meta()) return torch::embedding(table, ids);
  std::vector<int64_t> shape = ids.sizes().vec();
  shape.push_back(table.size(1));
  return IndexRows::apply(table, ids.reshape(-1)).view(shape);
}

namespace {

// [N, C, H, W] resized to `size` ({H', W'}), on meta.
torch::Tensor resized_like(const torch::Tensor& x, at::IntArrayRef size) {
  TORCH_CHECK(x.dim() == 4 && size.size() == 2, "a resize takes [N, C, H, W] to {H, W}");
  return torch::empty({x.size(0), x.size(1), size[0], size[1]}, x.options());
}

// Bicubic antialiased resampling of one axis from `in` to `out` samples: its index ranges and weights, in
// bytes (ATen's compute_index_ranges_weights: four int64 per output sample, the weights in double).
int64_t bicubic_axis_bytes(int64_t in, int64_t out) {
  if (in == out) return 0;
  const double support = 2.0 * std::max(static_cast<double>(in) / static_cast<double>(out), 1.0);
  const auto taps = 2 * static_cast<int64_t>(std::ceil(support)) + 1;
  return out * (4 + taps) * 8;
}

}  // namespace

torch::Tensor resize_bilinear(const torch::Tensor& x, at::IntArrayRef size) {
  if (!x.is_meta()) return at::upsample_bilinear2d(x, size, /*align_corners=*/false);
  torch::Tensor out = resized_like(x, size);
  if (memory::meta_target() != c10::kCPU) return out;
  // ATen's float kernel (UpSampleKernel.cpp): the channels-last one — a channels-last copy of the input and
  // of the output beside the output — for a small output (height + width <= 128), a channels-last input of
  // more than 3 channels, or 3 channels on one thread; else the generic separable one, per axis its two
  // source indices (int64) and two weights per output row or column.
  const bool channels_last = size[0] + size[1] <= 128 ||
                             (x.is_contiguous(at::MemoryFormat::ChannelsLast) && x.size(1) > 3) ||
                             (at::get_num_threads() == 1 && x.size(1) == 3);
  memory::meta_spike(channels_last ? x.nbytes() + out.nbytes()
                                   : 2 * (size[0] + size[1]) * (8 + static_cast<int64_t>(x.element_size())));
  return out;
}

torch::Tensor resize_bicubic_aa(const torch::Tensor& x, at::IntArrayRef size) {
  if (!x.is_meta()) return at::_upsample_bicubic2d_aa(x, size, /*align_corners=*/false);
  torch::Tensor out = resized_like(x, size);
  const int64_t h = x.size(2), w = x.size(3), oh = size[0], ow = size[1];
  if (memory::meta_target() != c10::kCPU || (h == oh && w == ow)) return out;
  const int64_t width = bicubic_axis_bytes(w, ow), height = bicubic_axis_bytes(h, oh);
  if (memory::aten_avx2()) {
    const int64_t rgba = 4;  // the unpacked pixels: four channels, a byte each
    memory::meta_spike(rgba * h * w + (w != ow ? rgba * h * ow : 0) + (h != oh ? rgba * oh * ow : 0) + width + height);
  } else if (w != ow && h != oh) {  // the width first, into an intermediate image, then the height into the output
    memory::meta_spike(x.size(1) * h * ow + std::max(width, height));
  } else {
    memory::meta_spike(width + height);
  }
  return out;
}

}  // namespace gclab::nn
