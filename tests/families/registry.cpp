#include "families/registry.h"

#include "reel/reel.h"
#include "toy/toy.h"

namespace gclab::testing {

void register_test_families() {
  model::register_family(model::toy::toy_family());
  model::register_family(model::reel::reel_family());
}

}  // namespace gclab::testing
