#include "gclab/dist/world.h"

#include <cstdlib>
#include <stdexcept>

namespace gclab::dist {

namespace {

std::optional<int> integer(const char* name) {
  const char* text = std::getenv(name);
  if (!text || !*text) return std::nullopt;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value < 0 || value > 1 << 20)
    throw std::invalid_argument(std::string(name) + "='" + text + "' is not a whole number");
  return static_cast<int>(value);
}

World& the_process_world() {
  static World world;
  return world;
}

}  // namespace

const World& process_world() { return the_process_world(); }

void set_process_world(const World& world) { the_process_world() = world; }

std::string World::name() const {
  return alone() ? "" : "rank " + std::to_string(rank) + " of " + std::to_string(size);
}

std::optional<World> world_from_environment() {
  const std::optional<int> size = integer("WORLD_SIZE");
  if (!size || *size <= 1) return std::nullopt;
  World w;
  w.size = *size;
  w.rank = integer("RANK").value_or(0);
  w.local_rank = integer("LOCAL_RANK").value_or(w.rank);
  if (w.rank >= w.size)
    throw std::invalid_argument("RANK=" + std::to_string(w.rank) + " is outside WORLD_SIZE=" + std::to_string(w.size));
  if (const char* addr = std::getenv("MASTER_ADDR"); addr && *addr) w.master_addr = addr;
  w.master_port = integer("MASTER_PORT").value_or(w.master_port);
  return w;
}

}  // namespace gclab::dist
