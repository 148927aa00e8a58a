#include "gclab/dist/reducer.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <ATen/ATen.h>

namespace gclab::dist {

std::vector<std::vector<size_t>> plan_buckets(const std::vector<at::Tensor>& trained, int64_t bucket_bytes) {
  std::vector<std::vector<size_t>> buckets;
  int64_t bytes = 0;
  for (size_t i = trained.size(); i-- > 0;) {
    const at::Tensor& t = trained[i];
    const bool fits = !buckets.empty() && trained[buckets.back().front()].scalar_type() == t.scalar_type() &&
                      trained[buckets.back().front()].device() == t.device() &&
                      bytes + static_cast<int64_t>(t.nbytes()) <= bucket_bytes;
    if (!fits) buckets.emplace_back(), bytes = 0;
    buckets.back().push_back(i);
    bytes += static_cast<int64_t>(t.nbytes());
  }
  return buckets;
}

std::vector<int> owners(const std::vector<at::Tensor>& trained, int size) {
  int64_t total = 0;
  for (const auto& t : trained) total += static_cast<int64_t>(t.nbytes());
  std::vector<int> out;
  int64_t before = 0;
  for (const auto& t : trained) {
    const int64_t middle = before + static_cast<int64_t>(t.nbytes()) / 2;  // where the tensor's bytes centre
    out.push_back(total > 0 ? static_cast<int>(std::min<int64_t>(size - 1, middle * size / total)) : 0);
    before += static_cast<int64_t>(t.nbytes());
  }
  return out;
}

int64_t GradientReducer::buffer_bytes(const std::vector<at::Tensor>& trained, int64_t bucket_bytes) {
  int64_t bytes = 0;
  for (const auto& members : plan_buckets(trained, bucket_bytes))
    for (size_t k : members) bytes += static_cast<int64_t>((trained[k].numel() + 1) * trained[k].element_size());
  return bytes;
}

// The hook AccumulateGrad calls once a tensor's gradient is accumulated.
struct ReadyHook : torch::autograd::PostAccumulateGradHook {
  ReadyHook(GradientReducer* reducer, size_t tensor) : reducer(reducer), tensor(tensor) {}
  void operator()(const torch::autograd::Variable& /*tensor*/) override { reducer->ready(tensor); }
  GradientReducer* reducer;
  size_t tensor;
};

GradientReducer::GradientReducer(ProcessGroup* group, std::vector<at::Tensor> trained, int64_t bucket_bytes)
    : group_(group), trained_(std::move(trained)), where_(trained_.size()) {
  for (const auto& members : plan_buckets(trained_, bucket_bytes)) {
    Bucket b;
    int64_t n = 0;
    for (size_t k : members) {
      where_[k] = {buckets_.size(), b.members.size()};
      b.members.push_back(k);
      b.offsets.push_back(n);
      n += trained_[k].numel();
    }
    b.flat = at::zeros({n + static_cast<int64_t>(members.size())}, trained_[members.front()].options());
    buckets_.push_back(std::move(b));
  }
  if (!group_) return;
  for (size_t k = 0; k < trained_.size(); ++k)
    torch::autograd::impl::set_post_acc_grad_hooks(trained_[k], std::make_unique<ReadyHook>(this, k));
}

GradientReducer::~GradientReducer() {
  if (group_)
    for (const auto& t : trained_) torch::autograd::impl::set_post_acc_grad_hooks(t, nullptr);
}

void GradientReducer::arm() { armed_ = group_ != nullptr; }

void GradientReducer::copy_in(Bucket& b, size_t m) {
  const at::Tensor& t = trained_[b.members[m]];
  const int64_t n = t.numel();
  const at::Tensor flag = b.flat.narrow(0, b.flat.numel() - static_cast<int64_t>(b.members.size()) + m, 1);
  if (t.grad().defined()) {
    b.flat.narrow(0, b.offsets[m], n).copy_(t.grad().reshape({-1}));
    flag.fill_(1);
  } else {
    b.flat.narrow(0, b.offsets[m], n).zero_();
    flag.zero_();
  }
}

void GradientReducer::ready(size_t tensor) {
  if (!armed_) return;
  const auto [bucket, member] = where_[tensor];
  Bucket& b = buckets_[bucket];
  copy_in(b, member);
  ++b.filled;
  // In order: a bucket starts once it is full and every bucket before it has started.
  while (next_ < buckets_.size() && buckets_[next_].filled == static_cast<int>(buckets_[next_].members.size())) {
    start(buckets_[next_++]);
    ++started_early_;
  }
}

void GradientReducer::start(Bucket& b) { b.pending = group_->sum_async(b.flat, "averaging the gradients"); }

void GradientReducer::finish() {
  if (!group_) return;
  for (; next_ < buckets_.size(); ++next_) {
    Bucket& b = buckets_[next_];
    if (!armed_ || b.filled < static_cast<int>(b.members.size()))
      for (size_t m = 0; m < b.members.size(); ++m) copy_in(b, m);  // what came, and zeros for what did not
    start(b);
  }
  const double scale = 1.0 / group_->world().size;
  for (Bucket& b : buckets_) {
    b.pending->wait();
    b.pending.reset();
    b.filled = 0;
    const auto members = static_cast<int64_t>(b.members.size());
    const at::Tensor had = b.flat.narrow(0, b.flat.numel() - members, members).to(at::kCPU, at::kDouble);
    for (size_t m = 0; m < b.members.size(); ++m) {
      at::Tensor t = trained_[b.members[m]];
      if (had.data_ptr<double>()[m] == 0) continue;  // no rank had a gradient
      const at::Tensor mean = b.flat.narrow(0, b.offsets[m], t.numel()).view(t.sizes()).mul(scale);
      if (t.grad().defined())
        t.mutable_grad().copy_(mean);
      else
        t.mutable_grad() = mean.clone();
    }
  }
  next_ = 0;
  armed_ = false;
  started_early_ = 0;
}

}  // namespace gclab::dist
