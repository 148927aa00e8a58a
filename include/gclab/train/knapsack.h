// The choice behind checkpoint_policy auto (train/auto_plan.cpp): per position (a block) one option (a mode)
// whose savings total at least a need for the least cost — a multiple-choice knapsack.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace gclab::train {

struct SavingCost {
  int64_t saving = 0;  // bytes
  double cost = 0;
};

// One option per position whose savings total at least `need` for the least cost (each position's first
// option when nothing is needed); nullopt when even the largest savings fall short. The savings are counted in
// units of need / 4096, each floored (never more than it saves), so the choice is exact in those units.
std::optional<std::vector<size_t>> cheapest_saving(const std::vector<std::vector<SavingCost>>& options, int64_t need);

}  // namespace gclab::train
