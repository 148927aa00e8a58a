// The layers every network is built from (the transformers, the text encoders), named as diffusers and
// transformers name them so a
// state dict lines up (a Linear's tensors are `weight` / `bias`, its LoRA adapter `lora_A.weight` /
// `lora_B.weight`, as PEFT and AI Toolkit save them).
#pragma once

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gclab/quant/scaled.h"

namespace gclab::nn {

using Tensors = std::vector<torch::Tensor>;

// How a frozen base weight is stored: in a float dtype, or quantized as AI Toolkit's model.qtype stores it
// — qfloat8 (optimum-quanto), float8 and int8 (torchao weight-only; quant/scaled.h), uint2..uint7 (AI
// Toolkit's packed reproduction of torchao's UIntX; quant/uintx.h) — and computed as that library does.
// A Linear whose width uintN cannot group keeps its dtype, as in AI Toolkit.
enum class WeightStorage {
  Float32,
  BFloat16,
  Float16,
  QFloat8,
  Float8,
  Int8,
  UInt2,
  UInt3,
  UInt4,
  UInt5,
  UInt6,
  UInt7
};
// "fp32", "bf16", "fp16", "qfloat8", "float8", "int8", "uint2" ... "uint7".
WeightStorage parse_weight_storage(const std::string& name);
std::string to_string(WeightStorage s);
int uintx_bits(WeightStorage s);     // 2..7 for the uint storages, else 0
bool is_quantized(WeightStorage s);  // qfloat8, float8, int8, uintN: codes the matmul does not take as they are

// Where new parameters' random values are drawn. A model built in host memory for a GPU run (model.low_vram:
// AI Toolkit's loader quantizes it there) would otherwise draw billions of numbers on one CPU thread (about
// 100 s for FLUX.1-dev's 11.9 B); under this guard each parameter built for the CPU is drawn on `device` and
// copied to host memory at once, so the device holds one parameter at a time, and the values are those a
// build on `device` draws. Thread-local, like torch::NoGradGuard; the previous setting is restored on exit.
class DrawOnDevice {
 public:
  explicit DrawOnDevice(const torch::Device& device);
  ~DrawOnDevice();
  DrawOnDevice(const DrawOnDevice&) = delete;
  DrawOnDevice& operator=(const DrawOnDevice&) = delete;

 private:
  std::optional<torch::Device> previous_;
};
// A new parameter of `shape` drawn from U(-bound, bound) (nn.Linear's and nn.Conv2d's default) or from
// N(0, std), placed by `options`, drawn where DrawOnDevice says.
torch::Tensor uniform_parameter(at::IntArrayRef shape, double bound, const torch::TensorOptions& options);
torch::Tensor normal_parameter(at::IntArrayRef shape, double std, const torch::TensorOptions& options);

// nn.Linear with an optional LoRA adapter, an optional frozen accuracy-recovery adapter and an optional
// low-precision frozen weight.
//   y = x W^T + b + s_r * R_B(R_A(x)) + (alpha / rank) * B(A(dropout(x)))
// AI Toolkit's offload rings (toolkit/memory_management/manager_modules.py:20-67: one set per device, shared
// by every offloaded module): the last kOffloadDepth weights brought for forwards, and for backwards. A
// Session makes the set for its device and hands it to the Linears it offloads, so its rings — the memory
// model's meta Session's included — are its own, and go with it.
struct OffloadRings;
std::shared_ptr<OffloadRings> make_offload_rings();

// nn.Linear's arguments, chained as torch::nn::LinearOptions chains them:
// Linear(LinearOptions(in, out).bias(false).tensor_options(o)).
struct LinearOptions {
  LinearOptions(int64_t in_features, int64_t out_features) : in_features_(in_features), out_features_(out_features) {}
  TORCH_ARG(int64_t, in_features);
  TORCH_ARG(int64_t, out_features);
  TORCH_ARG(bool, bias) = true;
  // Where the tensors are placed, in what dtype: torch::kMeta builds a full-size model without memory.
  TORCH_ARG(torch::TensorOptions, tensor_options) = {};
};

class LinearImpl : public torch::nn::Module {
 public:
  explicit LinearImpl(const LinearOptions& options);

  torch::Tensor forward(const torch::Tensor& x);

  // Adds lora_A (rank x in, Kaiming-uniform like PEFT) and lora_B (out x rank, zeros: the adapter starts
  // as a no-op), freezes weight and bias. Calling it twice replaces the adapter.
  void add_lora(int64_t rank, double alpha, double dropout = 0.0);
  bool has_lora() const { return lora_.A.defined(); }
  double lora_scale() const { return lora_.scale; }  // alpha / rank
  // Scales the adapter's output by `m` on top of lora_scale (AI Toolkit's network.multiplier, which a
  // preview's `--m` / network_multiplier sets: toolkit/network_mixins.py:289-320); 0 skips the adapter.
  void set_lora_multiplier(double m) { lora_.multiplier = m; }
  double lora_multiplier() const { return lora_.multiplier; }
  // A frozen LoRA beside the weight (AI Toolkit's accuracy-recovery adapter: trained to make up for what
  // the quantized weight lost): down [rank, in] and up [out, rank], kept in their dtype as the buffers
  // `recovery_A` / `recovery_B` — not parameters, so no optimizer, weight file or LoRA file sees them.
  void add_recovery_adapter(const torch::Tensor& down, const torch::Tensor& up, double scale);
  bool has_recovery_adapter() const { return recovery_.A.defined(); }
  // A frozen LoRA kept beside a weight it was merged into (AI Toolkit's assistant / training adapter, whose
  // network stays attached inactive and runs at multiplier -1 while sampling: the merged update taken back
  // out). down [rank, in], up [out, rank] as the buffers `assistant_A` / `assistant_B`; it adds
  // multiplier * scale * up(down(x)) — nothing while the multiplier is 0, as it is until
  // set_assistant_multiplier says otherwise.
  void add_assistant_adapter(const torch::Tensor& down, const torch::Tensor& up, double scale);
  bool has_assistant_adapter() const { return assistant_.A.defined(); }
  void set_assistant_multiplier(double m) { assistant_.multiplier = m; }
  // Moves the assistant adapter's matrices where `place` puts them (the device to sample, host memory after).
  void place_assistant_adapter(const std::function<torch::Tensor(const torch::Tensor&)>& place);
  // Stores the weight as `storage`, frozen: the codes in `weight` (float8 / int8 / packed uint8), the
  // scales in buffers — `weight_scale` (+ `weight_zero_point` for int8), `uintx_scale` / `uintx_zero_point`
  // for uintN. Not for trained weights.
  void set_weight_storage(WeightStorage storage);
  WeightStorage weight_storage() const { return storage_.kind; }
  // The most set_weight_storage(storage) holds at once above what this Linear held before it: the
  // quantization's temporaries and its result (quant's walks), or the converted copy; the old weight goes
  // only after. 0 when it would change nothing.
  int64_t storage_peak_bytes(WeightStorage storage) const;
  // Replaces the weight's values (any dtype, this shape), kept in the current storage.
  void set_weight(const torch::Tensor& values);
  // The weight as the matmul sees it (dequantized), in `dtype`.
  torch::Tensor effective_weight(torch::ScalarType dtype) const;

  // Moves the frozen weight's tensors (codes or values, scales, bias, recovery adapter) to host memory, each
  // placed by `to_host` (pinned memory on a GPU run; HostScope-counted on a CPU run), and from then on
  // brings them to the input's device for every call and again for the backward, as AI Toolkit's layer
  // offloading does (toolkit/memory_management, after RamTorch): autograd keeps the host tensors, and the
  // last kOffloadDepth (4) weights brought for forwards, and for backwards, stay in ring slots. The weight
  // is frozen from then on; the LoRA adapter stays on the device.
  // `rings`: the Session's (make_offload_rings), shared by every Linear it offloads.
  void offload(const std::function<torch::Tensor(const torch::Tensor&)>& to_host, std::shared_ptr<OffloadRings> rings);
  bool offloaded() const { return offload_.on; }
  // The bytes of the weight-sized copy the quantized matmul builds and autograd keeps for the input's
  // gradient (float8, int8, uintN: the library's F.linear / mm takes a dequantized or cast weight); 0 for
  // a float weight, and for qfloat8, whose autograd function keeps only the quantized weight.
  int64_t dequantized_bytes() const;
  // The weight's logical shape, [out, in], however it is stored.
  std::vector<int64_t> weight_shape() const { return {out_, in_}; }
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

  torch::Tensor weight, bias;

 private:
  quant::ScaledWeight scaled() const;  // the qfloat8 / float8 / int8 weight as quant/scaled.h takes it
  friend struct FrozenAccess;          // layers.cpp: the frozen parts, for its autograd functions

  // Its parts: how the weight is stored, the trained adapter, the frozen adapters beside the weight, and
  // whether (and through which rings) the weight is offloaded.
  struct Storage {
    WeightStorage kind = WeightStorage::Float32;
    torch::Tensor scale, zero_point;                  // qfloat8, float8, int8
    torch::Tensor uintx_scale, uintx_zero_point;      // uint2..uint7
    torch::ScalarType dequant_dtype = torch::kFloat;  // what a quantized weight dequantizes to
  };
  struct Lora {
    torch::Tensor A, B;  // registered as lora_A.weight / lora_B.weight
    double scale = 1.0, dropout = 0.0, multiplier = 1.0;
  };
  struct FrozenAdapter {  // buffers, not parameters: the accuracy-recovery adapter, the assistant adapter
    torch::Tensor A, B;
    double scale = 1.0, multiplier = 1.0;
  };
  struct Offload {
    bool on = false;
    std::shared_ptr<OffloadRings> rings;  // where the weights brought stay
  };
  int64_t in_, out_;
  Storage storage_;
  Lora lora_;
  FrozenAdapter recovery_;
  FrozenAdapter assistant_{{}, {}, 1.0, /*multiplier=*/0.0};  // inactive until sampling sets it
  Offload offload_;
};
TORCH_MODULE(Linear);

// The offloaded Linears' ring slots (weights brought to the device, kept until overwritten): their bytes now,
// and releasing them (a Session's end).
int64_t offload_buffer_bytes(const OffloadRings& rings);
void release_offload_buffers(OffloadRings& rings);
// The bytes the offloaded Linears under `root` keep in host memory (their own tensors; not their LoRA).
int64_t offloaded_bytes(torch::nn::Module& root);
// What offloading holds on the device for them, as predicted: both rings full of weights (and biases) in
// the compute dtype (`element_bytes` each) at the offloaded Linears' mean size, plus bringing the largest
// one (its stored tensors' copy and the dequantization's intermediate beside its result).
int64_t offload_device_bytes(torch::nn::Module& root, int64_t element_bytes);

// down(silu(gate(x)) * up(x)) — the SwiGLU MLP of the Qwen language models and the Qwen2.5-VL vision tower —
// holding at most three intermediates at once, as PyTorch's eager forward does (the gate's output is freed
// once activated): an inference forward's peak, as transformers' has it.
torch::Tensor swiglu(LinearImpl& gate, LinearImpl& up, LinearImpl& down, const torch::Tensor& x);

// Registers `module` under `parent` at a dotted path ("norm1.linear", "to_out.0", "img_mod.1"), creating
// empty holder modules for the intermediate names, so parameter names match state dicts whose layers
// sit inside wrappers or nn.Sequential containers.
torch::nn::Module& holder_at(torch::nn::Module& parent, const std::string& dotted_parent);
template <class M>
M register_at(torch::nn::Module& parent, const std::string& path, M module) {
  const auto dot = path.rfind('.');
  if (dot == std::string::npos) return parent.register_module(path, module);
  return holder_at(parent, path.substr(0, dot)).register_module(path.substr(dot + 1), module);
}

// RMSNorm as diffusers computes it: in float32, then scaled by `weight` (if any) in the weight's dtype.
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps, bool affine = true, const torch::TensorOptions& options = {});
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

// nn.Conv2d / nn.Conv3d (one group, no dilation): `weight` [out, in, kernel...] and `bias` [out], drawn as
// PyTorch initialises them, placed by `options` (torch::kMeta: a walk on shapes alone); forward through
// convolution (nn/meta_kernels.h). The axes are the kernel's; a single stride or padding applies to each.
class ConvImpl : public torch::nn::Module {
 public:
  ConvImpl(int64_t in, int64_t out, std::vector<int64_t> kernel, std::vector<int64_t> stride = {1},
           std::vector<int64_t> padding = {0}, const torch::TensorOptions& options = {});
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;
  std::vector<int64_t> stride, padding;
};
TORCH_MODULE(Conv);
// A 2-D Conv with a square kernel, stride and padding.
Conv square_conv(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding,
                 const torch::TensorOptions& options);

// nn.GroupNorm with its affine `weight` (ones) and `bias` (zeros), placed by `options`.
class GroupNormImpl : public torch::nn::Module {
 public:
  GroupNormImpl(int64_t groups, int64_t channels, double eps, const torch::TensorOptions& options = {});
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;
  int64_t groups;
  double eps;
};
TORCH_MODULE(GroupNorm);

// LayerNorm over the last dimension without affine parameters (the adaLN blocks' norm).
torch::Tensor layer_norm(const torch::Tensor& x, double eps = 1e-6);

// adaLN modulation: x * (1 + scale) + shift, with scale/shift of shape [B, D] broadcast over tokens.
torch::Tensor modulate(const torch::Tensor& x, const torch::Tensor& shift, const torch::Tensor& scale);

// Sinusoidal timestep features [cos | sin] of width `dim` (diffusers Timesteps with flip_sin_to_cos and
// shift 0; DiT's and Z-Image's timestep_embedding are the same function), computed in float32.
torch::Tensor timestep_embedding(const torch::Tensor& t, int64_t dim, double max_period = 10000.0);

// Multi-axis rotary position embedding (FLUX, Qwen-Image, Z-Image): each axis gets `axes_dims[i]` of the
// head dimension; `ids` [S, n_axes] holds each token's position on each axis. Returns cos and sin of
// shape [S, head_dim], each frequency repeated for the (even, odd) pair it rotates.
std::pair<torch::Tensor, torch::Tensor> rope_cos_sin(const torch::Tensor& ids, const std::vector<int64_t>& axes_dims,
                                                     double theta);
// Rotates interleaved pairs of x [B, H, S, D]: (x0, x1) -> (x0 cos - x1 sin, x1 cos + x0 sin).
torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
// Rotates the halves of x's last axis (transformers' rotate_half: (a, b) -> (-b, a)): x cos + rotate_half(x)
// sin, in x's dtype with cos and sin broadcast (Qwen's language models and vision tower).
torch::Tensor apply_rope_half(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

// [B, S, H*D] -> [B, H, S, D] and back.
torch::Tensor split_heads(const torch::Tensor& x, int64_t heads);
// The value an additive attention mask puts where a key is hidden: the dtype's lowest finite value
// (torch.finfo(dtype).min, as transformers' masks use).
double lowest_value(torch::ScalarType dtype);
// The additive mask of causal self-attention over `length` tokens, [1, 1, T, T] — or [B, 1, T, T] with
// `attention_mask` [B, T] (1 token, 0 padding): lowest_value where a key comes after the query or is
// padding, else 0, in `options`' dtype and device (CLIP's text model, the Qwen language models).
torch::Tensor causal_additive_mask(int64_t length, const torch::Tensor& attention_mask,
                                   const torch::TensorOptions& options);
torch::Tensor merge_heads(const torch::Tensor& x);

// Fixed 2-D sine-cosine position embedding [h*w, dim] (MAE / DiT / SD3 PatchEmbed), grid positions
// divided by `scale`, rows (h) on the second half of the channels as in get_2d_sincos_pos_embed; computed
// in float64 on `device` (the run's: its temporaries are the device's, as the meta walk counts them).
torch::Tensor sincos_2d(int64_t h, int64_t w, int64_t dim, const torch::Device& device, double scale = 1.0,
                        int64_t h_offset = 0, int64_t w_offset = 0);

// Latent [B, C, H, W] <-> tokens [B, (H/p)(W/p), C p p], channels first within a patch (FLUX/Qwen pack
// order: c, py, px) or last (Z-Image, DiT/SD3 unpatchify order: py, px, c).
torch::Tensor patchify(const torch::Tensor& latents, int64_t p, bool channels_last);
torch::Tensor unpatchify(const torch::Tensor& tokens, int64_t h, int64_t w, int64_t p, int64_t channels,
                         bool channels_last);

// Every Linear in a module tree, with its dotted path (for LoRA targets and weight storage).
std::vector<std::pair<std::string, Linear>> named_linears(torch::nn::Module& root);

// What a module tree holds: its parameters' and buffers' bytes as stored (codes, scales, adapters).
int64_t module_bytes(const torch::nn::Module& root);

// What storing Linears' weights one after the other did to memory: the most it rose above its start
// meanwhile (one Linear's quantization on top of what the earlier ones freed), and the net change.
struct StorageChange {
  int64_t peak_above_bytes = 0;
  int64_t net_bytes = 0;
  void add(const StorageChange& later);  // `later` ran after this one
};
// Stores each Linear's weight as `storage`, in order, as a loader quantizes a model; returns the change.
StorageChange store_weights(const std::vector<std::pair<std::string, Linear>>& linears, WeightStorage storage);
// One Linear's set_weight_storage, and the change it made.
StorageChange store_weight(LinearImpl& linear, WeightStorage storage);

}  // namespace gclab::nn
