// Who this process is among the processes of a data-parallel run, as torchrun describes it (RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). A plain value: the run's plan carries it (the loader's
// shard, the noise a rank draws, the labels of bench and fit); joining the process group is process_group.h's.
#pragma once

#include <optional>
#include <string>

namespace gclab::dist {

struct World {
  int rank = 0, size = 1, local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // ZeRO-1 (`gclab train --shard optimizer`): each rank keeps and updates the optimizer's state of its own
  // trained tensors (owners()), the updated weights broadcast from their owners.
  bool shard_optimizer = false;
  bool alone() const { return size <= 1; }
  bool writes_outputs() const { return rank == 0; }  // samples, metrics, saves, memory.json: rank 0's
  // "rank 1 of 2" (empty for one process): what logs and reports name.
  std::string name() const;
};

// The world the environment describes; nullopt when WORLD_SIZE is unset or 1 (one process). A variable that
// does not parse, or a rank outside the world, is a std::invalid_argument naming it.
std::optional<World> world_from_environment();

// This process's world: what every run plan it makes carries (train/plan.h). One process unless set: the command
// line sets it from the environment (`gclab train` under torchrun or scripts/launch.sh), or from
// `estimate --world-size`.
const World& process_world();
void set_process_world(const World& world);

}  // namespace gclab::dist
