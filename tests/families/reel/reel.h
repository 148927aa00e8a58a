// The test tree's video family (reel.cpp): what its registration line (tests/families/registry.cpp) takes.
#pragma once

#include "gclab/model/registry.h"

namespace gclab::model::reel {

const ModelFamily& reel_family();

}  // namespace gclab::model::reel
