// The test tree's image family (toy.cpp): what its registration line (tests/families/registry.cpp) takes.
#pragma once

#include "gclab/model/registry.h"

namespace gclab::model::toy {

const ModelFamily& toy_family();

}  // namespace gclab::model::toy
