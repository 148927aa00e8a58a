#include "gclab/model/diffusers_config.h"

#include <nlohmann/json.hpp>

#include "gclab/model/registry.h"

namespace gclab::model {

std::string diffusers_config_json(const ModelSpec& s) {
  nlohmann::ordered_json c = family_of(s.family).diffusers_config(s);
  c["_gclab_preset"] = s.preset;
  return c.dump(2) + "\n";
}

}  // namespace gclab::model
