// The NCCL backend, built only where the CUDA toolkit is (GCLAB_WITH_NCCL): its headers need CUDA's and NCCL's
// (the nvidia-nccl wheel beside torch).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>

namespace gclab::dist {

// `device`: this rank's GPU, made the current one (NCCL's communicator and CUDA's default context are made there).
c10::intrusive_ptr<c10d::Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                            std::chrono::milliseconds timeout, c10::DeviceIndex device);

}  // namespace gclab::dist
