#include "gclab/memory/tracker.h"

#include "gclab/memory/history.h"
#include "gclab/memory/meta_count.h"
#include "gclab/memory/placement.h"

#include <ATen/Context.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace gclab::memory {

namespace {

// Each block carries its size in a header in front of the data, so the deleter needs no lookup table
// and the DataPtr's context can be the data pointer itself (some kernels call raw_allocate, which
// requires that; see docs/checkpointing.md).
constexpr std::size_t kHeaderBytes = 64;  // keeps the data 64-byte aligned, as c10's allocator does

std::atomic<std::int64_t> g_live{0};
std::atomic<std::int64_t> g_peak{0};
std::atomic<std::int64_t> g_cap{0};
std::atomic<std::int64_t> g_allocations{0};
std::atomic<bool> g_installed{false};
std::atomic<std::int64_t> g_host_live{0};
std::atomic<std::int64_t> g_host_peak{0};
std::atomic<std::int64_t> g_host_cap{0};
thread_local int t_host_scopes = 0;

std::string mib(std::int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

void raise_peak(std::atomic<std::int64_t>& peak_of, std::int64_t live) {
  std::int64_t peak = peak_of.load(std::memory_order_relaxed);
  while (live > peak && !peak_of.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
}

// The header: the block's size, then whether it is host memory.
struct Header {
  std::int64_t size;
  std::int64_t host;
};

void tracked_free(void* data) {
  if (!data) return;
  char* block = static_cast<char*>(data) - kHeaderBytes;
  Header h{};
  std::memcpy(&h, block, sizeof h);
  (h.host ? g_host_live : g_live).fetch_sub(h.size, std::memory_order_relaxed);
  if (!h.host && detail::g_cpu_history.load(std::memory_order_relaxed)) detail::record_free(data, h.size);
  std::free(block);
}

class TrackingCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t n) override {
    const auto size = static_cast<std::int64_t>(n);
    const bool host = t_host_scopes > 0;
    auto& live_of = host ? g_host_live : g_live;
    const std::int64_t live = live_of.fetch_add(size, std::memory_order_relaxed) + size;
    const std::int64_t cap = (host ? g_host_cap : g_cap).load(std::memory_order_relaxed);
    if (cap > 0 && live > cap) {
      live_of.fetch_sub(size, std::memory_order_relaxed);
      if (!host && detail::g_cpu_history.load(std::memory_order_relaxed)) detail::record_oom(size, cap - (live - size));
      TORCH_CHECK_WITH(OutOfMemoryError, false,
                       host ? "host memory exhausted under the emulated host cap: tried to allocate "
                            : "CPU out of memory under the emulated cap: tried to allocate ",
                       mib(size), " (", size, " bytes) with ", mib(live - size), " live of a ", mib(cap), " cap");
    }
    void* block = nullptr;
    if (posix_memalign(&block, kHeaderBytes, kHeaderBytes + (n == 0 ? 1 : n)) != 0 || !block) {
      live_of.fetch_sub(size, std::memory_order_relaxed);
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU out of memory: the system refused ", n, " bytes");
    }
    const Header h{size, host ? 1 : 0};
    std::memcpy(block, &h, sizeof h);
    raise_peak(host ? g_host_peak : g_peak, live);
    g_allocations.fetch_add(1, std::memory_order_relaxed);
    void* data = static_cast<char*>(block) + kHeaderBytes;
    if (!host && detail::g_cpu_history.load(std::memory_order_relaxed)) detail::record_alloc(data, size);
    return {data, data, &tracked_free, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &tracked_free; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
};

MemoryStats cpu_stats() {
  MemoryStats s;
  s.live_bytes = g_live.load();
  s.peak_bytes = g_peak.load();
  s.cap_bytes = g_cap.load();
  s.allocations = g_allocations.load();
  s.reserved_bytes = s.live_bytes;
  s.reserved_peak_bytes = s.peak_bytes;
  s.host_live_bytes = g_host_live.load();
  s.host_peak_bytes = g_host_peak.load();
  s.host_cap_bytes = g_host_cap.load();
  return s;
}

TrackingCpuAllocator g_tracking_allocator;
c10::Allocator* g_previous_allocator = nullptr;
constexpr uint8_t kPriority = 1;  // above c10's default CPU allocator (priority 0)

}  // namespace

CpuMemoryTracker::CpuMemoryTracker(std::int64_t cap_bytes) {
  bool expected = false;
  TORCH_CHECK(g_installed.compare_exchange_strong(expected, true),
              "a CpuMemoryTracker is already installed; there is one per process");
  g_previous_allocator = c10::GetCPUAllocator();
  g_live = 0;
  g_peak = 0;
  g_allocations = 0;
  g_cap = cap_bytes;
  g_host_live = 0;
  g_host_peak = 0;
  g_host_cap = 0;
  c10::SetCPUAllocator(&g_tracking_allocator, kPriority);
}

CpuMemoryTracker::~CpuMemoryTracker() {
  c10::SetCPUAllocator(g_previous_allocator, kPriority);
  g_cap = 0;
  g_host_cap = 0;
  g_installed = false;
}

HostScope::HostScope() { ++t_host_scopes; }
HostScope::~HostScope() { --t_host_scopes; }
bool HostScope::active() { return t_host_scopes > 0; }

MemoryStats CpuMemoryTracker::stats() const { return cpu_stats(); }

// The host peak is the run's: phases reset the device peak only.
void CpuMemoryTracker::reset_peak() { g_peak = g_live.load(); }
void CpuMemoryTracker::set_cap(std::int64_t cap_bytes) { g_cap = cap_bytes; }
void CpuMemoryTracker::set_host_cap(std::int64_t cap_bytes) { g_host_cap = cap_bytes; }
bool CpuMemoryTracker::installed() { return g_installed.load(); }

MemoryMeter::MemoryMeter(c10::Device device) : device_(device) {
  TORCH_CHECK(device.is_cpu() || device.is_cuda() || device.is_meta(), "memory is measured on CPU or CUDA, not ",
              device);
  TORCH_CHECK(!device.is_cpu() || CpuMemoryTracker::installed(),
              "measuring CPU memory needs a CpuMemoryTracker installed for the process");
  // The caching allocator's statistics and memory fraction assert "Allocator not initialized" until
  // CUDA is initialised, and torch::cuda::is_available() does not initialise it: do it here, once, before
  // any of them is read or set (the cap is often the first CUDA call of a run).
  if (device.is_cuda()) at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
}

namespace {
c10::DeviceIndex cuda_index(c10::Device d) { return d.has_index() ? d.index() : c10::cuda::current_device(); }
}  // namespace

MemoryStats MemoryMeter::stats() const {
  if (device_.is_meta()) return {};
  if (device_.is_cpu()) return cpu_stats();
  using c10::CachingDeviceAllocator::StatType;
  const auto index = cuda_index(device_);
  const auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
  const auto aggregate = static_cast<std::size_t>(StatType::AGGREGATE);
  MemoryStats s;
  s.live_bytes = st.allocated_bytes[aggregate].current;
  s.peak_bytes = st.allocated_bytes[aggregate].peak;
  s.reserved_bytes = st.reserved_bytes[aggregate].current;
  s.reserved_peak_bytes = st.reserved_bytes[aggregate].peak;
  s.allocations = st.allocation[aggregate].allocated;
  const double fraction = c10::cuda::CUDACachingAllocator::getMemoryFraction(index);
  std::size_t free_bytes = 0, total_bytes = 0;
  c10::cuda::CUDAGuard guard(index);
  if (fraction < 1.0 && cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess)
    s.cap_bytes = static_cast<std::int64_t>(fraction * static_cast<double>(total_bytes));
  return s;
}

void MemoryMeter::reset_peak() {
  if (device_.is_meta()) return;
  if (device_.is_cpu()) {
    g_peak = g_live.load();
  } else {
    c10::cuda::CUDACachingAllocator::resetPeakStats(cuda_index(device_));
  }
}

void MemoryMeter::set_cap(std::int64_t cap_bytes) {
  if (device_.is_meta()) return;
  if (device_.is_cpu()) {
    g_cap = cap_bytes;
    return;
  }
  const auto index = cuda_index(device_);
  c10::cuda::CUDAGuard guard(index);
  std::size_t free_bytes = 0, total_bytes = 0;
  TORCH_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess, "cannot read the memory of ", device_);
  const double fraction =
      cap_bytes <= 0 ? 1.0 : std::min(1.0, static_cast<double>(cap_bytes) / static_cast<double>(total_bytes));
  c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, index);
}

double MemoryMeter::memory_fraction() const {
  if (!device_.is_cuda()) return 1.0;
  return c10::cuda::CUDACachingAllocator::getMemoryFraction(cuda_index(device_));
}

void MemoryMeter::set_memory_fraction(double fraction) {
  if (!device_.is_cuda()) return;
  c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, cuda_index(device_));
}

void MemoryMeter::set_host_cap(std::int64_t cap_bytes) { g_host_cap = cap_bytes; }
std::int64_t MemoryMeter::host_cap() { return g_host_cap.load(); }
void MemoryMeter::reset_host_peak() { g_host_peak = g_host_live.load(); }

void MemoryMeter::release_cached() {
  if (device_.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
}

bool is_host_memory(const at::Tensor& t) {
  if (t.defined() && t.is_meta()) return is_meta_host_memory(t);
  if (!t.defined() || !t.device().is_cpu() || !t.has_storage()) return false;
  const c10::DataPtr& p = t.storage().data_ptr();
  if (p.get_deleter() != &tracked_free || !p.get()) return false;
  Header h{};
  std::memcpy(&h, static_cast<const char*>(p.get()) - kHeaderBytes, sizeof h);
  return h.host != 0;
}

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::setup:
      return "setup";
    case Phase::cache:
      return "cache";
    case Phase::data:
      return "data";
    case Phase::text:
      return "text";
    case Phase::forward:
      return "forward";
    case Phase::backward:
      return "backward";
    case Phase::optimizer:
      return "optimizer";
    case Phase::sample:
      return "sample";
    case Phase::save:
      return "save";
  }
  return "?";
}

std::optional<Phase> parse_phase(std::string_view name) {
  for (const Phase p : kPhases)
    if (name == phase_name(p)) return p;
  return std::nullopt;
}

PhaseMeter::Scope::Scope(PhaseMeter& owner, Phase phase)
    : owner_(owner), phase_(phase), outer_frame_(set_history_frame(phase_name(phase))) {
  owner_.meter_.reset_peak();
}

PhaseMeter::Scope::~Scope() {
  set_history_frame(outer_frame_);
  const std::int64_t peak = owner_.meter_.stats().peak_bytes;
  auto& slot = owner_.peaks_[phase_];
  slot = std::max(slot, peak);
}

}  // namespace gclab::memory
