// Autocast as a value and as a scope: the state (enabled and dtype per device kind, the cast cache) can be
// captured and re-entered (the checkpoint's recompute does), and every entry into autocast is a scope that
// restores the previous state on exit — also when the region throws (an out-of-memory error in forward
// must not leave autocast on for the rest of a run). LibTorch only.
#pragma once

#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace gclab::ckpt {

struct AutocastState {
  bool cpu_enabled = false;
  at::ScalarType cpu_dtype = at::kBFloat16;
  bool cuda_enabled = false;
  at::ScalarType cuda_dtype = at::kHalf;
  bool cache_enabled = true;

  static AutocastState capture() {
    AutocastState s;
    s.cpu_enabled = at::autocast::is_autocast_enabled(at::kCPU);
    s.cpu_dtype = at::autocast::get_autocast_dtype(at::kCPU);
    s.cuda_enabled = at::autocast::is_autocast_enabled(at::kCUDA);
    s.cuda_dtype = at::autocast::get_autocast_dtype(at::kCUDA);
    s.cache_enabled = at::autocast::is_autocast_cache_enabled();
    return s;
  }
  // The current state with autocast to `dtype` on for `device` (what `with torch.autocast(...)` enters).
  static AutocastState enabled_for(c10::DeviceType device, at::ScalarType dtype) {
    AutocastState s = capture();
    if (device == c10::DeviceType::CUDA)
      s.cuda_enabled = true, s.cuda_dtype = dtype;
    else
      s.cpu_enabled = true, s.cpu_dtype = dtype;
    return s;
  }
  void apply() const {
    at::autocast::set_autocast_enabled(at::kCPU, cpu_enabled);
    at::autocast::set_autocast_dtype(at::kCPU, cpu_dtype);
    at::autocast::set_autocast_enabled(at::kCUDA, cuda_enabled);
    at::autocast::set_autocast_dtype(at::kCUDA, cuda_dtype);
    at::autocast::set_autocast_cache_enabled(cache_enabled);
  }
  bool any() const { return cpu_enabled || cuda_enabled; }
};

// Enters a state for a scope and restores the previous one on exit, clearing the cast cache when leaving
// the outermost autocast region (as Python's torch.autocast.__exit__ does).
class AutocastScope {
 public:
  explicit AutocastScope(const AutocastState& state) : previous_(AutocastState::capture()), active_(state.any()) {
    state.apply();
    if (active_) at::autocast::increment_nesting();
  }
  ~AutocastScope() {
    if (active_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    previous_.apply();
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  AutocastState previous_;
  bool active_;
};

}  // namespace gclab::ckpt
