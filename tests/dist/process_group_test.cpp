// The process group over c10d: two processes on loopback (this binary run twice, RANK 0 and 1, by
// tests/dist/two_ranks.cmake) average their tensors; a rank alone fails with a clear error within its timeout.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>

#include "gclab/dist/process_group.h"
#include "gclab/dist/reducer.h"

namespace gclab::dist {
namespace {

TEST(World, FromTorchrunsEnvironment) {
  setenv("WORLD_SIZE", "4", 1), setenv("RANK", "3", 1), setenv("LOCAL_RANK", "1", 1);
  setenv("MASTER_ADDR", "10.0.0.2", 1), setenv("MASTER_PORT", "29601", 1);
  const auto w = world_from_environment();
  ASSERT_TRUE(w);
  EXPECT_EQ(w->size, 4);
  EXPECT_EQ(w->rank, 3);
  EXPECT_EQ(w->local_rank, 1);
  EXPECT_EQ(w->master_addr, "10.0.0.2");
  EXPECT_EQ(w->master_port, 29601);
  setenv("RANK", "4", 1);
  EXPECT_THROW(world_from_environment(), std::invalid_argument);
  setenv("RANK", "x", 1);
  EXPECT_THROW(world_from_environment(), std::invalid_argument);
  setenv("WORLD_SIZE", "1", 1);
  EXPECT_FALSE(world_from_environment());
}

TEST(ProcessGroup, ALoneRankFailsWithinItsTimeout) {
  World w;
  w.size = 2, w.rank = 0, w.master_port = 28000 + static_cast<int>(getpid() % 1000);  // clear of the dist tests'
  const auto t0 = std::chrono::steady_clock::now();
  try {
    ProcessGroup::join(w, at::kCPU, std::chrono::seconds(3));
    ADD_FAILURE() << "joined a group whose other rank never came";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("could not join the process group"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
}

// The group both two-rank tests use, joined once per process.
ProcessGroup* group_of_two() {
  static const std::unique_ptr<ProcessGroup> group = [] {
    const auto w = world_from_environment();
    if (!w) throw std::runtime_error("WORLD_SIZE is not set");
    return ProcessGroup::join(*w, at::kCPU, std::chrono::seconds(60));
  }();
  return group.get();
}

// Run by tests/dist/two_ranks.cmake with RANK / WORLD_SIZE / MASTER_PORT set; skipped otherwise.
TEST(ProcessGroup, TwoRanksAverageTheirTensors) {
  if (!std::getenv("GCLAB_DIST_TWO_RANKS")) GTEST_SKIP() << "run by tests/dist/two_ranks.cmake";
  ProcessGroup* group = group_of_two();
  const World* w = &group->world();
  std::vector<at::Tensor> t = {torch::full({3}, static_cast<float>(w->rank + 1)),
                               torch::full({2, 2}, static_cast<float>(10 * (w->rank + 1)))};
  group->average(t);
  EXPECT_TRUE(torch::allclose(t[0], torch::full({3}, 1.5f)));
  EXPECT_TRUE(torch::allclose(t[1], torch::full({2, 2}, 15.0f)));

  // Data parallelism's arithmetic: each rank's gradient of the mean loss over its half of a batch of 4,
  // averaged, is the gradient one process takes over the whole batch (to float32 rounding).
  torch::manual_seed(3);
  torch::nn::Sequential net(torch::nn::Linear(8, 16), torch::nn::GELU(), torch::nn::Linear(16, 4));
  const torch::Tensor x = torch::randn({4, 8}), y = torch::randn({4, 4});
  auto grads_of = [&](const torch::Tensor& xs, const torch::Tensor& ys) {
    net->zero_grad();
    torch::mse_loss(net->forward(xs), ys).backward();
    std::vector<at::Tensor> g;
    for (const auto& p : net->parameters()) g.push_back(p.grad().clone());
    return g;
  };
  const std::vector<at::Tensor> whole = grads_of(x, y);
  std::vector<at::Tensor> mine = grads_of(x.narrow(0, 2 * w->rank, 2), y.narrow(0, 2 * w->rank, 2));
  group->average(mine);
  ASSERT_EQ(mine.size(), whole.size());
  for (size_t i = 0; i < mine.size(); ++i)
    EXPECT_TRUE(torch::allclose(mine[i], whole[i], 1e-5, 1e-7))
        << "parameter " << i << ": max |diff| " << (mine[i] - whole[i]).abs().max().item<double>();
  // The ranks compare a value (the trained weights' fingerprint at a save): equal passes, a rank apart is named.
  EXPECT_TRUE(group->differing_from_rank0(3.25, 1e-9, "comparing").empty());
  EXPECT_EQ(group->differing_from_rank0(w->rank == 1 ? 3.5 : 3.25, 1e-9, "comparing"), std::vector<int>{1});
  group->barrier("the end of the test");
}

// The reducer: each rank's half-batch gradients, averaged while the backward runs (buckets of 64 bytes: several,
// started in order as the hooks see them filled), equal one process's whole-batch gradients; a parameter no
// rank's backward reaches keeps no gradient; without arm() two micro-batches' gradients add up and finish()
// averages the sum. Fails when the hooks are not called (nothing starts early) or the mean is a sum.
TEST(GradientReducer, AveragesWhileTheBackwardRuns) {
  if (!std::getenv("GCLAB_DIST_TWO_RANKS")) GTEST_SKIP() << "run by tests/dist/two_ranks.cmake";
  ProcessGroup* group = group_of_two();
  const int rank = group->world().rank;
  torch::manual_seed(5);
  torch::nn::Sequential net(torch::nn::Linear(6, 8), torch::nn::Tanh(), torch::nn::Linear(8, 8), torch::nn::Tanh(),
                            torch::nn::Linear(8, 3));
  torch::nn::Linear unused(2, 2);
  // The unused layer first: its bucket is the last to start (a bucket not filled holds back those after it).
  std::vector<at::Tensor> trained = unused->parameters();
  for (const auto& p : net->parameters()) trained.push_back(p);
  const torch::Tensor x = torch::randn({4, 6}), y = torch::randn({4, 3});
  auto grads = [&] {
    std::vector<at::Tensor> g;
    for (const auto& p : net->parameters()) g.push_back(p.grad().clone());
    return g;
  };
  net->zero_grad();
  torch::mse_loss(net->forward(x), y).backward();
  const std::vector<at::Tensor> whole = grads();
  net->zero_grad();

  GradientReducer reducer(group, trained, /*bucket_bytes=*/64);
  EXPECT_GT(reducer.buckets(), 3);
  reducer.arm();
  torch::mse_loss(net->forward(x.narrow(0, 2 * rank, 2)), y.narrow(0, 2 * rank, 2)).backward();
  EXPECT_GT(reducer.started_during_backward(), 0);
  reducer.finish();
  const std::vector<at::Tensor> mine = grads();
  for (size_t i = 0; i < mine.size(); ++i)
    EXPECT_TRUE(torch::allclose(mine[i], whole[i], 1e-5, 1e-7))
        << "parameter " << i << ": max |diff| " << (mine[i] - whole[i]).abs().max().item<double>();
  for (const auto& p : unused->parameters()) EXPECT_FALSE(p.grad().defined());

  // Accumulation: two quarter-batches per rank, summed, then averaged once: the sum of the two halves' means.
  net->zero_grad();
  for (int micro = 0; micro < 2; ++micro) {
    const int64_t row = 2 * rank + micro;
    torch::mse_loss(net->forward(x.narrow(0, row, 1)), y.narrow(0, row, 1)).backward();
  }
  EXPECT_EQ(reducer.started_during_backward(), 0);
  reducer.finish();
  const std::vector<at::Tensor> summed = grads();
  for (size_t i = 0; i < summed.size(); ++i)
    EXPECT_TRUE(torch::allclose(summed[i], 2 * whole[i], 1e-5, 1e-7)) << "parameter " << i;
  group->barrier("the end of the reducer's test");
}

}  // namespace
}  // namespace gclab::dist
