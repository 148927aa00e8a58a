#include "gclab/memory/history.h"

#include <torch/csrc/cuda/memory_snapshot.h>
#include <unistd.h>

#include <chrono>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "gclab/io/pickle.h"

namespace gclab::memory {

namespace detail {
std::atomic<bool> g_cpu_history{false};
}

namespace {

struct Event {
  const char* action;  // "alloc", "free_requested" then "free_completed" (the CPU frees at once), "oom"
  std::uintptr_t addr;
  std::int64_t size;
  std::int64_t time_us;
  const char* frame;
  std::int64_t device_free;  // "oom": what the cap left
};

struct Block {
  std::int64_t size;
  const char* frame;
};

std::mutex g_history_mutex;
std::deque<Event> g_history_events;
std::map<std::uintptr_t, Block> g_history_live;
std::size_t g_history_max = 100000;
std::atomic<const char*> g_history_frame{"between phases"};

std::int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void push(const Event& e) {
  g_history_events.push_back(e);
  while (g_history_events.size() > g_history_max) g_history_events.pop_front();
}

nlohmann::ordered_json frames(const char* frame) {
  return nlohmann::ordered_json::array({{{"filename", "gclab"}, {"line", 0}, {"name", std::string(frame)}}});
}

nlohmann::ordered_json cpu_snapshot() {
  std::lock_guard<std::mutex> lock(g_history_mutex);
  nlohmann::ordered_json segments = nlohmann::ordered_json::array();
  for (const auto& [addr, b] : g_history_live) {
    nlohmann::ordered_json block = {{"address", addr},
                                    {"size", b.size},
                                    {"requested_size", b.size},
                                    {"state", "active_allocated"},
                                    {"frames", frames(b.frame)}};
    segments.push_back({{"device", 0},
                        {"address", addr},
                        {"total_size", b.size},
                        {"allocated_size", b.size},
                        {"active_size", b.size},
                        {"requested_size", b.size},
                        {"stream", 0},
                        {"segment_type", b.size < (1 << 20) ? "small" : "large"},
                        {"is_expandable", false},
                        {"frames", nlohmann::ordered_json::array()},
                        {"blocks", nlohmann::ordered_json::array({block})}});
  }
  nlohmann::ordered_json trace = nlohmann::ordered_json::array();
  for (const auto& e : g_history_events) {
    nlohmann::ordered_json entry = {{"action", e.action}, {"addr", e.addr},       {"size", e.size},
                                    {"stream", 0},        {"time_us", e.time_us}, {"frames", frames(e.frame)}};
    if (std::string(e.action) == "oom") entry["device_free"] = e.device_free;
    trace.push_back(std::move(entry));
  }
  return {{"segments", segments},
          {"device_traces", nlohmann::ordered_json::array({trace})},
          {"allocator_settings", nlohmann::ordered_json::object()}};
}

}  // namespace

namespace detail {

void record_alloc(const void* data, std::int64_t size) {
  const char* frame = g_history_frame.load();
  std::lock_guard<std::mutex> lock(g_history_mutex);
  const auto addr = reinterpret_cast<std::uintptr_t>(data);
  g_history_live[addr] = {size, frame};
  push({"alloc", addr, size, now_us(), frame, 0});
}

void record_free(const void* data, std::int64_t size) {
  std::lock_guard<std::mutex> lock(g_history_mutex);
  const auto addr = reinterpret_cast<std::uintptr_t>(data);
  const auto it = g_history_live.find(addr);
  if (it == g_history_live.end()) return;  // allocated before the recording began
  g_history_live.erase(it);
  const std::int64_t t = now_us();
  push({"free_requested", addr, size, t, g_history_frame.load(), 0});
  push({"free_completed", addr, size, t, g_history_frame.load(), 0});
}

void record_oom(std::int64_t size, std::int64_t device_free) {
  std::lock_guard<std::mutex> lock(g_history_mutex);
  push({"oom", 0, size, now_us(), g_history_frame.load(), device_free});
}

}  // namespace detail

const char* set_history_frame(const char* name) { return g_history_frame.exchange(name); }

void start_memory_history(c10::Device device, std::size_t max_entries) {
  if (device.is_cuda()) {
    torch::cuda::_record_memory_history(std::optional<std::string>("all"), std::optional<std::string>("all"), "python",
                                        max_entries);
    return;
  }
  std::lock_guard<std::mutex> lock(g_history_mutex);
  g_history_events.clear();
  g_history_live.clear();
  g_history_max = max_entries;
  detail::g_cpu_history = true;
}

void stop_memory_history(c10::Device device) {
  if (device.is_cuda()) {
    torch::cuda::_record_memory_history(std::nullopt);
    return;
  }
  detail::g_cpu_history = false;
}

void write_memory_snapshot(const std::filesystem::path& file, c10::Device device) {
  const std::string bytes = device.is_cuda() ? torch::cuda::_memory_snapshot_pickled() : io::to_pickle(cpu_snapshot());
  std::error_code ec;
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path(), ec);
  const std::filesystem::path tmp = file.string() + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) throw std::runtime_error(file.string() + ": cannot write the memory snapshot");
  }
  std::filesystem::rename(tmp, file, ec);
  if (ec) throw std::runtime_error(file.string() + ": cannot rename the snapshot into place: " + ec.message());
}

}  // namespace gclab::memory
