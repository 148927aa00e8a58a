// Python's pickle (protocol 2) of a JSON-shaped value: what PyTorch's memory viewer and
// torch/cuda/_memory_viz.py read (pickle.load of a snapshot). Objects become dicts (keys in order), arrays
// lists, integers int, floats float, strings str, booleans bool, null None.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace gclab::io {

std::string to_pickle(const nlohmann::ordered_json& value);

}  // namespace gclab::io
