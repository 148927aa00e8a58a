// gclab's C++ checkpoint against PyTorch's own torch.utils.checkpoint (non-reentrant): the same block
// stack (tests/reference/toy_stack.py mirrors tests/support/toy_blocks.h op for op), the same weights,
// inputs and dropout seed exchanged as safetensors files; loss and every trainable gradient must agree,
// with checkpointing off and on, on both sides.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>

#include "../support/toy_blocks.h"
#include "gclab/ckpt/policy.h"
#include "gclab/io/safetensors.h"

namespace fs = std::filesystem;

namespace {

struct Run {
  torch::Tensor loss;
  std::map<std::string, torch::Tensor> grads;
};

Run run_cpp(gclab::testing::ToyStack& stack, const std::string& policy, const torch::Tensor& x,
            const torch::Tensor& target, uint64_t seed) {
  gclab::ckpt::apply_checkpoint_policy(stack.blocks, gclab::ckpt::CheckpointPolicy::parse(policy));
  stack.zero_grad();
  torch::manual_seed(seed);
  Run r;
  r.loss = torch::mse_loss(stack.forward(x), target);
  r.loss.backward();
  for (size_t i = 0; i < stack.blocks.size(); ++i)
    for (const auto& p : stack.blocks[i]->block().named_parameters())
      if (p.value().requires_grad()) r.grads["blocks." + std::to_string(i) + "." + p.key()] = p.value().grad();
  return r;
}

void expect_parity(bool frozen_base) {
  gclab::testing::ToyBlockOptions o;
  o.width = 64;
  o.heads = 4;
  o.dropout = 0.1;
  o.frozen_base = frozen_base;
  const int blocks = 3;
  const uint64_t seed = 1234;
  gclab::testing::ToyStack stack(blocks, o, 7);
  for (auto& b : stack.blocks) b->train();
  torch::manual_seed(11);
  const torch::Tensor x = torch::randn({2, 16, o.width});
  const torch::Tensor target = torch::randn({2, 16, o.width});

  const fs::path dir =
      fs::temp_directory_path() / ("gclab_parity_" + std::to_string(::getpid()) + (frozen_base ? "_lora" : "_full"));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<std::pair<std::string, torch::Tensor>> weights;
  for (size_t i = 0; i < stack.blocks.size(); ++i)
    for (const auto& p : stack.blocks[i]->block().named_parameters())
      weights.emplace_back("blocks." + std::to_string(i) + "." + p.key(), p.value());
  gclab::io::save_safetensors(dir / "weights.safetensors", weights,
                              {{"blocks", std::to_string(blocks)},
                               {"width", std::to_string(o.width)},
                               {"heads", std::to_string(o.heads)},
                               {"mlp_ratio", std::to_string(o.mlp_ratio)},
                               {"lora_rank", std::to_string(o.lora_rank)},
                               {"dropout", std::to_string(o.dropout)},
                               {"frozen_base", frozen_base ? "1" : "0"},
                               {"seed", std::to_string(seed)},
                               {"threads", std::to_string(at::get_num_threads())}});
  gclab::io::save_safetensors(dir / "inputs.safetensors", {{"x", x}, {"target", target}});

  const std::string command = std::string("\"") + GCLAB_PYTHON + "\" \"" + GCLAB_SOURCE_DIR +
                              "/tests/reference/toy_stack.py\" parity \"" + dir.string() + "\"";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  const auto py = gclab::io::SafetensorsFile::open(dir / "python.safetensors");

  for (const std::string policy : {"off", "full"}) {
    const Run cpp = run_cpp(stack, policy, x, target, seed);
    const std::string tag = policy;
    // Same ops, same kernels, same thread count, same generator: the numbers agree to the last bit in
    // practice; the tolerance only allows for a kernel choosing a different reduction order.
    EXPECT_TRUE(torch::allclose(cpp.loss.reshape({1}), py.tensor(tag + ".loss"), 1e-6, 0))
        << policy << ": C++ " << cpp.loss.item<float>() << " vs Python " << py.tensor(tag + ".loss").item<float>();
    size_t compared = 0;
    for (const auto& [name, grad] : cpp.grads) {
      ASSERT_TRUE(py.contains(tag + ".grad." + name)) << name;
      ASSERT_TRUE(grad.defined()) << policy << ": no gradient reached " << name;
      const torch::Tensor ref = py.tensor(tag + ".grad." + name);
      EXPECT_TRUE(torch::allclose(grad, ref, 1e-5, 1e-7))
          << policy << " " << name << ": max |diff| " << (grad - ref).abs().max().item<float>();
      ++compared;
    }
    EXPECT_EQ(compared, frozen_base ? 4u * blocks : 12u * blocks);
    ::testing::Test::RecordProperty(policy + "_loss_bitwise",
                                    torch::equal(cpp.loss.reshape({1}), py.tensor(tag + ".loss")) ? 1 : 0);
  }
  fs::remove_all(dir);
}

}  // namespace

TEST(CheckpointParityWithPyTorch, FrozenBaseWithLoraAndDropoutMatchesTorchUtilsCheckpoint) { expect_parity(true); }

TEST(CheckpointParityWithPyTorch, FullTrainingWithDropoutMatchesTorchUtilsCheckpoint) { expect_parity(false); }
