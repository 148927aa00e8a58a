#include "gclab/memory/flops.h"

namespace gclab::memory {

namespace {
thread_local FlopCount* innermost = nullptr;
thread_local int recomputing = 0;
}  // namespace

FlopCount::FlopCount() : outer_(innermost) { innermost = this; }

FlopCount::~FlopCount() { innermost = outer_; }

bool counting_flops() { return innermost != nullptr; }

void add_flops(double flops, bool adapter) {
  for (FlopCount* c = innermost; c; c = c->outer_) {
    c->total_ += flops;
    if (adapter) c->adapters_ += flops;
    if (recomputing > 0) c->recomputed_ += flops;
  }
}

RecomputedRegion::RecomputedRegion() { ++recomputing; }

RecomputedRegion::~RecomputedRegion() { --recomputing; }

}  // namespace gclab::memory
