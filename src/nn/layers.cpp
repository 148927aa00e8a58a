#include "gclab/nn/layers.h"

#include "gclab/ckpt/saved_ops.h"
#include "gclab/memory/flops.h"
#include "gclab/nn/meta_kernels.h"

#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/custom_function.h>

#include <array>
#include <cmath>
#include <functional>
#include <optional>
#include <stdexcept>

#include "gclab/quant/scaled.h"
#include "gclab/quant/uintx.h"

namespace gclab::nn {

namespace F = torch::nn::functional;

WeightStorage parse_weight_storage(const std::string& name) {
  if (name == "fp32" || name == "float32") return WeightStorage::Float32;
  if (name == "bf16" || name == "bfloat16") return WeightStorage::BFloat16;
  if (name == "fp16" || name == "float16") return WeightStorage::Float16;
  if (name == "qfloat8") return WeightStorage::QFloat8;
  if (name == "float8") return WeightStorage::Float8;
  if (name == "int8") return WeightStorage::Int8;
  for (int bits = 2; bits <= 7; ++bits)
    if (name == "uint" + std::to_string(bits))
      return static_cast<WeightStorage>(static_cast<int>(WeightStorage::UInt2) + bits - 2);
  throw std::invalid_argument("unknown weight storage '" + name +
                              "' (fp32, bf16, fp16, qfloat8, float8, int8, uint2 ... uint7)");
}

std::string to_string(WeightStorage s) {
  switch (s) {
    case WeightStorage::Float32:
      return "fp32";
    case WeightStorage::BFloat16:
      return "bf16";
    case WeightStorage::Float16:
      return "fp16";
    case WeightStorage::QFloat8:
      return "qfloat8";
    case WeightStorage::Float8:
      return "float8";
    case WeightStorage::Int8:
      return "int8";
    default:
      return "uint" + std::to_string(uintx_bits(s));
  }
}

int uintx_bits(WeightStorage s) {
  const int i = static_cast<int>(s) - static_cast<int>(WeightStorage::UInt2);
  return i >= 0 && i <= 5 ? i + 2 : 0;
}

namespace {
// Autocast for a device kind; the meta device has none (LibTorch throws when asked).
bool autocast_on(c10::DeviceType type) { return type != c10::kMeta && at::autocast::is_autocast_enabled(type); }

std::optional<quant::ScaledType> scaled_type(WeightStorage s) {
  switch (s) {
    case WeightStorage::QFloat8:
      return quant::ScaledType::qfloat8;
    case WeightStorage::Float8:
      return quant::ScaledType::float8;
    case WeightStorage::Int8:
      return quant::ScaledType::int8;
    default:
      return std::nullopt;
  }
}
}  // namespace

bool is_quantized(WeightStorage s) { return scaled_type(s) || uintx_bits(s); }

namespace {

// Matches x's dtype unless autocast will cast the matmul's operands anyway.
torch::Tensor for_input(const torch::Tensor& t, const torch::Tensor& x) {
  if (!t.defined() || t.scalar_type() == x.scalar_type()) return t;
  if (autocast_on(x.device().type())) return t;
  return t.to(x.scalar_type());
}
// A frozen weight as stored: its codes (or values), the scales that go with them, and how to rebuild it.
struct Stored {
  WeightStorage storage = WeightStorage::Float32;
  torch::Tensor weight, scale, zero_point;
  torch::ScalarType dequant_dtype = torch::kFloat;
  int64_t out = 0, in = 0;

  // The weight as the matmul takes it, in the dtype it was quantized from (a float weight as it is).
  torch::Tensor dequantize() const {
    if (const int bits = uintx_bits(storage)) {
      quant::UIntXWeight q;
      q.bits = bits, q.out_features = out, q.in_features = in;
      q.packed = weight, q.scale = scale, q.zero_point = zero_point;
      return quant::dequantize_uintx(q);
    }
    if (const auto type = scaled_type(storage)) {
      quant::ScaledWeight q;
      q.type = *type, q.data = weight, q.scale = scale, q.zero_point = zero_point, q.dtype = dequant_dtype;
      return quant::dequantize_scaled(q);
    }
    return weight;
  }
  Stored on(const torch::Device& device) const {  // a copy on `device`, even when it is the same device
    Stored s = *this;
    auto copy = [&](const torch::Tensor& t) {
      return t.defined() ? t.to(device, /*non_blocking=*/true, /*copy=*/true) : t;
    };
    s.weight = copy(weight), s.scale = copy(scale), s.zero_point = copy(zero_point);
    return s;
  }
};

// The frozen parts of a Linear handed to the autograd functions below as one argument (LibTorch's custom
// functions take no undefined tensors; these are not inputs that get gradients anyway).
struct Frozen {
  Stored stored;
  torch::Tensor bias, recovery_a, recovery_b;
  double recovery_scale = 1.0;
  OffloadRings* rings = nullptr;  // an offloaded Linear's: its Session's
};

// Keeps a frozen tensor for the backward (an undefined one is simply not kept).
void keep(torch::autograd::AutogradContext* ctx, const char* key, const torch::Tensor& t) {
  if (t.defined()) ctx->saved_data[key] = t;
}
torch::Tensor kept(torch::autograd::AutogradContext* ctx, const char* key) {
  const auto it = ctx->saved_data.find(key);
  return it == ctx->saved_data.end() ? torch::Tensor() : it->second.toTensor();
}

// y = x W^T + b for optimum-quanto's qfloat8 weight (its WeightQBytesLinearFunction): keeps the float8
// codes and their scale for the backward, never a dequantized copy, and dequantizes again there.
class QFloat8Linear : public torch::autograd::Function<QFloat8Linear> {
 public:
  // `kept`: the output a selective:ops forward kept (ckpt/saved_ops.h): handed back, nothing run.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const Frozen& f,
                               const std::vector<torch::Tensor>& kept = {}) {
    keep(ctx, "data", f.stored.weight);
    keep(ctx, "scale", f.stored.scale);
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    if (!kept.empty()) return kept[0].variable_data();
    // quanto's qbytes_mm: activations and codes in the scale's dtype, the scale on the codes.
    const torch::Tensor w = f.stored.dequantize();
    const torch::Tensor y = torch::matmul(x.to(w.scalar_type()), w.t());
    return (f.bias.defined() ? y + f.bias.to(y.scalar_type()) : y).to(x.scalar_type());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    Stored s;
    s.storage = WeightStorage::QFloat8, s.weight = kept(ctx, "data"), s.scale = kept(ctx, "scale");
    s.dequant_dtype = s.scale.scalar_type();
    s.out = s.weight.size(0), s.in = s.weight.size(1);  // one code per element
    const torch::Tensor& g = grad[0];
    const auto x_dtype = static_cast<torch::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    return {torch::matmul(g, s.dequantize().to(g.scalar_type())).to(x_dtype), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

// AI Toolkit's layer offloading (toolkit/memory_management/manager_modules.py, after RamTorch): the last
// kOffloadDepth weights brought to the device for a forward, and for a backward, stay in ring slots
// until overwritten (its PIPELINE_DEPTH, 4 by default).
// On CUDA each slot is staged as manager_modules.py's _stage_forward_weight / _stage_backward_weight do it:
// on a transfer stream of its own, the copy (and the dequantization) into slot i waiting only for the
// compute that last read slot i (its `freed` event), the compute stream waiting for the copy (`ready`);
// the host enqueues ahead of the device, so the next layers' copies overlap this one's compute.
constexpr size_t kOffloadDepth = 4;
struct OffloadRing {
  std::array<std::pair<torch::Tensor, torch::Tensor>, kOffloadDepth> slots;  // weight, bias
  size_t clock = 0;
  std::optional<c10::cuda::CUDAStream> transfer;  // CUDA: created on the first staging
  std::array<at::cuda::CUDAEvent, kOffloadDepth> ready, freed;
  // The next slot (its previous weight released before the new one arrives) and its index.
  std::pair<std::pair<torch::Tensor, torch::Tensor>&, size_t> next() {
    const size_t index = clock;
    clock = (clock + 1) % kOffloadDepth;
    slots[index] = {};
    return {slots[index], index};
  }
  c10::cuda::CUDAStream& stream_for(const torch::Device& device) {
    if (!transfer || transfer->device_index() != device.index()) {
      transfer = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
      ready = {}, freed = {};
    }
    return *transfer;
  }
};
// One pair of rings (forward, backward) per Session, for the device it runs on.
struct OffloadRings {
  OffloadRing forward, backward;
};

namespace {

// The weight (dequantized, in the dtype the matmul computes in) and bias brought from host memory into a ring slot; on
// CUDA staged on the ring's transfer stream (above). The caller computes with it, then calls release().
struct Brought {
  const torch::Tensor& weight;
  const torch::Tensor& bias;
  size_t index;
};
// The dtype the matmul computes in: autocast's where autocast is on for the input's device (F::linear casts
// both operands to it, so a slot in the input's float32 would hold twice the bytes for nothing), else the
// input's.
torch::ScalarType compute_dtype(const torch::Tensor& x) {
  const c10::DeviceType type = x.device().type();
  if (at::isFloatingType(x.scalar_type()) && autocast_on(type)) return at::autocast::get_autocast_dtype(type);
  return x.scalar_type();
}

Brought bring(OffloadRing& ring, const Stored& host, const torch::Tensor& bias, const torch::Tensor& x) {
  auto [slot, index] = ring.next();
  const torch::ScalarType dtype = compute_dtype(x);
  auto materialize = [&, &slot = slot] {
    torch::Tensor w = host.on(x.device()).dequantize();
    slot.first = w.scalar_type() == dtype ? w : w.to(dtype);
    if (bias.defined()) slot.second = bias.to(x.device(), dtype, /*non_blocking=*/true, /*copy=*/true);
  };
  if (!x.is_cuda()) {
    materialize();
    return {slot.first, slot.second, index};
  }
  c10::cuda::CUDAStream& transfer = ring.stream_for(x.device());
  const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(x.device().index());
  {
    const c10::cuda::CUDAStreamGuard on_transfer(transfer);
    ring.freed[index].block(transfer);
    materialize();
    ring.ready[index].record(transfer);
  }
  ring.ready[index].block(compute);
  // Allocated on the transfer stream, read on the compute stream: the allocator must not hand the memory
  // out again before the compute stream is done with it.
  for (torch::Tensor* t : {&slot.first, &slot.second})
    if (t->defined()) t->record_stream(compute);
  return {slot.first, slot.second, index};
}

// The compute that read a slot is enqueued: the slot may be overwritten once it has run.
void release(OffloadRing& ring, const Brought& brought, const torch::Device& device) {
  if (device.is_cuda()) ring.freed[brought.index].record(c10::cuda::getCurrentCUDAStream(device.index()));
}

// y = x W^T + b (+ the recovery adapter's s * (x A^T) B^T) for a Linear whose frozen tensors live in host
// memory: brought to the input's device for the forward and again for the backward; autograd keeps the
// host tensors only.
class OffloadedLinear : public torch::autograd::Function<OffloadedLinear> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const Frozen& f) {
    keep(ctx, "weight", f.stored.weight);
    keep(ctx, "scale", f.stored.scale);
    keep(ctx, "zero_point", f.stored.zero_point);
    keep(ctx, "recovery_a", f.recovery_a);
    keep(ctx, "recovery_b", f.recovery_b);
    ctx->saved_data["storage"] = static_cast<int64_t>(f.stored.storage);
    ctx->saved_data["dequant_dtype"] = static_cast<int64_t>(f.stored.dequant_dtype);
    ctx->saved_data["out"] = f.stored.out;
    ctx->saved_data["in"] = f.stored.in;
    ctx->saved_data["recovery_scale"] = f.recovery_scale;
    // The Linear's rings outlive its graph (the Linear holds them), so the backward may find them by address.
    ctx->saved_data["rings"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(f.rings));
    const Brought brought = bring(f.rings->forward, f.stored, f.bias, x);
    torch::Tensor y = F::linear(x, brought.weight, brought.bias);
    release(f.rings->forward, brought, x.device());
    if (f.recovery_a.defined()) {
      const torch::Tensor a = f.recovery_a.to(x.device(), x.scalar_type(), true, true);
      const torch::Tensor up = f.recovery_b.to(x.device(), x.scalar_type(), true, true);
      y = y + F::linear(F::linear(x, a), up) * f.recovery_scale;
    }
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    const torch::Tensor& g = grad[0];
    const Stored host{static_cast<WeightStorage>(ctx->saved_data["storage"].toInt()),
                      kept(ctx, "weight"),
                      kept(ctx, "scale"),
                      kept(ctx, "zero_point"),
                      static_cast<torch::ScalarType>(ctx->saved_data["dequant_dtype"].toInt()),
                      ctx->saved_data["out"].toInt(),
                      ctx->saved_data["in"].toInt()};
    OffloadRing& ring =
        reinterpret_cast<OffloadRings*>(static_cast<intptr_t>(ctx->saved_data["rings"].toInt()))->backward;
    const Brought brought = bring(ring, host, torch::Tensor(), g);
    torch::Tensor dx = torch::matmul(g, brought.weight);
    release(ring, brought, g.device());
    if (const torch::Tensor ra = kept(ctx, "recovery_a"); ra.defined()) {
      const torch::Tensor a = ra.to(g.device(), g.scalar_type(), true, true);
      const torch::Tensor up = kept(ctx, "recovery_b").to(g.device(), g.scalar_type(), true, true);
      dx = dx + torch::matmul(torch::matmul(g, up), a) * ctx->saved_data["recovery_scale"].toDouble();
    }
    return {dx, torch::Tensor()};
  }
};

}  // namespace

// The Linear's frozen parts as the autograd functions above take them.
struct FrozenAccess {
  static Frozen of(const LinearImpl& l) {
    const bool uint = uintx_bits(l.storage_.kind) != 0;
    Frozen f;
    f.stored = Stored{l.storage_.kind,
                      l.weight,
                      uint ? l.storage_.uintx_scale : l.storage_.scale,
                      uint ? l.storage_.uintx_zero_point : l.storage_.zero_point,
                      l.storage_.dequant_dtype,
                      l.out_,
                      l.in_};
    f.bias = l.bias, f.recovery_a = l.recovery_.A, f.recovery_b = l.recovery_.B, f.recovery_scale = l.recovery_.scale;
    f.rings = l.offload_.rings.get();
    return f;
  }
};

int64_t offloaded_bytes(torch::nn::Module& root) {
  int64_t bytes = 0;
  for (auto& [path, linear] : named_linears(root)) {
    if (!linear->offloaded()) continue;
    for (const auto& t : linear->parameters(/*recurse=*/false)) bytes += static_cast<int64_t>(t.nbytes());
    for (const auto& t : linear->buffers(/*recurse=*/false)) bytes += static_cast<int64_t>(t.nbytes());
  }
  return bytes;
}

int64_t offload_device_bytes(torch::nn::Module& root, int64_t element_bytes) {
  // The rings: 2 x kOffloadDepth weights (and biases) in the compute dtype, each ring holding whichever
  // Linears ran last — counted at the offloaded Linears' mean size. Bringing one: its stored tensors copied
  // to the device and the dequantization's intermediate beside its result — at the largest one.
  int64_t total = 0, n = 0, bringing = 0;
  for (auto& [path, linear] : named_linears(root)) {
    if (!linear->offloaded()) continue;
    const int64_t out = linear->out_features(), in = linear->in_features();
    total += (out * in + out) * element_bytes;
    ++n;
    int64_t stored = 0;
    for (const auto& t : linear->parameters(/*recurse=*/false)) stored += static_cast<int64_t>(t.nbytes());
    for (const auto& t : linear->buffers(/*recurse=*/false)) stored += static_cast<int64_t>(t.nbytes());
    bringing = std::max(bringing, stored + 2 * out * in * element_bytes);
  }
  return n == 0 ? 0 : 2 * static_cast<int64_t>(kOffloadDepth) * total / n + bringing;
}

std::shared_ptr<OffloadRings> make_offload_rings() { return std::make_shared<OffloadRings>(); }

void release_offload_buffers(OffloadRings& rings) { rings.forward = OffloadRing(), rings.backward = OffloadRing(); }

int64_t offload_buffer_bytes(const OffloadRings& rings) {
  int64_t bytes = 0;
  for (const OffloadRing* ring : {&rings.forward, &rings.backward})
    for (const auto& [w, b] : ring->slots)
      bytes +=
          (w.defined() ? static_cast<int64_t>(w.nbytes()) : 0) + (b.defined() ? static_cast<int64_t>(b.nbytes()) : 0);
  return bytes;
}

namespace {
thread_local std::optional<torch::Device> draw_device;

torch::Tensor drawn(at::IntArrayRef shape, const torch::TensorOptions& options,
                    const std::function<void(torch::Tensor&)>& draw) {
  const bool staged = draw_device && options.device().is_cpu();
  torch::Tensor t = torch::empty(shape, staged ? options.device(*draw_device) : options);
  draw(t);
  return staged ? t.to(torch::kCPU) : t;
}
}  // namespace

DrawOnDevice::DrawOnDevice(const torch::Device& device) : previous_(draw_device) { draw_device = device; }
DrawOnDevice::~DrawOnDevice() { draw_device = previous_; }

torch::Tensor uniform_parameter(at::IntArrayRef shape, double bound, const torch::TensorOptions& options) {
  return drawn(shape, options, [bound](torch::Tensor& t) { t.uniform_(-bound, bound); });
}
torch::Tensor normal_parameter(at::IntArrayRef shape, double std, const torch::TensorOptions& options) {
  return drawn(shape, options, [std](torch::Tensor& t) { t.normal_(0, std); });
}

LinearImpl::LinearImpl(const LinearOptions& o) : in_(o.in_features()), out_(o.out_features()) {
  // nn.Linear's default initialisation: U(-1/sqrt(in), 1/sqrt(in)) for weight and bias.
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_));
  weight = register_parameter("weight", uniform_parameter({out_, in_}, bound, o.tensor_options()));
  if (o.bias()) bias = register_parameter("bias", uniform_parameter({out_}, bound, o.tensor_options()));
}

int64_t LinearImpl::dequantized_bytes() const {
  if (offload_.on) return 0;  // autograd keeps the host tensors
  const bool copies =
      uintx_bits(storage_.kind) || storage_.kind == WeightStorage::Float8 || storage_.kind == WeightStorage::Int8;
  return copies ? out_ * in_ * static_cast<int64_t>(c10::elementSize(storage_.dequant_dtype)) : 0;
}

quant::ScaledWeight LinearImpl::scaled() const {
  quant::ScaledWeight q;
  q.type = *scaled_type(storage_.kind);
  q.data = weight, q.scale = storage_.scale, q.zero_point = storage_.zero_point, q.dtype = storage_.dequant_dtype;
  return q;
}

torch::Tensor LinearImpl::effective_weight(torch::ScalarType dtype) const {
  const torch::Tensor w = FrozenAccess::of(*this).stored.dequantize();
  return w.scalar_type() == dtype ? w : w.to(dtype);
}

void LinearImpl::offload(const std::function<torch::Tensor(const torch::Tensor&)>& to_host,
                         std::shared_ptr<OffloadRings> rings) {
  if (!rings) throw std::invalid_argument("an offloaded Linear needs its Session's rings");
  offload_.rings = std::move(rings);
  torch::NoGradGuard no_grad;
  // Frozen from here on (a LoRA base, a text encoder): the backward brings the weight for the input's
  // gradient only.
  weight.set_requires_grad(false);
  if (bias.defined()) bias.set_requires_grad(false);
  for (torch::Tensor* t : {&weight, &bias, &storage_.scale, &storage_.zero_point, &storage_.uintx_scale,
                           &storage_.uintx_zero_point, &recovery_.A, &recovery_.B})
    if (t->defined()) t->set_data(to_host(*t));
  offload_.on = true;
}

torch::Tensor LinearImpl::forward(const torch::Tensor& x) {
  // 2·rows·in·out for the weight, and for each adapter on (in -> rank -> out).
  const double rows = static_cast<double>(x.numel() / std::max<int64_t>(in_features(), 1));
  const double weight_flops = 2 * rows * static_cast<double>(in_features()) * static_cast<double>(out_features());
  // selective:ops keeps the weight's matmul (kept_linear, kept_op count its FLOPs) but an offloaded or int8 one's.
  const bool keepable = !offload_.on && storage_.kind != WeightStorage::Int8;
  if (memory::counting_flops()) {
    if (!keepable) memory::add_flops(weight_flops);
    for (const torch::Tensor* down : {&recovery_.A, &assistant_.A, &lora_.A})
      if (down->defined() && !(down == &recovery_.A && offload_.on) &&
          !(down == &assistant_.A && assistant_.multiplier == 0) && !(down == &lora_.A && lora_.multiplier == 0))
        memory::add_flops(
            2 * rows * static_cast<double>(down->size(0)) * static_cast<double>(in_features() + out_features()),
            /*adapter=*/true);
  }
  torch::Tensor y;
  if (offload_.on)
    y = OffloadedLinear::apply(x, FrozenAccess::of(*this));
  else if (storage_.kind == WeightStorage::QFloat8 && ((torch::GradMode::is_enabled() && x.requires_grad()) ||
                                                       ckpt::SavedOps::recording() || ckpt::SavedOps::replaying())) {
    // Its autograd function's forward, also where selective:ops keeps the output (as GC off computes it) and
    // where the recompute hands it back with this function's backward.
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = out_features();
    y = kept_op(
        this, shape, weight_flops, [&] { return QFloat8Linear::apply(x, FrozenAccess::of(*this)); },
        [&](const torch::Tensor& kept) {
          return QFloat8Linear::apply(x, FrozenAccess::of(*this), std::vector<torch::Tensor>{kept});
        });
  } else if (storage_.kind == WeightStorage::Int8)
    y = bias.defined() ? quant::scaled_matmul(x, scaled()) + for_input(bias, x) : quant::scaled_matmul(x, scaled());
  else if (!is_quantized(storage_.kind))
    y = kept_linear(this, x, for_input(weight, x), for_input(bias, x), weight_flops);
  else
    // The frozen weight dequantized without a graph (AI Toolkit's uintN; torchao's float8 fallback); under
    // selective:ops dequantized again in the recompute, for the replay's backward.
    y = kept_linear(this, x, for_input(effective_weight(storage_.dequant_dtype), x), for_input(bias, x), weight_flops);
  if (recovery_.A.defined() && !offload_.on) {
    // AI Toolkit's LoRAModule.forward for the adapter: org_forward(x) + up(down(x)) * multiplier * scale.
    const torch::Tensor h = gclab::nn::linear(x, for_input(recovery_.A, x));
    y = y + gclab::nn::linear(h, for_input(recovery_.B, h)) * recovery_.scale;
  }
  if (assistant_.A.defined() && assistant_.multiplier != 0) {
    const torch::Tensor h = gclab::nn::linear(x, for_input(assistant_.A, x));
    y = y + gclab::nn::linear(h, for_input(assistant_.B, h)) * (assistant_.scale * assistant_.multiplier);
  }
  if (lora_.A.defined() && lora_.multiplier != 0) {
    // AI Toolkit's LoRAModule.forward (toolkit/network_mixins.py:303-318, _call_forward :197-240): the input
    // cast to the adapter's dtype ("always cast to float32": a bf16 model's input is copied to float32 for
    // it, a copy lora_down keeps for its weight's gradient), lora_down, dropout on its rank-sized output
    // (B x tokens x rank), lora_up, scale and multiplier, the result cast back to the base output's dtype.
    // Under autocast (not AI Toolkit's: gclab runs none) autocast picks the dtype instead.
    const torch::Tensor xa = autocast_on(x.device().type()) ? x : x.to(lora_.A.scalar_type());
    torch::Tensor h = gclab::nn::linear(xa, for_input(lora_.A, xa));
    if (lora_.dropout > 0) h = torch::dropout(h, lora_.dropout, is_training());
    y = y + (gclab::nn::linear(h, for_input(lora_.B, h)) * (lora_.scale * lora_.multiplier)).to(y.scalar_type());
  }
  return y;
}

namespace {

// A frozen adapter's matrices for a Linear in -> out: down [rank, in], up [out, rank].
void check_adapter(int64_t in, int64_t out, const torch::Tensor& down, const torch::Tensor& up) {
  TORCH_CHECK(down.dim() == 2 && up.dim() == 2 && down.size(1) == in && up.size(0) == out && up.size(1) == down.size(0),
              "an adapter for a Linear ", in, " -> ", out, " must be [rank, ", in, "] and [", out, ", rank]; got ",
              down.sizes(), " and ", up.sizes());
}

}  // namespace

void LinearImpl::add_recovery_adapter(const torch::Tensor& down, const torch::Tensor& up, double scale) {
  check_adapter(in_, out_, down, up);
  TORCH_CHECK(!recovery_.A.defined(), "the Linear already has an accuracy-recovery adapter");
  recovery_.A = register_buffer("recovery_A", down.to(weight.device()));
  recovery_.B = register_buffer("recovery_B", up.to(weight.device()));
  recovery_.scale = scale;
}

void LinearImpl::add_assistant_adapter(const torch::Tensor& down, const torch::Tensor& up, double scale) {
  check_adapter(in_, out_, down, up);
  TORCH_CHECK(!assistant_.A.defined(), "the Linear already has an assistant adapter");
  assistant_.A = register_buffer("assistant_A", down.to(weight.device()));
  assistant_.B = register_buffer("assistant_B", up.to(weight.device()));
  assistant_.scale = scale;
}

void LinearImpl::place_assistant_adapter(const std::function<torch::Tensor(const torch::Tensor&)>& place) {
  torch::NoGradGuard no_grad;
  for (torch::Tensor* t : {&assistant_.A, &assistant_.B})
    if (t->defined()) t->set_data(place(*t));
}

void LinearImpl::add_lora(int64_t rank, double alpha, double dropout) {
  TORCH_CHECK(rank > 0, "LoRA rank must be positive, got ", rank);
  const auto options = torch::TensorOptions().device(weight.device()).dtype(torch::kFloat);
  // PEFT's defaults: A ~ Kaiming-uniform(a = sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)), B = 0.
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_));
  auto a = std::make_shared<torch::nn::Module>();
  auto b = std::make_shared<torch::nn::Module>();
  lora_.A = a->register_parameter("weight", torch::empty({rank, in_}, options).uniform_(-bound, bound));
  lora_.B = b->register_parameter("weight", torch::zeros({out_, rank}, options));
  if (named_children().contains("lora_A")) {
    replace_module("lora_A", a);
    replace_module("lora_B", b);
  } else {
    register_module("lora_A", a);
    register_module("lora_B", b);
  }
  lora_.scale = alpha / static_cast<double>(rank);
  lora_.dropout = dropout;
  weight.set_requires_grad(false);
  if (bias.defined()) bias.set_requires_grad(false);
}

void LinearImpl::set_weight_storage(WeightStorage storage) {
  torch::NoGradGuard no_grad;
  if (storage == storage_.kind && is_quantized(storage)) return;
  TORCH_CHECK(!is_quantized(storage_.kind), "a ", to_string(storage_.kind),
              "-stored Linear weight cannot be stored again as ", to_string(storage));
  // A buffer registered on first use, replaced in place after (set_weight re-quantizes what it loads).
  auto put = [this](const char* name, torch::Tensor& member, const torch::Tensor& t) {
    if (member.defined())
      member.set_data(t);
    else
      member = register_buffer(name, t);
  };
  torch::Tensor stored;
  if (const int bits = uintx_bits(storage)) {
    // AI Toolkit leaves a Linear it cannot group (or any, for uint8) in its dtype; it quantizes the weight
    // in the dtype it was loaded in (bf16 for a LoRA base).
    if (!quant::uintx_quantizes(bits, in_)) return;
    torch::Tensor scale, zero_point;
    if (weight.is_meta()) {
      const int64_t groups = in_ / quant::kUIntXGroupSize;
      stored = torch::empty({quant::uintx_packed_bytes(out_ * in_, bits)}, weight.options().dtype(torch::kByte));
      scale = torch::empty({out_, groups}, weight.options());
      zero_point = torch::empty({out_, groups}, weight.options().dtype(torch::kByte));
    } else {
      quant::UIntXWeight q = quant::quantize_uintx(weight, bits);
      stored = q.packed, scale = q.scale, zero_point = q.zero_point;
    }
    put("uintx_scale", storage_.uintx_scale, scale);
    put("uintx_zero_point", storage_.uintx_zero_point, zero_point);
    storage_.dequant_dtype = weight.scalar_type();
  } else if (const auto type = scaled_type(storage)) {
    const quant::ScaledWeight q = weight.is_meta() ? quant::empty_scaled(out_, in_, *type, weight.options())
                                                   : quant::quantize_scaled(weight, *type);
    put("weight_scale", storage_.scale, q.scale);
    if (q.zero_point.defined()) put("weight_zero_point", storage_.zero_point, q.zero_point);
    stored = q.data;
    storage_.dequant_dtype = weight.scalar_type();
  } else {
    const auto dtype = storage == WeightStorage::BFloat16  ? torch::kBFloat16
                       : storage == WeightStorage::Float16 ? torch::kHalf
                                                           : torch::kFloat;
    stored = weight.to(dtype);
  }
  weight.set_requires_grad(false);
  weight.set_data(stored);  // the same registered parameter, now in the storage's dtype
  storage_.kind = storage;
  if (bias.defined()) bias.set_requires_grad(false);
}

int64_t LinearImpl::storage_peak_bytes(WeightStorage storage) const {
  if (storage == storage_.kind && is_quantized(storage)) return 0;
  const auto d = weight.scalar_type();
  if (const int bits = uintx_bits(storage))
    return quant::uintx_quantizes(bits, in_) ? quant::quantize_uintx_peak_bytes(out_, in_, bits, d) : 0;
  if (const auto type = scaled_type(storage)) return quant::quantize_scaled_peak_bytes(out_, in_, *type, d);
  const auto dtype = storage == WeightStorage::BFloat16  ? torch::kBFloat16
                     : storage == WeightStorage::Float16 ? torch::kHalf
                                                         : torch::kFloat;
  return weight.scalar_type() == dtype ? 0 : out_ * in_ * static_cast<int64_t>(c10::elementSize(dtype));
}

void LinearImpl::set_weight(const torch::Tensor& values) {
  TORCH_CHECK(values.sizes() == c10::IntArrayRef(weight_shape()), "Linear weight of shape ", weight_shape(),
              " cannot take ", values.sizes());
  torch::NoGradGuard no_grad;
  const WeightStorage storage = storage_.kind;
  const bool requires_grad = weight.requires_grad();
  // A quantized weight quantizes the values in the dtype it was quantized from (AI Toolkit: the loaded
  // dtype); any other keeps its dtype.
  const bool quantized = is_quantized(storage);
  weight.set_data(values.to(weight.device(), quantized ? storage_.dequant_dtype : weight.scalar_type()).clone());
  if (quantized) {
    storage_.kind = WeightStorage::Float32;
    set_weight_storage(storage);
  } else {
    weight.set_requires_grad(requires_grad);
  }
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps, bool affine, const torch::TensorOptions& options) : eps_(eps) {
  if (affine) weight = register_parameter("weight", torch::ones({dim}, options));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  // diffusers.models.normalization.RMSNorm, step for step.
  const auto input_dtype = x.scalar_type();
  const torch::Tensor variance = x.to(torch::kFloat).pow(2).mean(-1, /*keepdim=*/true);
  torch::Tensor h = x * torch::rsqrt(variance + eps_);
  if (!weight.defined()) return h.to(input_dtype);
  if (weight.scalar_type() == torch::kHalf || weight.scalar_type() == torch::kBFloat16) h = h.to(weight.scalar_type());
  return h * weight;
}

ConvImpl::ConvImpl(int64_t in, int64_t out, std::vector<int64_t> kernel, std::vector<int64_t> stride_,
                   std::vector<int64_t> padding_, const torch::TensorOptions& options)
    : stride(std::move(stride_)), padding(std::move(padding_)) {
  // nn.Conv*d's reset_parameters: kaiming_uniform_(a=sqrt(5)) and the bias, both U(-1/sqrt(fan_in), ...).
  int64_t fan_in = in;
  for (int64_t k : kernel) fan_in *= k;
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  std::vector<int64_t> shape = {out, in};
  shape.insert(shape.end(), kernel.begin(), kernel.end());
  weight = register_parameter("weight", uniform_parameter(shape, bound, options));
  bias = register_parameter("bias", uniform_parameter({out}, bound, options));
}

torch::Tensor ConvImpl::forward(const torch::Tensor& x) {
  return gclab::nn::convolution(x, weight, bias, stride, padding);
}

Conv square_conv(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding,
                 const torch::TensorOptions& options) {
  return Conv(in, out, std::vector<int64_t>{kernel, kernel}, std::vector<int64_t>{stride},
              std::vector<int64_t>{padding}, options);
}

GroupNormImpl::GroupNormImpl(int64_t groups_, int64_t channels, double eps_, const torch::TensorOptions& options)
    : groups(groups_), eps(eps_) {
  weight = register_parameter("weight", torch::ones({channels}, options));
  bias = register_parameter("bias", torch::zeros({channels}, options));
}

torch::Tensor GroupNormImpl::forward(const torch::Tensor& x) {
  return gclab::nn::group_norm(x, groups, weight, bias, eps);
}

torch::Tensor layer_norm(const torch::Tensor& x, double eps) {
  if (x.is_meta()) return meta_layer_norm(x);
  return at::layer_norm(x, {x.size(-1)}, {}, {}, eps);
}

torch::Tensor modulate(const torch::Tensor& x, const torch::Tensor& shift, const torch::Tensor& scale) {
  return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1);
}

torch::Tensor timestep_embedding(const torch::Tensor& t, int64_t dim, double max_period) {
  const int64_t half = dim / 2;
  const auto options = torch::TensorOptions().dtype(torch::kFloat).device(t.device());
  const torch::Tensor freqs = torch::exp(-std::log(max_period) * torch::arange(half, options) / half);
  const torch::Tensor args = t.to(torch::kFloat).unsqueeze(1) * freqs.unsqueeze(0);
  torch::Tensor emb = torch::cat({torch::cos(args), torch::sin(args)}, -1);
  if (dim % 2 == 1) emb = torch::cat({emb, torch::zeros_like(emb.narrow(1, 0, 1))}, -1);
  return emb;
}

std::pair<torch::Tensor, torch::Tensor> rope_cos_sin(const torch::Tensor& ids, const std::vector<int64_t>& axes_dims,
                                                     double theta) {
  TORCH_CHECK(ids.dim() == 2 && ids.size(1) == static_cast<int64_t>(axes_dims.size()), "rope ids must be [S, ",
              axes_dims.size(), "], got ", ids.sizes());
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble).device(ids.device());
  std::vector<torch::Tensor> cos, sin;
  for (size_t i = 0; i < axes_dims.size(); ++i) {
    const int64_t d = axes_dims[i];
    const torch::Tensor freqs = 1.0 / torch::pow(theta, torch::arange(0, d, 2, f64) / static_cast<double>(d));
    const torch::Tensor angles = ids.select(1, static_cast<int64_t>(i)).to(torch::kDouble).unsqueeze(1) * freqs;
    cos.push_back(torch::cos(angles).repeat_interleave(2, 1));
    sin.push_back(torch::sin(angles).repeat_interleave(2, 1));
  }
  return {torch::cat(cos, 1).to(torch::kFloat), torch::cat(sin, 1).to(torch::kFloat)};
}

torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  auto sizes = x.sizes().vec();
  sizes.back() /= 2;
  sizes.push_back(2);
  const torch::Tensor pairs = x.reshape(sizes);
  const torch::Tensor rotated = torch::stack({-pairs.select(-1, 1), pairs.select(-1, 0)}, -1).flatten(-2);
  return (x.to(torch::kFloat) * cos + rotated.to(torch::kFloat) * sin).to(x.scalar_type());
}

torch::Tensor swiglu(LinearImpl& gate, LinearImpl& up, LinearImpl& down, const torch::Tensor& x) {
  torch::Tensor a = torch::silu(gate.forward(x));
  a = a * up.forward(x);
  return down.forward(a);
}

torch::Tensor apply_rope_half(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  return x * cos + torch::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1) * sin;
}

torch::Tensor split_heads(const torch::Tensor& x, int64_t heads) {
  return x.unflatten(-1, {heads, x.size(-1) / heads}).transpose(1, 2);
}

torch::Tensor merge_heads(const torch::Tensor& x) { return x.transpose(1, 2).flatten(2); }

torch::Tensor sincos_2d(int64_t h, int64_t w, int64_t dim, const torch::Device& device, double scale, int64_t h_offset,
                        int64_t w_offset) {
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble).device(device);
  TORCH_CHECK(dim % 4 == 0, "2-D sin-cos position embedding needs a width divisible by 4, got ", dim);
  auto one_axis = [&](const torch::Tensor& pos) {  // [N] -> [N, dim/2] = [sin | cos]
    const int64_t quarter = dim / 4;
    const torch::Tensor omega = 1.0 / torch::pow(10000.0, torch::arange(quarter, f64) / static_cast<double>(quarter));
    const torch::Tensor out = pos.unsqueeze(1) * omega.unsqueeze(0);
    return torch::cat({torch::sin(out), torch::cos(out)}, 1);
  };
  const torch::Tensor ys = (torch::arange(h, f64) + h_offset) / scale;
  const torch::Tensor xs = (torch::arange(w, f64) + w_offset) / scale;
  const torch::Tensor grid_y = ys.unsqueeze(1).expand({h, w}).reshape({-1});
  const torch::Tensor grid_x = xs.unsqueeze(0).expand({h, w}).reshape({-1});
  // get_2d_sincos_pos_embed puts the column (x) coordinate in the first half.
  return torch::cat({one_axis(grid_x), one_axis(grid_y)}, 1).to(torch::kFloat);
}

torch::Tensor patchify(const torch::Tensor& latents, int64_t p, bool channels_last) {
  const int64_t b = latents.size(0), c = latents.size(1), h = latents.size(2), w = latents.size(3);
  TORCH_CHECK(h % p == 0 && w % p == 0, "latent ", h, "x", w, " is not divisible by the patch size ", p);
  const torch::Tensor t = latents.reshape({b, c, h / p, p, w / p, p});
  const torch::Tensor perm = channels_last ? t.permute({0, 2, 4, 3, 5, 1}) : t.permute({0, 2, 4, 1, 3, 5});
  return perm.reshape({b, (h / p) * (w / p), c * p * p});
}

torch::Tensor unpatchify(const torch::Tensor& tokens, int64_t h, int64_t w, int64_t p, int64_t channels,
                         bool channels_last) {
  const int64_t b = tokens.size(0);
  if (channels_last) {
    return tokens.reshape({b, h / p, w / p, p, p, channels}).permute({0, 5, 1, 3, 2, 4}).reshape({b, channels, h, w});
  }
  return tokens.reshape({b, h / p, w / p, channels, p, p}).permute({0, 3, 1, 4, 2, 5}).reshape({b, channels, h, w});
}

torch::nn::Module& holder_at(torch::nn::Module& parent, const std::string& dotted_parent) {
  torch::nn::Module* at = &parent;
  size_t start = 0;
  while (start <= dotted_parent.size()) {
    const size_t dot = std::min(dotted_parent.find('.', start), dotted_parent.size());
    const std::string name = dotted_parent.substr(start, dot - start);
    const auto children = at->named_children();
    if (const auto* existing = children.find(name)) {
      at = existing->get();
    } else {
      at = at->register_module(name, std::make_shared<torch::nn::Module>()).get();
    }
    start = dot + 1;
  }
  return *at;
}

std::vector<std::pair<std::string, Linear>> named_linears(torch::nn::Module& root) {
  std::vector<std::pair<std::string, Linear>> out;
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    if (auto linear = std::dynamic_pointer_cast<LinearImpl>(item.value())) out.emplace_back(item.key(), Linear(linear));
  }
  return out;
}

double lowest_value(torch::ScalarType dtype) {
  if (dtype == torch::kBFloat16) return static_cast<double>(std::numeric_limits<c10::BFloat16>::lowest());
  if (dtype == torch::kHalf) return static_cast<double>(std::numeric_limits<c10::Half>::lowest());
  if (dtype == torch::kDouble) return std::numeric_limits<double>::lowest();
  return static_cast<double>(std::numeric_limits<float>::lowest());
}

torch::Tensor causal_additive_mask(int64_t length, const torch::Tensor& attention_mask,
                                   const torch::TensorOptions& options) {
  torch::Tensor hidden =
      torch::ones({length, length}, options.dtype(torch::kBool)).triu(1).view({1, 1, length, length});
  if (attention_mask.defined())
    hidden = hidden | (attention_mask.to(options.device()) == 0).view({attention_mask.size(0), 1, 1, length});
  return torch::zeros(hidden.sizes(), options)
      .masked_fill(hidden, lowest_value(c10::typeMetaToScalarType(options.dtype())));
}

void StorageChange::add(const StorageChange& later) {
  peak_above_bytes = std::max(peak_above_bytes, net_bytes + later.peak_above_bytes);
  net_bytes += later.net_bytes;
}

int64_t module_bytes(const torch::nn::Module& root) {
  int64_t bytes = 0;
  for (const auto& t : root.parameters()) bytes += static_cast<int64_t>(t.nbytes());
  for (const auto& t : root.buffers()) bytes += static_cast<int64_t>(t.nbytes());
  return bytes;
}

StorageChange store_weight(LinearImpl& linear, WeightStorage storage) {
  StorageChange c;
  const int64_t before = module_bytes(linear);
  c.peak_above_bytes = linear.storage_peak_bytes(storage);
  linear.set_weight_storage(storage);
  c.net_bytes = module_bytes(linear) - before;
  return c;
}

StorageChange store_weights(const std::vector<std::pair<std::string, Linear>>& linears, WeightStorage storage) {
  StorageChange total;
  for (const auto& [path, linear] : linears) total.add(store_weight(*linear.ptr(), storage));
  return total;
}

}  // namespace gclab::nn
