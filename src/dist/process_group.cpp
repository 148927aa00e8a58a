#include "gclab/dist/process_group.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdlib>
#include <stdexcept>

namespace gclab::dist {

namespace {

std::optional<int> integer(const char* name) {
  const char* text = std::getenv(name);
  if (!text || !*text) return std::nullopt;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value < 0 || value > 1 << 20)
    throw std::invalid_argument(std::string(name) + "='" + text + "' is not a whole number");
  return static_cast<int>(value);
}

}  // namespace

std::optional<World> world_from_environment() {
  const std::optional<int> size = integer("WORLD_SIZE");
  if (!size || *size <= 1) return std::nullopt;
  World w;
  w.size = *size;
  w.rank = integer("RANK").value_or(0);
  w.local_rank = integer("LOCAL_RANK").value_or(w.rank);
  if (w.rank >= w.size)
    throw std::invalid_argument("RANK=" + std::to_string(w.rank) + " is outside WORLD_SIZE=" + std::to_string(w.size));
  if (const char* addr = std::getenv("MASTER_ADDR"); addr && *addr) w.master_addr = addr;
  w.master_port = integer("MASTER_PORT").value_or(w.master_port);
  return w;
}

struct ProcessGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;
};

ProcessGroup::ProcessGroup(World world) : world_(std::move(world)), impl_(std::make_unique<Impl>()) {}

ProcessGroup::~ProcessGroup() = default;

std::unique_ptr<ProcessGroup> ProcessGroup::join(const World& world, std::chrono::milliseconds timeout) {
  std::unique_ptr<ProcessGroup> group(new ProcessGroup(world));
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(world.master_port);
  options.isServer = world.rank == 0;
  options.numWorkers = world.size;
  options.timeout = timeout;
  try {
    group->impl_->store = c10::make_intrusive<c10d::TCPStore>(world.master_addr, options);
    auto gloo = c10d::ProcessGroupGloo::Options::create(timeout);
    gloo->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(world.master_addr));
    group->impl_->gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(group->impl_->store, world.rank, world.size, gloo);
  } catch (const std::exception& e) {
    throw std::runtime_error("rank " + std::to_string(world.rank) + " of " + std::to_string(world.size) +
                             " could not join the process group at " + world.master_addr + ":" +
                             std::to_string(world.master_port) +
                             " (a rank that never started, or a port in use): " + e.what());
  }
  return group;
}

void ProcessGroup::average(std::vector<at::Tensor>& tensors) {
  // One collective per tensor: c10d's allreduce of a list sums the list too (one tensor per device of a
  // process). Bucketing them into flat buffers, overlapped with the backward, is issue 51's next step.
  for (auto& t : tensors) {
    std::vector<at::Tensor> one = {t};
    impl_->gloo->allreduce(one)->wait();
    t.div_(world_.size);
  }
}

void ProcessGroup::barrier() { impl_->gloo->barrier()->wait(); }

}  // namespace gclab::dist
