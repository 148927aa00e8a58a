// Exact memory accounting and an emulated memory cap.
//
// CPU: a tracking allocator installed for the whole process by one RAII object (CpuMemoryTracker):
// every LibTorch CPU allocation passes through it, so live and peak bytes are exact, and an allocation
// that would exceed the cap raises c10::OutOfMemoryError, the same exception a GPU raises.
// CUDA: the caching allocator's own statistics, and its per-process memory fraction as the cap.
// MemoryMeter reads either through one interface; PhaseMeter records per-phase peaks.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <string>

#include "gclab/memory/phase.h"

namespace gclab::memory {

struct MemoryStats {
  std::int64_t live_bytes = 0;           // allocated by tensors now
  std::int64_t peak_bytes = 0;           // highest live_bytes since the last reset_peak
  std::int64_t cap_bytes = 0;            // 0 = no cap
  std::int64_t allocations = 0;          // allocations served since installation (CPU) / ever (CUDA)
  std::int64_t reserved_bytes = 0;       // CUDA: held by the caching allocator (>= live); CPU: = live
  std::int64_t reserved_peak_bytes = 0;  // highest reserved_bytes since the last reset_peak
  // Host memory set apart from the device's (CPU runs: what HostScope allocated; see below).
  std::int64_t host_live_bytes = 0;
  std::int64_t host_peak_bytes = 0;
  std::int64_t host_cap_bytes = 0;  // 0 = no cap
};

// On a CPU run the "device" and the host are the same memory; gclab still tells them apart, so that what a
// GPU run would keep in host RAM (offloaded layers' weights) is measured as host memory, not device
// memory. While a HostScope lives, this thread's CPU allocations are host bytes: counted apart from
// live_bytes, held against the host cap (c10::OutOfMemoryError naming host memory), and freed as such
// whenever they are released. Without a tracker installed it does nothing.
// On the meta device (a walk standing for a run) the same scope marks what it allocates as host memory:
// the counting allocator (meta_count.h) leaves it out of the device's count, and is_host_memory names it.
class HostScope {
 public:
  HostScope();
  ~HostScope();
  HostScope(const HostScope&) = delete;
  HostScope& operator=(const HostScope&) = delete;
  static bool active();  // whether one lives on this thread
};

// Installs the tracking CPU allocator for its lifetime; at most one exists at a time. Tensors allocated
// while it was installed may outlive it: their memory is still released (and counted) correctly.
class CpuMemoryTracker {
 public:
  explicit CpuMemoryTracker(std::int64_t cap_bytes = 0);
  ~CpuMemoryTracker();
  CpuMemoryTracker(const CpuMemoryTracker&) = delete;
  CpuMemoryTracker& operator=(const CpuMemoryTracker&) = delete;

  MemoryStats stats() const;
  void reset_peak();
  void set_cap(std::int64_t cap_bytes);       // 0 removes the cap
  void set_host_cap(std::int64_t cap_bytes);  // the cap on HostScope allocations; 0 removes it

  static bool installed();
};

// Live/peak/cap for one device, whatever its kind. CPU needs a CpuMemoryTracker to be installed; the meta
// device (a build that only counts) reads zeros and takes no cap.
class MemoryMeter {
 public:
  explicit MemoryMeter(c10::Device device);
  MemoryStats stats() const;
  void reset_peak();
  // CPU: the tracker's cap. CUDA: the caching allocator's memory fraction, cap / total device memory.
  void set_cap(std::int64_t cap_bytes);
  // CUDA: the caching allocator's memory fraction for the device (process-wide: what set_cap sets), and
  // putting one back; 1.0 and nothing elsewhere.
  double memory_fraction() const;
  void set_memory_fraction(double fraction);
  // The cap on host memory the CPU tracker measures (HostScope allocations), whatever the device; 0 lifts it.
  static void set_host_cap(std::int64_t cap_bytes);
  static std::int64_t host_cap();
  // Starts the host peak (the CPU tracker's HostScope bytes) again from what is live now.
  static void reset_host_peak();
  // CUDA: returns the caching allocator's unused blocks to the device (emptyCache), after an
  // out-of-memory error; the CPU tracker holds nothing back.
  void release_cached();
  // What the cap is held against: on CUDA the allocator's memory fraction limits *reserved* bytes (every
  // block it holds, fragmentation included); the CPU tracker limits allocated (live) bytes.
  const char* cap_counts() const { return cap_counts(device_); }
  static const char* cap_counts(c10::Device device) { return device.is_cuda() ? "reserved" : "allocated"; }
  c10::Device device() const { return device_; }

 private:
  c10::Device device_;
};

// Peak bytes of each phase that ran. A phase's peak is the highest live byte count while it ran, including
// what was already live when it started.
class PhaseMeter {
 public:
  explicit PhaseMeter(MemoryMeter meter) : meter_(meter) {}

  class Scope {
   public:
    Scope(PhaseMeter& owner, Phase phase);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    PhaseMeter& owner_;
    Phase phase_;
    const char* outer_frame_;  // the allocator history's frame before this phase (history.h)
  };
  Scope phase(Phase phase) { return Scope(*this, phase); }

  const std::map<Phase, std::int64_t>& peaks() const { return peaks_; }
  void clear() { peaks_.clear(); }
  const MemoryMeter& meter() const { return meter_; }

 private:
  MemoryMeter meter_;
  std::map<Phase, std::int64_t> peaks_;
};

}  // namespace gclab::memory
