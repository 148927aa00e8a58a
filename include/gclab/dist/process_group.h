// Data parallelism's transport: PyTorch's c10d, as torchrun sets it up — a TCPStore at MASTER_ADDR:MASTER_PORT
// (rank 0 its server) and a process group over it: NCCL between GPUs, Gloo on the CPU. gclab grows no transport
// of its own. Every collective waits at most the group's timeout; a rank that is gone (its process ended, its
// connection closed) or that does not answer in time is a RankLost naming what was being done and, when the
// lost rank said why before it stopped (tell_others), its reason.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "gclab/dist/world.h"

namespace gclab::dist {

class RankLost : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One collective under way (an asynchronous allreduce); wait() rethrows its failure as RankLost.
class Pending {
 public:
  virtual ~Pending() = default;
  virtual void wait() = 0;
};

// ZeRO-1's all-gather of updated weights, as ProcessGroup::broadcast_from_owners runs it: per root rank and dtype,
// the root's tensors flattened into one buffer, `collective(buffer, root)` run on it, and a rank that is not the
// root copies it back. With a collective that does nothing it walks the buffers (the memory model's, on meta).
void broadcast_from_owners(const std::vector<at::Tensor>& tensors, const std::vector<int>& owners, int rank, int size,
                           const std::function<void(at::Tensor&, int)>& collective);

class ProcessGroup {
 public:
  // Joins the group of `world` for tensors on `device`: NCCL for a CUDA device (built with it), Gloo otherwise.
  // Joining waits up to `timeout` for every rank (a rank that never comes is an error naming the store, not a
  // hang); so does every collective.
  static std::unique_ptr<ProcessGroup> join(const World& world, const at::Device& device = at::kCPU,
                                            std::chrono::milliseconds timeout = std::chrono::seconds(1800));
  ~ProcessGroup();
  const World& world() const { return world_; }
  const at::Device& device() const { return device_; }
  std::string backend() const;

  // Sums a contiguous tensor on device() across the ranks, in place, without waiting.
  std::unique_ptr<Pending> sum_async(at::Tensor& flat, const std::string& what);
  // Each tensor replaced by the mean of the ranks' (a gradient's average), in place: in buckets of one dtype
  // (GradientReducer's), each flattened into one buffer and reduced by one collective.
  void average(std::vector<at::Tensor>& tensors);
  // The ranks' sums of a few numbers (float64): a loss, a flag.
  std::vector<double> sum(const std::vector<double>& values, const std::string& what);
  bool any(bool flag, const std::string& what) { return sum({flag ? 1.0 : 0.0}, what)[0] > 0; }
  // The ranks whose `value` differs from rank 0's by more than `relative` of it (none: every rank agrees).
  std::vector<int> differing_from_rank0(double value, double relative, const std::string& what);
  void barrier(const std::string& what);
  // ZeRO-1's all-gather of updated weights: each tensor copied from its owner (owners[i], a rank) to every rank,
  // one broadcast per rank and dtype of the tensors it owns, flattened.
  void broadcast_from_owners(const std::vector<at::Tensor>& tensors, const std::vector<int>& owners,
                             const std::string& what);
  // Every rank's bytes at rank 0 (rank 0's result: one string per rank, its own first; the others' result: empty).
  std::vector<std::string> gather_to_rank0(const std::string& mine, const std::string& what);
  // Before this rank stops on an error the others cannot see (out of memory, bad data): its reason, left in the
  // store for the others' RankLost messages.
  void tell_others(const std::string& reason);
  // What a rank that stopped said, if any ("" when none said anything, or the store is gone with rank 0).
  std::string reason_of_lost_rank();

 private:
  struct Impl;
  ProcessGroup(World world, at::Device device);
  RankLost lost(const std::string& what, const std::exception& e);
  World world_;
  at::Device device_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gclab::dist
