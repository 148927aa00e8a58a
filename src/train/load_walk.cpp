#include "gclab/log/log.h"
#include "gclab/train/loading.h"
#include "gclab/train/session.h"

namespace gclab::train {

// The load's own steps, run on the meta device: a Session of the plan stopped after its load records what
// each step held (Session::load_transformer, transformer_to_device, load_text_encoders).
LoadMemory predict_load(const RunPlan& plan) {
  RunPlan meta = plan;
  meta.device = torch::Device(torch::kMeta);
  meta.prompts.options = meta.prompts.options.device(torch::kMeta);
  if (meta.first_frame) meta.first_frame->device = torch::Device(torch::kMeta);
  log::QuietScope quiet;
  return Session(std::move(meta), SessionOptions{/*meta=*/true, /*load_only=*/true}).load_memory();
}

}  // namespace gclab::train
