// model.layer_offloading (AI Toolkit's toolkit/memory_management): the offloaded Linears' frozen weights
// live in host memory — measured as host bytes by the CPU tracker — and are brought to the device for each
// call; the LoRA trains to the same losses as with the weights resident, and the device's peak drops by the
// offloaded bytes less what the ring slots keep.
#include <gtest/gtest.h>

#include "../support/oom_advice.h"
#include "../support/step_peak.h"
#include "../support/test_util.h"
#include "../support/tiny_run.h"
#include "gclab/ckpt/autocast.h"
#include "gclab/memory/tracker.h"
#include "gclab/model/activations.h"
#include "gclab/nn/layers.h"
#include "gclab/train/oom_report.h"
#include "gclab/train/predict.h"
#include "gclab/train/session.h"
#include "gclab/train/trainer.h"

namespace gclab::train {
namespace {

namespace fs = std::filesystem;
using gclab::testing::tiny_config;

TEST(LayerOffloading, TheWeightsMoveToHostMemoryAndTheLoraTrainsToTheSameLosses) {
  const fs::path dir = testing::fresh_dir("offload");
  for (const std::string qtype : {"", "uint4", "qfloat8"}) {
    std::vector<std::string> base = {"train.steps=3", "train.gradient_checkpointing=false"};
    if (!qtype.empty()) base.insert(base.end(), {"model.quantize=true", "model.qtype=" + qtype});
    auto offloaded_args = base;
    offloaded_args.push_back("model.layer_offloading=true");
    offloaded_args.push_back("model.layer_offloading_text_encoder_percent=0");  // the transformer's alone here
    int64_t resident_weights = 0, host_weights = 0, offloaded_weights = 0;
    {
      Session s(tiny_config(dir, "r" + qtype, base));
      resident_weights = s.resident().weights;
      EXPECT_EQ(s.resident().host_weights, 0);
    }
    {
      Session s(tiny_config(dir, "o" + qtype, offloaded_args));
      const ResidentBytes r = s.resident();
      offloaded_weights = r.weights, host_weights = r.host_weights;
      int64_t expected_host = 0;
      for (auto& [path, linear] : nn::named_linears(s.model())) {
        EXPECT_TRUE(linear->offloaded()) << path;  // the share defaults to 1: every Linear
        for (const auto& t : linear->parameters(false)) expected_host += static_cast<int64_t>(t.nbytes());
        for (const auto& t : linear->buffers(false)) expected_host += static_cast<int64_t>(t.nbytes());
      }
      EXPECT_EQ(host_weights, expected_host) << qtype;
      // The tracker measured them as host memory.
      EXPECT_GE(s.meter().stats().host_live_bytes, host_weights) << qtype;
    }
    EXPECT_EQ(resident_weights - offloaded_weights, host_weights) << qtype;

    const auto resident = train(tiny_config(dir, "tr" + qtype, base), {});
    const auto offloaded = train(tiny_config(dir, "to" + qtype, offloaded_args), {});
    ASSERT_EQ(resident.losses.size(), 3u);
    ASSERT_EQ(offloaded.losses.size(), 3u);
    for (size_t i = 0; i < resident.losses.size(); ++i)
      EXPECT_NEAR(offloaded.losses[i], resident.losses[i], 1e-6 * std::abs(resident.losses[i]))
          << qtype << " step " << i + 1;
    // The device's peak drops by the offloaded weights (and, uint4 with checkpointing off, the dequantized
    // copies autograd no longer keeps), less the ring slots' weights brought to the device.
    EXPECT_GT(resident.peak_bytes - offloaded.peak_bytes, host_weights / 2) << qtype;
    RecordProperty("peak_drop_" + (qtype.empty() ? std::string("fp32") : qtype),
                   std::to_string(resident.peak_bytes - offloaded.peak_bytes));
  }
  fs::remove_all(dir);
}

TEST(LayerOffloading, TheShareChoosesTheLinearsTheSameWayEveryTime) {
  const fs::path dir = testing::fresh_dir("offload_share");
  const std::vector<std::string> half = {"model.layer_offloading=true",
                                         "model.layer_offloading_transformer_percent=0.5"};
  Session a(tiny_config(dir, "a", half));
  std::vector<bool> chosen;
  for (auto& [path, linear] : nn::named_linears(a.model())) chosen.push_back(linear->offloaded());
  const auto n = static_cast<int64_t>(std::count(chosen.begin(), chosen.end(), true));
  EXPECT_GT(n, 0);
  EXPECT_LT(n, static_cast<int64_t>(chosen.size()));
  Session meta(tiny_config(dir, "b", half), SessionOptions{/*meta=*/true});
  size_t i = 0;
  for (auto& [path, linear] : nn::named_linears(meta.model())) EXPECT_EQ(linear->offloaded(), chosen[i++]) << path;
  EXPECT_EQ(meta.resident().host_weights, a.resident().host_weights);
  fs::remove_all(dir);
}

// The estimate of an offloaded run — its weights in host memory, the rings' bound on the device, no
// dequantized copies — against the step's measured device peak and host bytes: within 10%.
TEST(LayerOffloading, TheEstimateMatchesTheMeasuredStep) {
  const fs::path dir = testing::fresh_dir("offload_estimate");
  for (const std::string policy : {"off", "full"})
    for (const std::string qtype : {"uint4", "qfloat8"}) {
      const auto config =
          tiny_config(dir, "e" + policy + qtype,
                      {"model.layer_offloading=true", "model.quantize=true", "model.qtype=" + qtype, "model.vae=dct",
                       "train.checkpoint_policy=" + policy, "train.cache_text_embeddings=true"});
      const auto e = train::estimate_memory(config);
      const auto& predicted = policy == "off" ? e.resolutions[0].gc_off : e.resolutions[0].gc_full;
      int64_t measured = 0, host = 0;
      {
        Session session(config);
        testing::cache_text_as_a_run_does(session);
        measured = testing::synthetic_step_peak(session, 2, 2, 64);
        host = session.resident().host_weights;
      }
      EXPECT_EQ(e.host_weight_bytes, host) << policy << " " << qtype;
      const double ratio = static_cast<double>(predicted.total_bytes) / static_cast<double>(measured);
      std::printf("offloaded %-7s %-4s predicted %lld measured %lld ratio %.3f (offload buffers %lld)\n", qtype.c_str(),
                  policy.c_str(), static_cast<long long>(predicted.total_bytes), static_cast<long long>(measured),
                  ratio, static_cast<long long>(e.offload_buffer_bytes));
      EXPECT_NEAR(ratio, 1.0, 0.1) << policy << " " << qtype;
    }
  fs::remove_all(dir);
}

// host_cap (--host-cap): on a CPU run the tracker holds the offloaded weights against it; a run whose
// offloaded weights do not fit is refused with the share to lower, one that fits runs.
TEST(LayerOffloading, TheHostCapRefusesOffloadedWeightsThatDoNotFit) {
  const fs::path dir = testing::fresh_dir("offload_host_cap");
  const std::vector<std::string> offload = {"model.layer_offloading=true",
                                            "model.layer_offloading_text_encoder_percent=0"};
  int64_t host = 0;
  {
    Session s(tiny_config(dir, "free", offload));
    host = s.resident().host_weights;
  }
  auto capped = offload;
  capped.push_back("host_cap=" + std::to_string(host / 2));
  try {
    Session s(tiny_config(dir, "capped", capped));
    ADD_FAILURE() << "a host cap of half the offloaded weights was not enforced";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("layer_offloading_transformer_percent"), std::string::npos) << e.what();
  }
  auto roomy = offload;
  roomy.push_back("host_cap=" + std::to_string(host + (1 << 20)));
  Session s(tiny_config(dir, "roomy", roomy));
  EXPECT_EQ(s.resident().host_weights, host);
  EXPECT_LE(s.meter().stats().host_peak_bytes, host + (1 << 20));
  fs::remove_all(dir);
}

// The OOM report offers offloading a LoRA base, priced by re-planning: the step's peak walked for the
// changed config, less than what leaves the device (the transformer's and the text encoders' offloaded
// Linears: the rings bring them back one at a time); a run that offloads
// everything already is not offered it; a tiny uint4 base without its text encoders (packed codes against
// float32 rings) is offered it exactly when two measured steps say it saves (the walk found it does: the
// ledger-era bound on the rings said it did not).
TEST(LayerOffloading, TheOomAdviceOffersItWithItsSaving) {
  const fs::path dir = testing::fresh_dir("offload_advice");
  auto advice = [&](std::vector<std::string> extra) {
    return testing::oom_fix(dir, std::move(extra), {"Offload the base's layers to host memory"}, Phase::optimizer);
  };
  const auto fix = advice({});
  ASSERT_TRUE(fix);
  Session now(tiny_config(dir, "n"), SessionOptions{/*meta=*/true});
  Session offloaded(tiny_config(dir, "m", {"model.layer_offloading=true"}), SessionOptions{/*meta=*/true});
  // Less than what leaves the device: the rings bring the weights back, one Linear at a time.
  EXPECT_GT(fix->predicted_saving_bytes, 0);
  EXPECT_LT(fix->predicted_saving_bytes, now.resident().total() - offloaded.resident().total());
  EXPECT_GT(offloaded.resident().host_weights, fix->predicted_saving_bytes / 2);
  EXPECT_FALSE(advice({"model.layer_offloading=true"}));
  // A tiny uint4 base without its text encoders: packed codes against the rings' float32 weights. Offered
  // or not, the verdict is the measured one: two steps' peak with and without offloading.
  const std::vector<std::string> u4 = {"model.quantize=true", "model.qtype=uint4", "train.cache_text_embeddings=true"};
  auto with_offload = u4;
  with_offload.push_back("model.layer_offloading=true");
  int64_t resident_peak = 0, offloaded_peak = 0;
  {
    Session s(tiny_config(dir, "u4", u4));
    testing::cache_text_as_a_run_does(s);
    resident_peak = testing::synthetic_step_peak(s, 2, 2, 64);
  }
  {
    Session s(tiny_config(dir, "u4o", with_offload));
    testing::cache_text_as_a_run_does(s);
    offloaded_peak = testing::synthetic_step_peak(s, 2, 2, 64);
  }
  const int64_t measured_saving = resident_peak - offloaded_peak;
  const auto u4_fix = advice(u4);
  // The advice is priced for a 77-token caption, the synthetic steps train on "a photo": the saving's sign
  // and its size within a factor of two.
  if (u4_fix) {
    EXPECT_GT(measured_saving, 0);
    EXPECT_GT(u4_fix->predicted_saving_bytes, measured_saving / 2);
    EXPECT_LT(u4_fix->predicted_saving_bytes, measured_saving * 2);
  } else {
    EXPECT_LE(measured_saving, 0);
  }
  fs::remove_all(dir);
}

// A Session owns its offload rings: another one ending — the memory model's meta Session, which a run's
// OOM report or `fit` builds beside the run — leaves the run's slots as they are.
TEST(LayerOffloading, AnotherSessionsEndLeavesARunsRingsAlone) {
  const fs::path dir = testing::fresh_dir("offload_rings_owned");
  const auto config = tiny_config(dir, "r", {"model.layer_offloading=true"});
  Session run(config);
  testing::synthetic_step_peak(run, 1, 2, 64);
  const int64_t rings = run.resident().offload_buffers;
  ASSERT_GT(rings, 0);
  c10::Allocator* const meta_allocator = c10::GetAllocator(c10::kMeta);
  {
    const MemoryModel model(config);  // a meta Session, walked and gone
    EXPECT_GT(model.estimate().offload_buffer_bytes, 0);
    EXPECT_NE(c10::GetAllocator(c10::kMeta), meta_allocator);  // its model lives on the counting allocator
  }
  EXPECT_EQ(c10::GetAllocator(c10::kMeta), meta_allocator);  // and it is gone with it
  { Session other(tiny_config(dir, "o", {"model.layer_offloading=true"})); }
  EXPECT_EQ(run.resident().offload_buffers, rings);
  fs::remove_all(dir);
}

// Under bf16 autocast the matmul computes in bf16 whatever the input's dtype (a float32 input reaches an
// offloaded Linear when its caller, a norm or an adapter, computed in float32): the ring slot holds the
// weight in bf16, not in the input's float32 — twice the bytes, for a weight autocast casts back anyway.
TEST(LayerOffloading, RingSlotsHoldTheWeightInTheDtypeAutocastComputesIn) {
  nn::Linear linear(nn::LinearOptions(64, 32).tensor_options(torch::TensorOptions().dtype(torch::kBFloat16)));
  linear->set_weight_storage(nn::WeightStorage::UInt4);
  const auto rings = nn::make_offload_rings();
  linear->offload([](const torch::Tensor& t) { return t.clone(); }, rings);
  const torch::Tensor x = torch::randn({3, 64});  // float32
  torch::Tensor y, resident_y;
  {
    ckpt::AutocastScope bf16(ckpt::AutocastState::enabled_for(torch::kCPU, torch::kBFloat16));
    y = linear->forward(x);
  }
  EXPECT_EQ(nn::offload_buffer_bytes(*rings), (32 * 64 + 32) * 2);  // one slot: weight and bias in bf16
  nn::release_offload_buffers(*rings);
  // The same values as autocast casting a float32 slot back to bf16 would give.
  {
    ckpt::AutocastScope bf16(ckpt::AutocastState::enabled_for(torch::kCPU, torch::kBFloat16));
    resident_y =
        torch::nn::functional::linear(x, linear->effective_weight(torch::kFloat), linear->bias.to(torch::kFloat));
  }
  EXPECT_TRUE(torch::equal(y, resident_y));
}

// The run-level consequence (tiny-flux, bf16, checkpointing on, a uint4 base): offloading lowers the step's
// peak, as the estimate's bf16 ring slots say, and the losses stay the resident run's.
TEST(LayerOffloading, ABf16CheckpointedUint4RunPeaksBelowTheResidentOne) {
  const fs::path dir = testing::fresh_dir("offload_bf16");
  const std::vector<std::string> base = {"train.steps=2", "train.dtype=bf16", "train.gradient_checkpointing=true",
                                         "model.quantize=true", "model.qtype=uint4"};
  auto offloaded_args = base;
  offloaded_args.insert(offloaded_args.end(),
                        {"model.layer_offloading=true", "model.layer_offloading_text_encoder_percent=0"});
  const auto resident = train(tiny_config(dir, "r", base), {});
  const auto offloaded = train(tiny_config(dir, "o", offloaded_args), {});
  ASSERT_EQ(offloaded.losses.size(), resident.losses.size());
  for (size_t i = 0; i < resident.losses.size(); ++i)
    EXPECT_NEAR(offloaded.losses[i], resident.losses[i], 1e-2 * std::abs(resident.losses[i])) << "step " << i + 1;
  EXPECT_LT(offloaded.peak_bytes, resident.peak_bytes);
  fs::remove_all(dir);
}

TEST(LayerOffloading, AFullFineTuneIsRefused) {
  const fs::path dir = testing::fresh_dir("offload_full");
  EXPECT_THROW(tiny_config(dir, "f", {"network=null", "model.layer_offloading=true"}), std::runtime_error);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gclab::train
