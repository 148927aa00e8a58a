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
  // In buckets of one dtype and device, each flattened into one buffer and reduced by one collective (c10d's
  // allreduce of a list would sum the list too: one tensor per device of a process), as DDP's reducer
  // buckets its gradients (25 MiB each by default). Overlapping them with the backward is issue 51's next step.
  constexpr int64_t kBucketBytes = 25 << 20;
  size_t i = 0;
  while (i < tensors.size()) {
    size_t j = i;
    int64_t bytes = 0;
    while (j < tensors.size() && tensors[j].scalar_type() == tensors[i].scalar_type() &&
           tensors[j].device() == tensors[i].device() && (j == i || bytes + tensors[j].nbytes() <= kBucketBytes))
      bytes += static_cast<int64_t>(tensors[j++].nbytes());
    std::vector<at::Tensor> flat_parts;
    for (size_t k = i; k < j; ++k) flat_parts.push_back(tensors[k].reshape({-1}));
    std::vector<at::Tensor> bucket = {at::cat(flat_parts)};
    impl_->gloo->allreduce(bucket)->wait();
    bucket[0].div_(world_.size);
    int64_t offset = 0;
    for (size_t k = i; k < j; ++k) {
      const int64_t n = tensors[k].numel();
      tensors[k].copy_(bucket[0].narrow(0, offset, n).view_as(tensors[k]));
      offset += n;
    }
    i = j;
  }
}

void ProcessGroup::barrier() { impl_->gloo->barrier()->wait(); }

}  // namespace gclab::dist
