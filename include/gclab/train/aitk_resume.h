// Resuming a LoRA run from the folder AI Toolkit wrote (training_folder/name/), when it holds no gclab
// state: the newest LoRA save as AI Toolkit picks it, the step of its training_info metadata, and optimizer.pt
// mapped onto gclab's optimizer where its layout is one gclab's optimizer keeps.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

#include "gclab/config/choices.h"

namespace gclab::train {

class Session;

// AI Toolkit's get_latest_save_path (jobs/process/BaseSDTrainProcess.py:823-854) in `dir` for the job
// `name`: of the files `<name>*.safetensors`, `<name>*.pt` and the folders `<name>*`, less those whose
// path holds _LoRA, _refiner, _t2i or _cn where the name does not, the newest by ctime (a tie: the last by
// name). gclab's own `.state.safetensors` and a save's temporary file are not AI Toolkit's saves and are
// left out.
std::optional<std::filesystem::path> newest_aitk_save(const std::filesystem::path& dir, const std::string& name);

// The trained LoRA parameters in AI Toolkit's optimizer order: the adapted Linears in the diffusers model's
// named_modules order (the family's diffusers_linear_order in model/registry.h), each lora_A (lora_down) then lora_B
// (lora_up) (toolkit/kohya_lora.py:1030-1075). Throws std::runtime_error when the family's order is not known or a
// Linear is not in it.
std::vector<std::pair<std::string, torch::Tensor>> aitk_parameter_order(Session& session);

// An AI Toolkit optimizer.pt (torch.save of optimizer.state_dict(), read without Python) as the named state
// gclab's Optimizer::load_state takes, the i-th parameter of its param_groups being params[i]. Reads
// torch.optim.AdamW / Adam (`step`, `exp_avg`, `exp_avg_sq`) for adamw / adam, lion-pytorch's Lion
// (`exp_avg`) for lion, bitsandbytes' AdamW8bit / Adam8bit / Lion8bit (`step`, `state1`, `state2`, with
// `qmap*` / `absmax*` for parameters of 4096 values or more, wrapped or not in bitsandbytes' FSDP key) for
// the 8-bit kinds, and an empty state for sgd. Throws std::runtime_error saying what does not match (the
// parameter count, a shape, the layout of another optimizer, a kind whose state is not read).
std::map<std::string, torch::Tensor> read_aitk_optimizer_state(
    const std::filesystem::path& file, config::OptimizerKind kind,
    const std::vector<std::pair<std::string, torch::Tensor>>& params);

// When `dir` holds an AI Toolkit save of a LoRA run: its weights become the trained LoRA (and the EMA's
// start), the step is its training_info's, and optimizer.pt beside it is loaded where it maps (otherwise a
// warning naming the file and why, and a fresh state, as AI Toolkit goes on when its load fails). Returns
// the step, or nullopt (starting at 0) when there is no such save or it is not a LoRA file gclab reads
// (said in a warning).
std::optional<int64_t> resume_from_aitk(Session& session, const std::filesystem::path& dir, const std::string& name);

}  // namespace gclab::train
