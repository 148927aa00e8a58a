#include "gclab/ckpt/checkpoint.h"

#include "gclab/ckpt/autocast.h"
#include "gclab/ckpt/saved_ops.h"
#include "gclab/memory/flops.h"
#include "gclab/memory/meta_count.h"

#include <torch/csrc/autograd/custom_function.h>

#include <optional>
#include <sstream>

namespace gclab::ckpt {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The default generators the block may draw from: the CPU one always, a CUDA one per device in use.
struct RngState {
  std::vector<c10::Device> devices;
  std::vector<at::Tensor> states;

  static RngState capture(const std::vector<torch::Tensor>& inputs) {
    std::vector<c10::Device> devices{c10::Device(c10::kCPU)};
    for (const auto& t : inputs) {
      if (t.defined() && t.is_cuda() && std::find(devices.begin(), devices.end(), t.device()) == devices.end())
        devices.push_back(t.device());
    }
    return capture_devices(devices);
  }
  static RngState capture_devices(const std::vector<c10::Device>& devices) {
    RngState s;
    s.devices = devices;
    for (const auto& d : s.devices) {
      at::Generator gen = at::globalContext().defaultGenerator(d);
      std::lock_guard<std::mutex> lock(gen.mutex());
      s.states.push_back(gen.get_state());
    }
    return s;
  }
  void restore() const {
    for (std::size_t i = 0; i < devices.size(); ++i) {
      at::Generator gen = at::globalContext().defaultGenerator(devices[i]);
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(states[i]);
    }
  }
};

// Puts the generators back as they were after the scope, so recomputing does not shift the random
// stream of the code that runs after backward (torch.utils.checkpoint forks the RNG the same way).
class RngFork {
 public:
  RngFork(const RngState& replay, bool enabled) : enabled_(enabled) {
    if (!enabled_) return;
    saved_ = RngState::capture_devices(replay.devices);
    replay.restore();
  }
  ~RngFork() {
    if (enabled_) saved_.restore();
  }
  RngFork(const RngFork&) = delete;
  RngFork& operator=(const RngFork&) = delete;

 private:
  bool enabled_;
  RngState saved_;
};

struct OutputMeta {
  std::vector<int64_t> sizes;
  at::ScalarType dtype;
  c10::Device device;
};

// Everything the backward needs besides the saved inputs.
struct RecomputeState {
  BlockFn fn;
  CheckpointOptions options;
  AutocastState autocast;
  RngState rng;
  std::size_t num_inputs = 0;
  std::size_t num_params = 0;
  std::vector<bool> input_requires_grad;
  std::vector<c10::Device> input_devices;
  std::vector<OutputMeta> outputs;
  // A walk for the CPU: the generator state a CPU run keeps for every checkpointed region (its bytes are the
  // device's there), held on meta while the state lives; never read.
  torch::Tensor rng_on_meta;
  // save_ops: the calls the forward recorded (their outputs saved after the inputs; ckpt/saved_ops.h).
  SavedOps ops;
};

std::string describe(const OutputMeta& m) {
  std::ostringstream s;
  s << c10::toString(m.dtype) << c10::IntArrayRef(m.sizes) << " on " << m.device;
  return s.str();
}

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, at::TensorList inputs, at::TensorList params,
                               std::shared_ptr<RecomputeState> state) {
    // Function::apply runs this with grad mode off: the block's intermediates are not kept.
    // An output nothing downstream uses gets no gradient, not zeros: its recomputed graph is left out of the
    // backward, and a parameter only it depends on gets no gradient (and no optimizer state), as under
    // torch.utils.checkpoint's non-reentrant mode, which diffusers' gradient checkpointing uses
    // (diffusers 0.42.1 models/modeling_utils.py:315-316, use_reentrant=False) — Qwen-Image's last block's
    // text stream, whose output the model drops. (The reentrant mode's zeros would also give them decay.)
    ctx->set_materialize_grads(false);
    state->num_inputs = inputs.size();
    state->num_params = params.size();
    state->autocast = AutocastState::capture();
    if (state->options.preserve_rng) {
      state->rng = RngState::capture(inputs.vec());
      const bool walk =
          std::any_of(inputs.begin(), inputs.end(), [](const auto& t) { return t.defined() && t.is_meta(); });
      if (walk && memory::meta_target() == c10::kCPU)
        state->rng_on_meta =
            torch::empty({state->rng.states[0].numel()}, torch::dtype(torch::kByte).device(torch::kMeta));
    }

    std::vector<torch::Tensor> kept;
    kept.reserve(inputs.size());
    for (const auto& t : inputs) {
      state->input_requires_grad.push_back(t.defined() && t.requires_grad());
      state->input_devices.push_back(t.defined() ? t.device() : c10::Device(c10::kCPU));
      // On the meta device (the memory model's walk) as on the device it stands for: the CPU keeps them.
      const bool on_host = t.defined() && (t.is_meta() ? memory::meta_target() == c10::kCPU : t.is_cpu());
      if (state->options.offload_inputs && t.defined() && !on_host) {
        auto host = torch::empty(t.sizes(), t.options().device(c10::kCPU).pinned_memory(t.is_cuda()));
        if (!t.is_meta()) host.copy_(t, /*non_blocking=*/true);
        kept.push_back(host);
      } else {
        kept.push_back(t);
      }
    }
    state_of(ctx) = state;
    // Strong references to the parameters themselves: the recompute reads them through the block, so
    // the gradient must be taken with respect to these very tensors.
    params_of(ctx) = params.vec();

    std::vector<torch::Tensor> outputs;
    {
      // No cast cache for this no-grad forward: the cache is process-global, and a cast made here has no
      // grad_fn; were it reused by the recompute (backward called inside the autocast region), the weight
      // would get no gradient. (LibTorch 2.11 on the CPU does not reuse such casts — checked; the CUDA
      // path is for the GPU check to confirm.)
      AutocastState no_cache = state->autocast;
      no_cache.cache_enabled = false;
      AutocastScope scope(no_cache);
      memory::RecomputedRegion recomputed;  // what the backward runs again
      std::optional<SavedOpsScope> record;
      if (state->options.save_ops) record.emplace(&state->ops, /*replay=*/false);
      outputs = state->fn(inputs.vec());
    }
    if (state->options.save_ops)
      for (auto& t : state->ops.finish_recording(outputs)) kept.push_back(std::move(t));
    ctx->save_for_backward(kept);
    std::vector<torch::Tensor> non_differentiable;
    for (const auto& out : outputs) {
      TORCH_CHECK(out.defined(), "checkpointed block '", state->options.name, "' returned an undefined tensor");
      state->outputs.push_back({out.sizes().vec(), out.scalar_type(), out.device()});
      if (!at::isFloatingType(out.scalar_type()) && !at::isComplexType(out.scalar_type()))
        non_differentiable.push_back(out);
    }
    if (!non_differentiable.empty()) ctx->mark_non_differentiable(non_differentiable);
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    std::shared_ptr<RecomputeState> state = state_of(ctx);
    TORCH_CHECK(state, "checkpoint: backward ran without its forward state");
    const variable_list saved = ctx->get_saved_variables();
    // Parameters are the Function's inputs too; their current values are what the forward used.
    const std::vector<torch::Tensor>& params = params_of(ctx);

    std::vector<torch::Tensor> inputs;
    inputs.reserve(state->num_inputs);
    for (std::size_t i = 0; i < state->num_inputs; ++i) {
      torch::Tensor t = saved[i];
      if (t.defined()) {
        if (t.device() != state->input_devices[i]) t = t.to(state->input_devices[i], /*non_blocking=*/true);
        t = t.detach().requires_grad_(state->input_requires_grad[i]);
      }
      inputs.push_back(t);
    }

    std::vector<torch::Tensor> outputs;
    {
      RngFork rng(state->rng, state->options.preserve_rng);
      AutocastScope autocast(state->autocast);
      torch::AutoGradMode grad_on(true);
      // selective:ops: the recorded calls hand back what they kept (a copy of the record: a retained graph's
      // second backward replays it again).
      SavedOps replay;
      std::optional<SavedOpsScope> replaying;
      if (state->options.save_ops) {
        replay = state->ops;
        replay.start_replaying(
            std::vector<torch::Tensor>(saved.begin() + static_cast<std::ptrdiff_t>(state->num_inputs), saved.end()));
        replaying.emplace(&replay, /*replay=*/true);
      }
      outputs = state->fn(inputs);
    }
    if (state->options.determinism_check) check_same(*state, outputs);

    // Differentiate the recomputed outputs that carry a gradient w.r.t. whatever requires grad.
    std::vector<torch::Tensor> roots, root_grads;
    for (std::size_t i = 0; i < outputs.size() && i < grad_outputs.size(); ++i) {
      if (outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        root_grads.push_back(grad_outputs[i]);
      }
    }
    std::vector<torch::Tensor> wrt;
    std::vector<std::size_t> wrt_slot;  // position in the returned gradient list
    for (std::size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].defined() && inputs[i].requires_grad()) wrt.push_back(inputs[i]), wrt_slot.push_back(i);
    for (std::size_t j = 0; j < params.size(); ++j)
      if (params[j].defined() && params[j].requires_grad())
        wrt.push_back(params[j]), wrt_slot.push_back(state->num_inputs + j);

    // One gradient per tensor passed to apply (inputs, then params), then one for the state argument.
    variable_list grads(state->num_inputs + state->num_params + 1);
    if (!roots.empty() && !wrt.empty()) {
      const bool create_graph = torch::GradMode::is_enabled();  // double backward asks for a graph
      const variable_list computed = torch::autograd::grad(roots, wrt, root_grads, /*retain_graph=*/create_graph,
                                                           create_graph, /*allow_unused=*/true);
      for (std::size_t k = 0; k < computed.size(); ++k) grads[wrt_slot[k]] = computed[k];
    }
    return grads;
  }

  // The state and the parameter list travel beside the saved tensors.
  static std::shared_ptr<RecomputeState>& state_of(AutogradContext* ctx) { return holder(ctx).state; }
  static std::vector<torch::Tensor>& params_of(AutogradContext* ctx) { return holder(ctx).params; }

 private:
  struct Holder : torch::CustomClassHolder {
    std::shared_ptr<RecomputeState> state;
    std::vector<torch::Tensor> params;
  };
  static Holder& holder(AutogradContext* ctx) {
    auto it = ctx->saved_data.find("holder");
    if (it == ctx->saved_data.end()) {
      ctx->saved_data["holder"] = at::IValue::make_capsule(c10::make_intrusive<Holder>());
      it = ctx->saved_data.find("holder");
    }
    return *static_cast<Holder*>(it->second.toCapsule().get());
  }

  static void check_same(const RecomputeState& state, const std::vector<torch::Tensor>& outputs) {
    if (outputs.size() != state.outputs.size()) {
      throw NondeterministicRecompute("checkpoint '" + state.options.name + "': the recompute returned " +
                                      std::to_string(outputs.size()) + " outputs, the forward " +
                                      std::to_string(state.outputs.size()));
    }
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      const OutputMeta now{outputs[i].sizes().vec(), outputs[i].scalar_type(), outputs[i].device()};
      const OutputMeta& was = state.outputs[i];
      if (now.sizes != was.sizes || now.dtype != was.dtype || now.device != was.device) {
        throw NondeterministicRecompute("checkpoint '" + state.options.name + "': output " + std::to_string(i) +
                                        " was " + describe(was) + " in the forward but " + describe(now) +
                                        " in the recompute (is the block deterministic in shape? "
                                        "disable the check with determinism_check = false)");
      }
    }
  }
};

}  // namespace

std::vector<torch::Tensor> checkpoint(const BlockFn& fn, const std::vector<torch::Tensor>& inputs,
                                      const std::vector<torch::Tensor>& params, const CheckpointOptions& options) {
  bool needs_grad = false;
  if (torch::GradMode::is_enabled()) {
    for (const auto& t : inputs) needs_grad = needs_grad || (t.defined() && t.requires_grad());
    for (const auto& p : params) needs_grad = needs_grad || (p.defined() && p.requires_grad());
  }
  if (!needs_grad) return fn(inputs);  // eval / no_grad: nothing to save, nothing to recompute

  auto state = std::make_shared<RecomputeState>();
  state->fn = fn;
  state->options = options;
  return CheckpointFunction::apply(at::TensorList(inputs), at::TensorList(params), state);
}

}  // namespace gclab::ckpt
