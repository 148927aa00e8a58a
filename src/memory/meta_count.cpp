#include "gclab/memory/meta_count.h"

#include "gclab/memory/flops.h"
#include "gclab/memory/tracker.h"

#include <ATen/ATen.h>
#include <c10/core/Allocator.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>

namespace gclab::memory {

namespace {

std::atomic<int64_t> meta_live{0};
std::atomic<int64_t> meta_peak{0};
std::atomic<c10::DeviceType> target_kind{c10::kCPU};

void raise_peak(int64_t live) {
  int64_t seen = meta_peak.load();
  while (live > seen && !meta_peak.compare_exchange_weak(seen, live)) {
  }
}

// The allocation's size rides in the DataPtr's context, so its release subtracts exactly what it added.
void release(void* context) { meta_live -= static_cast<int64_t>(reinterpret_cast<uintptr_t>(context)); }
// Host memory's: nothing was counted.
void release_host(void*) {}

class CountingMetaAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    if (HostScope::active()) return {nullptr, nullptr, &release_host, c10::Device(c10::kMeta)};
    raise_peak(meta_live += static_cast<int64_t>(n));
    add_written_bytes(static_cast<int64_t>(n));
    return {nullptr, reinterpret_cast<void*>(static_cast<uintptr_t>(n)), &release, c10::Device(c10::kMeta)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void*, const void*, std::size_t) const override {}
};

CountingMetaAllocator counting_allocator;
std::mutex install_mutex;
int installs = 0;                            // the MetaAllocatorScopes alive
c10::Allocator* allocator_before = nullptr;  // what the outermost one found
constexpr uint8_t kMetaPriority = 100;       // above LibTorch's own registration

}  // namespace

MetaAllocatorScope::MetaAllocatorScope() {
  const std::lock_guard<std::mutex> lock(install_mutex);
  if (installs++ > 0) return;
  allocator_before = c10::GetAllocator(c10::kMeta);
  c10::SetAllocator(c10::kMeta, &counting_allocator, kMetaPriority);
}

// Tensors the counter allocated and freed later still subtract what they added (their DataPtr's deleter),
// so an uninstalled counter only drifts outside any count, where nothing reads it.
MetaAllocatorScope::~MetaAllocatorScope() {
  const std::lock_guard<std::mutex> lock(install_mutex);
  if (--installs > 0) return;
  c10::SetAllocator(c10::kMeta, allocator_before, kMetaPriority);
}

MetaCount::MetaCount(c10::DeviceType target) : previous_(target_kind.exchange(target)) {
  outer_peak_ = meta_peak.load();
  base_ = meta_live.load();
  meta_peak = base_;
}

// An enclosing count's peak is the higher of what it had seen and what this one saw.
MetaCount::~MetaCount() {
  target_kind = previous_;
  raise_peak(outer_peak_);
}

bool is_meta_host_memory(const at::Tensor& t) {
  return t.defined() && t.is_meta() && t.has_storage() && t.storage().data_ptr().get_deleter() == &release_host;
}

c10::DeviceType meta_target() { return target_kind.load(); }

int64_t MetaCount::live() const { return meta_live.load() - base_; }
int64_t MetaCount::peak() const { return meta_peak.load() - base_; }
void MetaCount::reset_peak() { meta_peak = meta_live.load(); }

void meta_spike(int64_t bytes) {
  if (bytes > 0) at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(at::kMeta));
}

namespace {

std::mutex gaps_mutex;
std::set<std::string> gaps;

}  // namespace

void record_meta_gap(const c10::NotImplementedError& e) {
  // The meta fallback's message starts with the operator's name: "aten::where.self: attempted to run ...".
  std::string name = e.msg();
  const size_t end = name.find(": ");
  name = name.substr(0, std::min(end, name.find('\n')));
  const std::lock_guard<std::mutex> lock(gaps_mutex);
  gaps.insert(name);
}

std::vector<std::string> take_meta_gaps() {
  const std::lock_guard<std::mutex> lock(gaps_mutex);
  std::vector<std::string> out(gaps.begin(), gaps.end());
  gaps.clear();
  return out;
}

}  // namespace gclab::memory
