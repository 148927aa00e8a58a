// Data parallelism's transport: PyTorch's c10d, as torchrun sets it up — a TCPStore at MASTER_ADDR:MASTER_PORT
// (rank 0 its server) and a process group over it: Gloo on the CPU (NCCL on CUDA: issue 51). gclab grows no
// transport of its own. Groundwork: the world read from the environment, the group joined, gradients averaged.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gclab::dist {

// torchrun's environment: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT.
struct World {
  int rank = 0, size = 1, local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
};

// The world the environment describes; nullopt when WORLD_SIZE is unset or 1 (one process). A variable that
// does not parse, or a rank outside the world, is a std::invalid_argument naming it.
std::optional<World> world_from_environment();

// A joined process group. Joining waits up to `timeout` for every rank (a rank that never comes is an error
// naming the store, not a hang); so does every collective.
class ProcessGroup {
 public:
  static std::unique_ptr<ProcessGroup> join(const World& world,
                                            std::chrono::milliseconds timeout = std::chrono::seconds(300));
  ~ProcessGroup();
  const World& world() const { return world_; }
  // Each tensor replaced by the mean of the ranks' (a gradient's average), in place.
  void average(std::vector<at::Tensor>& tensors);
  void barrier();

 private:
  struct Impl;
  explicit ProcessGroup(World world);
  World world_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gclab::dist
