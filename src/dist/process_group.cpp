#include "gclab/dist/process_group.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <ATen/ATen.h>

#include <cmath>
#include <map>

#include "gclab/dist/reducer.h"
#ifdef GCLAB_WITH_NCCL
#include "nccl.h"
#endif

namespace gclab::dist {

namespace {

// The key a stopping rank leaves its reason under: one per torchrun restart (its store outlives them).
std::string reason_key() {
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  return std::string("gclab/stopped/") + (restart && *restart ? restart : "0");
}

// Gloo's network device: the master's address on one machine (loopback), else GLOO_SOCKET_IFNAME's interface or
// this host's own name, as torch.distributed picks it.
std::shared_ptr<::gloo::transport::Device> gloo_device(const World& world) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  // One machine: the master is loopback, or every rank is local (torchrun's and launch.sh's LOCAL_WORLD_SIZE).
  const char* local = std::getenv("LOCAL_WORLD_SIZE");
  const bool one_machine = world.master_addr == "127.0.0.1" || world.master_addr == "localhost" ||
                           world.master_addr == "::1" || (local && std::atoi(local) == world.size);
  return one_machine ? c10d::ProcessGroupGloo::createDeviceForHostname(world.master_addr)
                     : c10d::ProcessGroupGloo::createDefaultDevice();
}

c10::intrusive_ptr<c10d::Backend> make_gloo(const c10::intrusive_ptr<c10d::Store>& store, const World& world,
                                            std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(gloo_device(world));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, world.rank, world.size, options);
}

class Collective : public Pending {
 public:
  Collective(c10::intrusive_ptr<c10d::Work> work, std::function<RankLost(const std::exception&)> lost)
      : work_(std::move(work)), lost_(std::move(lost)) {}
  void wait() override {
    try {
      work_->wait();
    } catch (const std::exception& e) {
      throw lost_(e);
    }
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::function<RankLost(const std::exception&)> lost_;
};

}  // namespace

struct ProcessGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;  // the tensors' (gradients, weights): NCCL on CUDA, else Gloo
  // The run's own few numbers and bytes (losses, flags, the optimizer's state at a save) on the CPU: Gloo always,
  // so that a lost rank fails them within the timeout whatever the tensors' backend.
  c10::intrusive_ptr<c10d::Backend> control;
  std::string backend_name;
};

ProcessGroup::ProcessGroup(World world, at::Device device)
    : world_(std::move(world)), device_(device), impl_(std::make_unique<Impl>()) {}

ProcessGroup::~ProcessGroup() = default;

std::string ProcessGroup::backend() const { return impl_->backend_name; }

std::unique_ptr<ProcessGroup> ProcessGroup::join(const World& world, const at::Device& device,
                                                 std::chrono::milliseconds timeout) {
  std::unique_ptr<ProcessGroup> group(new ProcessGroup(world, device));
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(world.master_port);
  options.isServer = world.rank == 0;
  options.numWorkers = world.size;
  options.timeout = timeout;
  try {
    auto& impl = *group->impl_;
    impl.store = c10::make_intrusive<c10d::TCPStore>(world.master_addr, options);
    impl.control = make_gloo(c10::make_intrusive<c10d::PrefixStore>("control", impl.store), world, timeout);
    if (device.is_cuda()) {
#ifdef GCLAB_WITH_NCCL
      impl.backend = make_nccl(c10::make_intrusive<c10d::PrefixStore>("nccl", impl.store), world.rank, world.size,
                               timeout, device.has_index() ? device.index() : c10::DeviceIndex{0});
      impl.backend_name = "nccl";
#else
      throw std::runtime_error("this gclab was built without NCCL (no CUDA toolkit at configure time)");
#endif
    } else {
      impl.backend = impl.control;
      impl.backend_name = "gloo";
    }
  } catch (const std::exception& e) {
    throw std::runtime_error(world.name() + " could not join the process group at " + world.master_addr + ":" +
                             std::to_string(world.master_port) +
                             " (a rank that never started, or a port in use): " + e.what());
  }
  return group;
}

RankLost ProcessGroup::lost(const std::string& what, const std::exception& e) {
  const std::string reason = reason_of_lost_rank();
  return RankLost(world_.name() + ": " + what + " failed: another rank is gone or did not answer within the " +
                  "timeout (" + e.what() + ")" + (reason.empty() ? "" : "; it said: " + reason));
}

std::unique_ptr<Pending> ProcessGroup::sum_async(at::Tensor& flat, const std::string& what) {
  std::vector<at::Tensor> one = {flat};
  try {
    return std::make_unique<Collective>(impl_->backend->allreduce(one),
                                        [this, what](const std::exception& e) { return lost(what, e); });
  } catch (const std::exception& e) {
    throw lost(what, e);
  }
}

void ProcessGroup::average(std::vector<at::Tensor>& tensors) {
  for (const auto& members : plan_buckets(tensors, GradientReducer::kBucketBytes)) {
    std::vector<at::Tensor> parts;
    for (size_t k : members) parts.push_back(tensors[k].reshape({-1}));
    at::Tensor flat = at::cat(parts);
    sum_async(flat, "averaging tensors")->wait();
    flat.div_(world_.size);
    int64_t offset = 0;
    for (size_t k : members) {
      const int64_t n = tensors[k].numel();
      tensors[k].copy_(flat.narrow(0, offset, n).view_as(tensors[k]));
      offset += n;
    }
  }
}

std::vector<double> ProcessGroup::sum(const std::vector<double>& values, const std::string& what) {
  std::vector<at::Tensor> t = {at::tensor(values, at::TensorOptions().dtype(at::kDouble))};
  try {
    impl_->control->allreduce(t)->wait();
  } catch (const std::exception& e) {
    throw lost(what, e);
  }
  return std::vector<double>(t[0].data_ptr<double>(), t[0].data_ptr<double>() + t[0].numel());
}

std::vector<int> ProcessGroup::differing_from_rank0(double value, double relative, const std::string& what) {
  std::vector<double> each(static_cast<size_t>(world_.size), 0.0);
  each[static_cast<size_t>(world_.rank)] = value;
  const std::vector<double> all = sum(each, what);
  std::vector<int> out;
  for (size_t r = 1; r < all.size(); ++r)
    if (!(std::abs(all[r] - all[0]) <= relative * std::abs(all[0]))) out.push_back(static_cast<int>(r));
  return out;
}

void broadcast_from_owners(const std::vector<at::Tensor>& tensors, const std::vector<int>& owners, int rank, int size,
                           const std::function<void(at::Tensor&, int)>& collective) {
  at::NoGradGuard no_grad;
  // One buffer per dtype, the largest root's size, reused by every root: a collective's work may hold its tensor a
  // moment after wait() returns (Gloo's worker thread), so a buffer per root could briefly be two.
  std::map<at::ScalarType, int64_t> most;
  for (int root = 0; root < size; ++root) {
    std::map<at::ScalarType, int64_t> n;
    for (size_t i = 0; i < tensors.size(); ++i)
      if (owners[i] == root) n[tensors[i].scalar_type()] += tensors[i].numel();
    for (const auto& [dtype, count] : n) most[dtype] = std::max(most[dtype], count);
  }
  std::map<at::ScalarType, at::Tensor> buffers;
  for (const auto& [dtype, count] : most)
    for (const auto& t : tensors)
      if (t.scalar_type() == dtype) {
        buffers[dtype] = at::empty({count}, t.options());
        break;
      }
  for (int root = 0; root < size; ++root) {
    std::map<at::ScalarType, std::vector<at::Tensor>> owned;
    for (size_t i = 0; i < tensors.size(); ++i)
      if (owners[i] == root) owned[tensors[i].scalar_type()].push_back(tensors[i]);
    for (auto& [dtype, parts] : owned) {
      int64_t n = 0;
      for (const auto& t : parts) n += t.numel();
      at::Tensor flat = buffers.at(dtype).narrow(0, 0, n);
      int64_t offset = 0;
      if (root == rank)
        for (const auto& t : parts)
          flat.narrow(0, offset, t.numel()).copy_(t.detach().reshape({-1})), offset += t.numel();
      collective(flat, root);
      if (root == rank) continue;
      offset = 0;
      for (auto& t : parts) {
        t.detach().copy_(flat.narrow(0, offset, t.numel()).view_as(t));
        offset += t.numel();
      }
    }
  }
}

void ProcessGroup::broadcast_from_owners(const std::vector<at::Tensor>& tensors, const std::vector<int>& owners,
                                         const std::string& what) {
  dist::broadcast_from_owners(tensors, owners, world_.rank, world_.size, [&](at::Tensor& flat, int root) {
    std::vector<at::Tensor> one = {flat};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    try {
      impl_->backend->broadcast(one, options)->wait();
    } catch (const std::exception& e) {
      throw lost(what, e);
    }
  });
}

std::vector<std::string> ProcessGroup::gather_to_rank0(const std::string& mine, const std::string& what) {
  std::vector<double> lengths(static_cast<size_t>(world_.size), 0.0);
  lengths[static_cast<size_t>(world_.rank)] = static_cast<double>(mine.size());
  lengths = sum(lengths, what);
  auto as_tensor = [](int64_t n) { return at::empty({n}, at::TensorOptions().dtype(at::kByte)); };  // host bytes
  std::vector<std::string> out;
  try {
    if (world_.rank != 0) {
      std::vector<at::Tensor> t = {as_tensor(static_cast<int64_t>(mine.size()))};
      t[0].copy_(at::from_blob(const_cast<char*>(mine.data()), {static_cast<int64_t>(mine.size())}, at::kByte));
      impl_->control->send(t, 0, /*tag=*/world_.rank)->wait();
      return out;
    }
    out.push_back(mine);
    for (int r = 1; r < world_.size; ++r) {
      std::vector<at::Tensor> t = {as_tensor(static_cast<int64_t>(lengths[static_cast<size_t>(r)]))};
      impl_->control->recv(t, r, /*tag=*/r)->wait();
      const at::Tensor& host = t[0];
      out.emplace_back(reinterpret_cast<const char*>(host.data_ptr<uint8_t>()), static_cast<size_t>(host.numel()));
    }
  } catch (const std::exception& e) {
    throw lost(what, e);
  }
  return out;
}

void ProcessGroup::barrier(const std::string& what) {
  try {
    impl_->control->barrier()->wait();
  } catch (const std::exception& e) {
    throw lost(what, e);
  }
}

void ProcessGroup::tell_others(const std::string& reason) {
  try {
    const std::string text = reason.rfind(world_.name(), 0) == 0 ? reason : world_.name() + ": " + reason;
    if (!impl_->store->check({reason_key()}))  // the first reason stands (the others follow from it)
      impl_->store->set(reason_key(), std::vector<uint8_t>(text.begin(), text.end()));
  } catch (const std::exception&) {
    // The store went with rank 0: nobody is left to tell.
  }
}

std::string ProcessGroup::reason_of_lost_rank() {
  try {
    if (!impl_->store->check({reason_key()})) return "";
    const std::vector<uint8_t> text = impl_->store->get(reason_key());
    return std::string(text.begin(), text.end());
  } catch (const std::exception&) {
    return "";
  }
}

}  // namespace gclab::dist
