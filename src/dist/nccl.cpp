#include "nccl.h"

#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <cstdlib>

namespace gclab::dist {

c10::intrusive_ptr<c10d::Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                            std::chrono::milliseconds timeout, c10::DeviceIndex device) {
  c10::cuda::set_device(device);
  // A collective's wait() blocks until it is done and fails after the timeout (TORCH_NCCL_BLOCKING_WAIT, as
  // torch.distributed's option): a lost rank is a RankLost here, as on Gloo, not the watchdog's abort.
  setenv("TORCH_NCCL_BLOCKING_WAIT", "1", /*overwrite=*/0);
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
}

}  // namespace gclab::dist
