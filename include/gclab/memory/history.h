// The allocator's history for PyTorch's memory viewer (pytorch.org/memory_viz; torch/cuda/_memory_viz.py):
// while it records, every device allocation and free with its address, size and time, and at the end the
// blocks still live, written as the pickle torch.cuda.memory._snapshot() gives. On CUDA LibTorch records
// it (torch/csrc/cuda/memory_snapshot.h); on the CPU the tracking allocator (tracker.h) does, each event's
// frame the phase that was running (PhaseMeter's), each live block its own segment (the CPU keeps no cache).
#pragma once

#include <c10/core/Device.h>

#include <atomic>
#include <cstdint>
#include <filesystem>

namespace gclab::memory {

// Starts recording on `device` (CPU: the tracker's device allocations; CUDA: LibTorch's recorder), the
// newest `max_entries` events kept.
void start_memory_history(c10::Device device, std::size_t max_entries = 100000);
void stop_memory_history(c10::Device device);
// The snapshot as a pickle ('segments', 'device_traces'), written under a temporary name and renamed.
void write_memory_snapshot(const std::filesystem::path& file, c10::Device device);

// The CPU recorder's frame for the events that follow (a static string: a phase's name); returns the one
// it replaces.
const char* set_history_frame(const char* name);

namespace detail {
extern std::atomic<bool> g_cpu_history;
void record_alloc(const void* data, std::int64_t size);
void record_free(const void* data, std::int64_t size);
void record_oom(std::int64_t size, std::int64_t device_free);
}  // namespace detail

}  // namespace gclab::memory
