#include <gtest/gtest.h>

#include "gclab/ckpt/policy.h"

namespace gclab::ckpt {
namespace {

TEST(CheckpointPolicy, ParsesEveryForm) {
  EXPECT_EQ(CheckpointPolicy::parse("off").kind, CheckpointPolicy::Kind::Off);
  EXPECT_EQ(CheckpointPolicy::parse("full").kind, CheckpointPolicy::Kind::Full);
  EXPECT_EQ(CheckpointPolicy::parse("every:3").n, 3);
  EXPECT_EQ(CheckpointPolicy::parse("first:0").n, 0);
  EXPECT_EQ(CheckpointPolicy::parse("blocks:[5, 1,1]").blocks, (std::vector<int>{1, 5}));
  EXPECT_EQ(CheckpointPolicy::parse("selective:mlp").kind, CheckpointPolicy::Kind::SelectiveMlp);
  EXPECT_EQ(CheckpointPolicy::parse("selective:ops").kind, CheckpointPolicy::Kind::SelectiveOps);
  EXPECT_EQ(CheckpointPolicy::parse("offload").kind, CheckpointPolicy::Kind::Offload);
  EXPECT_EQ(CheckpointPolicy::parse("budget:20GiB").budget_bytes, 20LL << 30);
  EXPECT_EQ(CheckpointPolicy::parse("budget:1000").budget_bytes, 1000);
  for (const char* s :
       {"off", "full", "every:2", "first:4", "blocks:[0,3]", "selective:attn", "selective:ops", "offload"})
    EXPECT_EQ(CheckpointPolicy::parse(s).to_string(), s);
}

// Policies built as values are the ones their text names: blocks sorted, each once; none is off.
TEST(CheckpointPolicy, ValuesAreWhatTheirTextParsesTo) {
  const CheckpointPolicy b = CheckpointPolicy::only_blocks({5, 2, 2, 0});
  EXPECT_EQ(b.kind, CheckpointPolicy::Kind::Blocks);
  EXPECT_EQ(b.blocks, (std::vector<int>{0, 2, 5}));
  EXPECT_EQ(b.to_string(), "blocks:[0,2,5]");
  EXPECT_EQ(CheckpointPolicy::parse(b.to_string()).blocks, b.blocks);
  EXPECT_EQ(CheckpointPolicy::only_blocks({}).kind, CheckpointPolicy::Kind::Off);
  EXPECT_EQ(CheckpointPolicy::off().to_string(), "off");
  EXPECT_EQ(CheckpointPolicy::full().to_string(), "full");
  EXPECT_EQ(CheckpointPolicy::full().mode_for(3, 4), CheckpointPolicy::parse("full").mode_for(3, 4));
}

TEST(CheckpointPolicy, RejectsWithTheGrammar) {
  for (const char* bad : {"", "sometimes", "every:0", "every:x", "every", "full:2", "blocks:1,2", "blocks:[a]",
                          "selective:norm", "budget:lots", "budget:-1GiB", "first:-1"}) {
    try {
      CheckpointPolicy::parse(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("every:N"), std::string::npos) << e.what();
    }
  }
}

TEST(CheckpointPolicy, ModesPerBlock) {
  const auto every2 = CheckpointPolicy::parse("every:2");
  std::vector<BlockMode> modes;
  for (int i = 0; i < 5; ++i) modes.push_back(every2.mode_for(i, 5));
  EXPECT_EQ(modes, (std::vector<BlockMode>{BlockMode::Full, BlockMode::None, BlockMode::Full, BlockMode::None,
                                           BlockMode::Full}));
  EXPECT_EQ(CheckpointPolicy::parse("first:2").mode_for(2, 5), BlockMode::None);
  EXPECT_EQ(CheckpointPolicy::parse("blocks:[3]").mode_for(3, 5), BlockMode::Full);
  EXPECT_EQ(CheckpointPolicy::parse("selective:attn").mode_for(0, 5), BlockMode::SelectiveAttn);
  EXPECT_EQ(CheckpointPolicy::parse("selective:ops").mode_for(4, 5), BlockMode::SelectiveOps);
  EXPECT_EQ(CheckpointPolicy::parse("modes:[ops*2,full]").mode_for(1, 3), BlockMode::SelectiveOps);
  EXPECT_EQ(CheckpointPolicy::parse("modes:[ops*2,full]").to_string(), "modes:[ops*2,full]");
  EXPECT_THROW(CheckpointPolicy::parse("budget:1GiB").mode_for(0, 5), std::logic_error);
}

// auto and its margin; modes:[...] as auto prints its plan, read back as written (runs compressed).
TEST(CheckpointPolicy, AutoAndItsPlanAreWrittenAsTheyParse) {
  const CheckpointPolicy plain = CheckpointPolicy::parse("auto");
  EXPECT_EQ(plain.kind, CheckpointPolicy::Kind::Auto);
  EXPECT_EQ(plain.margin_of(1000), 50);  // kAutoMarginFraction
  EXPECT_EQ(CheckpointPolicy::parse("auto:1KiB").margin_of(1 << 20), 1024);
  EXPECT_EQ(CheckpointPolicy::parse("auto:10%").margin_of(1000), 100);
  EXPECT_EQ(CheckpointPolicy::parse("auto:0%").margin_of(1000), 0);
  for (const char* s : {"auto", "auto:10%", "auto:2048", "modes:[full*2,none,attn,mlp*3,offload]"})
    EXPECT_EQ(CheckpointPolicy::parse(s).to_string(), s);
  const CheckpointPolicy m = CheckpointPolicy::parse("modes:[full*2, none,attn]");
  EXPECT_EQ(m.kind, CheckpointPolicy::Kind::Modes);
  EXPECT_EQ(m.modes,
            (std::vector<BlockMode>{BlockMode::Full, BlockMode::Full, BlockMode::None, BlockMode::SelectiveAttn}));
  EXPECT_EQ(m.mode_for(3, 4), BlockMode::SelectiveAttn);
  EXPECT_THROW(m.mode_for(0, 5), std::invalid_argument);  // a plan for another model
  EXPECT_THROW(plain.mode_for(0, 5), std::logic_error);
  EXPECT_EQ(CheckpointPolicy::per_block({BlockMode::None, BlockMode::None}).kind, CheckpointPolicy::Kind::Off);
  EXPECT_EQ(CheckpointPolicy::per_block({BlockMode::Full}).kind, CheckpointPolicy::Kind::Full);
  for (const char* bad : {"auto:lots", "auto:100%", "auto:-1%", "modes", "modes:[]", "modes:[full*0]",
                          "modes:[sometimes]", "modes:full"}) {
    try {
      CheckpointPolicy::parse(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("auto:MARGIN"), std::string::npos) << e.what();
    }
  }
}

TEST(CheckpointPolicy, BudgetCheckpointsTheFewestBlocksThatFit) {
  // Four blocks keep 100, 400, 200, 300 bytes; checkpointed each keeps 10.
  const std::vector<std::int64_t> act = {100, 400, 200, 300}, in = {10, 10, 10, 10};
  EXPECT_TRUE(select_blocks_for_budget(act, in, 1000).empty());                     // all fit already
  EXPECT_EQ(select_blocks_for_budget(act, in, 900), (std::vector<int>{1}));         // 1000 - 390 = 610
  EXPECT_EQ(select_blocks_for_budget(act, in, 500), (std::vector<int>{1, 3}));      // 1000 - 390 - 290 = 320
  EXPECT_EQ(select_blocks_for_budget(act, in, 0), (std::vector<int>{0, 1, 2, 3}));  // best effort: all
}

}  // namespace
}  // namespace gclab::ckpt
