#include "gclab/ckpt/saved_ops.h"

#include <c10/util/Exception.h>

namespace gclab::ckpt {

namespace {
thread_local SavedOps* recording_now = nullptr;
thread_local SavedOps* replaying_now = nullptr;
}  // namespace

SavedOps* SavedOps::recording() { return recording_now; }

SavedOps* SavedOps::replaying() { return replaying_now; }

void SavedOps::record(const void* site, std::vector<at::Tensor> outputs) {
  Call call;
  call.site = site;
  for (const auto& t : outputs) call.versions.push_back(t.defined() ? static_cast<int64_t>(t._version()) : 0);
  call.outputs = std::move(outputs);
  calls_.push_back(std::move(call));
}

std::vector<at::Tensor> SavedOps::finish_recording(const std::vector<at::Tensor>& outputs) {
  std::vector<at::Tensor> kept;
  for (Call& call : calls_) {
    bool keep = true;
    for (size_t i = 0; i < call.outputs.size(); ++i) {
      const at::Tensor& t = call.outputs[i];
      if (!t.defined()) continue;
      keep = keep && static_cast<int64_t>(t._version()) == call.versions[i];
      for (const auto& out : outputs) keep = keep && !(out.defined() && out.is_alias_of(t));
    }
    if (!keep) call.outputs.clear();  // changed in place, or the block's output: run it again
    call.count = call.outputs.size();
    for (auto& t : call.outputs) kept.push_back(std::move(t));
    call.outputs.clear();
    call.versions.clear();
  }
  return kept;
}

void SavedOps::start_replaying(const std::vector<at::Tensor>& kept) {
  size_t at = 0;
  for (Call& call : calls_) {
    TORCH_CHECK(at + call.count <= kept.size(), "selective:ops: fewer kept outputs than recorded");
    call.outputs.assign(kept.begin() + static_cast<std::ptrdiff_t>(at),
                        kept.begin() + static_cast<std::ptrdiff_t>(at + call.count));
    at += call.count;
  }
  TORCH_CHECK(at == kept.size(), "selective:ops: more kept outputs than recorded");
  next_.clear();
}

std::vector<at::Tensor> SavedOps::take(const void* site) {
  size_t& seen = next_[site];  // calls at this site taken so far
  size_t index = 0;
  for (Call& call : calls_) {
    if (call.site != site) continue;
    if (index++ < seen) continue;
    ++seen;
    return std::move(call.outputs);  // each call's outputs are handed back once
  }
  return {};  // more calls than recorded: it runs
}

SavedOpsScope::SavedOpsScope(SavedOps* ops, bool replay)
    : outer_recording_(recording_now), outer_replaying_(replaying_now) {
  recording_now = replay ? nullptr : ops;
  replaying_now = replay ? ops : nullptr;
}

SavedOpsScope::~SavedOpsScope() {
  recording_now = outer_recording_;
  replaying_now = outer_replaying_;
}

}  // namespace gclab::ckpt
