// Mangled input never crashes the loader: truncated files, wrong types everywhere, deep nesting, alias
// bombs and random bytes all end in a result (usually with errors), never in an escaped exception.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>

#include "gclab/config/loader.h"

namespace gclab::config {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

const std::string kFlux = std::string(GCLAB_SHARED_DIR) + "/aitk-configs/train_lora_flux_24gb.yaml";

TEST(ConfigFuzz, EveryTruncationOfARealConfigEndsInAResult) {
  const std::string text = read_file(kFlux);
  ASSERT_GT(text.size(), 1000u);
  int errors = 0;
  for (std::size_t cut = 0; cut < text.size(); cut += 7) {
    LoadResult r;
    ASSERT_NO_THROW(r = load_config_text(text.substr(0, cut), "cut"));
    errors += r.ok() ? 0 : 1;
  }
  EXPECT_GT(errors, 0);
}

TEST(ConfigFuzz, ReplacingEveryValueWithEachWrongTypeIsReported) {
  const std::string text = read_file(kFlux);
  const char* replacements[] = {"[1, [2]]", "{a: b}", "~", "\"\"", "-1", "9999999999999999999999", "!!binary AAAA"};
  std::istringstream lines(text);
  std::vector<std::string> all;
  for (std::string line; std::getline(lines, line);) all.push_back(line);
  int with_errors = 0, total = 0;
  for (std::size_t i = 0; i < all.size(); ++i) {
    const std::size_t colon = all[i].find(": ");
    if (colon == std::string::npos || all[i].find('#') < colon) continue;
    for (const char* replacement : replacements) {
      std::string mutated;
      for (std::size_t j = 0; j < all.size(); ++j)
        mutated += (j == i ? all[j].substr(0, colon + 2) + replacement : all[j]) + "\n";
      LoadResult r;
      ASSERT_NO_THROW(r = load_config_text(mutated, "mutated")) << mutated;
      ++total;
      with_errors += r.diagnostics.has_errors() ? 1 : 0;
    }
  }
  EXPECT_GT(total, 100);
  EXPECT_GT(with_errors, total / 3);  // most wrong types are errors; some are legal (e.g. "" for neg)
}

TEST(ConfigFuzz, DeepNestingIsRefusedNotRecursedInto) {
  const std::string deep_flow = std::string(100000, '[') + std::string(100000, ']');
  const auto r1 = load_config_text(deep_flow, "deep");
  EXPECT_FALSE(r1.ok());
  EXPECT_TRUE(r1.diagnostics.mentions("nests deeper"));

  std::string deep_block;
  for (int i = 0; i < 300; ++i) deep_block += std::string(static_cast<std::size_t>(2 * i), ' ') + "k:\n";
  const auto r2 = load_config_text(deep_block, "deep");
  EXPECT_FALSE(r2.ok());
}

TEST(ConfigFuzz, AliasBombIsRefused) {
  std::string bomb = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i < 12; ++i) {
    bomb += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " [";
    for (int j = 0; j < 10; ++j) bomb += std::string(j ? ", " : "") + "*a" + std::to_string(i - 1);
    bomb += "]\n";
  }
  const auto r = load_config_text(bomb, "bomb");
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(r.diagnostics.mentions("refusing to read it"));
}

TEST(ConfigFuzz, RandomBytesAndBitFlipsNeverCrash) {
  std::mt19937 rng(1234);
  const std::string text = read_file(kFlux);
  for (int round = 0; round < 300; ++round) {
    std::string mutated = text;
    const int flips = 1 + static_cast<int>(rng() % 20);
    for (int f = 0; f < flips; ++f) mutated[rng() % mutated.size()] = static_cast<char>(rng() % 256);
    ASSERT_NO_THROW(load_config_text(mutated, "flipped"));
  }
  for (int round = 0; round < 200; ++round) {
    std::string noise(static_cast<std::size_t>(rng() % 2000), '\0');
    for (char& c : noise) c = static_cast<char>(rng() % 256);
    LoadResult r;
    ASSERT_NO_THROW(r = load_config_text(noise, "noise"));
    EXPECT_FALSE(r.ok());
  }
}

TEST(ConfigFuzz, NonMappingDocumentsAreErrors) {
  for (const char* doc : {"", "42", "- a\n- b\n", "~", "\"just text\"", "---\n...\n"}) {
    const auto r = load_config_text(doc, "doc");
    EXPECT_FALSE(r.ok()) << doc;
  }
}

}  // namespace
}  // namespace gclab::config
