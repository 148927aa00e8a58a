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

void add_written_bytes(int64_t bytes) {
  if (recomputing == 0) return;
  for (FlopCount* c = innermost; c; c = c->outer_) c->recomputed_bytes_ += bytes;
}

RecomputedRegion::RecomputedRegion() { ++recomputing; }

RecomputedRegion::~RecomputedRegion() { --recomputing; }

NotRecomputed::NotRecomputed() : outer_(recomputing) { recomputing = 0; }

NotRecomputed::~NotRecomputed() { recomputing = outer_; }

}  // namespace gclab::memory
