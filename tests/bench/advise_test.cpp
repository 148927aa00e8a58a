// gclab advise on a tiny model: every alternative measured, the previews amortised as the run takes them,
// ranked by the time a step saves; under a cap between GC off's peak and full's, GC off is marked as not
// fitting and is not what it says to try first.
#include "gclab/bench/advise.h"

#include <gtest/gtest.h>

#include <fstream>

#include "../support/test_util.h"
#include "../support/tiny_run.h"

namespace fs = std::filesystem;

namespace gclab::bench {
namespace {

const Advice* find(const AdviseResult& r, const std::string& prefix) {
  for (const auto& a : r.rows)
    if (a.change.rfind(prefix, 0) == 0) return &a;
  return nullptr;
}

TEST(Advise, EachAlternativeMeasuredAndRankedUnderTheCap) {
  const fs::path dir = testing::fresh_dir("advise");
  const std::vector<std::string> knobs = {
      "datasets.0.resolution=[64, 128]", "train.steps=20",
      "sample={prompts: [a red circle], sample_every: 5, sample_steps: 4, width: 64, height: 64}"};
  AdviseResult r;
  {
    train::Session session(testing::tiny_config(dir, "a", knobs));
    r = run_advise(session, {});
  }
  EXPECT_EQ(r.run_steps, 20);
  EXPECT_EQ(r.previews_per_run, 4);  // steps 5, 10, 15, 20 (skip_first_sample)
  const Advice& base = r.rows.front();
  EXPECT_EQ(base.change.rfind("the config as it is (full)", 0), 0u) << base.change;
  EXPECT_GT(base.step_ms, 0);
  EXPECT_GT(base.preview_ms, 0);
  for (const char* change :
       {"checkpoint policy off", "checkpoint policy every:2", "checkpoint policy selective:attn",
        "checkpoint policy selective:mlp", "checkpoint policy selective:ops", "batch 1 with gradient_accumulation 2",
        "drop resolution 128", "sample_every 10", "sample_steps 2", "previews at 32x32", "disable_sampling"})
    EXPECT_NE(find(r, change), nullptr) << change;
  // The previews' arithmetic: none at all saves exactly their share; every 10 steps takes 2 passes of 4.
  const Advice* none = find(r, "disable_sampling");
  ASSERT_NE(none, nullptr);
  EXPECT_EQ(none->preview_ms, 0.0);
  EXPECT_NEAR(none->saved_ms, base.preview_ms, 1e-9);
  const Advice* every = find(r, "sample_every 10");
  ASSERT_NE(every, nullptr);
  EXPECT_NEAR(every->preview_ms, base.preview_ms / 2, 1e-9);
  // Ranked: every alternative that fits saves no more than the one before it.
  for (size_t i = 2; i < r.rows.size(); ++i) {
    if (r.rows[i].fits) {
      EXPECT_LE(r.rows[i].saved_ms, r.rows[i - 1].saved_ms + 1e-9) << r.rows[i].change;
    }
  }
  const Advice* off = find(r, "checkpoint policy off");
  ASSERT_NE(off, nullptr);
  ASSERT_TRUE(off->fits);
  ASSERT_GT(off->peak_bytes, base.peak_bytes);  // what GC off holds more
  write_advice(dir / "a", r);
  std::ifstream page(dir / "a" / "advise.html");
  const std::string html((std::istreambuf_iterator<char>(page)), {});
  EXPECT_NE(html.find("First thing to try"), std::string::npos);
  EXPECT_TRUE(fs::exists(dir / "a" / "advise.json"));

  // Under a cap between the two peaks GC off runs out; the first thing to try is never it.
  const int64_t cap = (off->peak_bytes + base.peak_bytes) / 2;
  std::vector<std::string> capped = knobs;
  capped.push_back("vram_cap=" + std::to_string(cap / 1024) + "KiB");
  train::Session session(testing::tiny_config(dir, "c", capped));
  const AdviseResult under = run_advise(session, {});
  EXPECT_TRUE(under.rows.front().fits);
  const Advice* off_capped = find(under, "checkpoint policy off");
  ASSERT_NE(off_capped, nullptr);
  EXPECT_FALSE(off_capped->fits);
  EXPECT_FALSE(off_capped->oom_phase.empty());
  EXPECT_EQ(under.first.find("checkpoint policy off"), std::string::npos) << under.first;
  // auto is ranked among the alternatives under the cap (decided at each resolution), and fits it.
  const Advice* automatic = find(under, "checkpoint policy auto");
  ASSERT_NE(automatic, nullptr);
  EXPECT_TRUE(automatic->fits);
  EXPECT_EQ(automatic->set, "train.checkpoint_policy=auto");
  EXPECT_EQ(find(r, "checkpoint policy auto"), nullptr);  // no cap: auto is off, not an alternative
  EXPECT_NE(advise_table(under).find("| no |"), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gclab::bench
