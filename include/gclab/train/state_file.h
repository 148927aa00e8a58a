// Saving and resuming: the weights a user keeps (LoRA or the whole transformer, in save.dtype) and the
// training state a bitwise --resume needs, one `<name>_<step>.state.safetensors` per save. The state's
// layout is described once (kStateSections in state_file.cpp) and that description is used both ways.
#pragma once

#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "gclab/train/session.h"

namespace gclab::train {

// A save could not be written (disk full, no permission): the message names the file and what to do.
// The previous save is intact (files are written to a temporary name and renamed into place).
class SaveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The run stopped on losses that were not finite (train.max_nonfinite_steps in a row), or a save was refused
// because the trained weights would not be finite in it (NaN, inf, or beyond save.dtype's range): the saves
// made before are intact. Exit 1.
class NonFiniteStop : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A run folder is held by one `gclab train` at a time: an exclusive flock(2) on `<dir>/.gclab.lock`, which
// the kernel releases however the holder ends (kill -9 included), so nothing is left to clean up. A second
// run on the folder is refused with config::UserError naming the holder's pid.
class RunFolderLock {
 public:
  explicit RunFolderLock(const std::filesystem::path& dir);
  ~RunFolderLock();
  RunFolderLock(const RunFolderLock&) = delete;
  RunFolderLock& operator=(const RunFolderLock&) = delete;

 private:
  int fd_ = -1;
};

class RunSaves {
 public:
  // Finds the step saves already in dir (oldest first) for rotation and resume. With `diffusers_folder`
  // (a full fine-tune with save_format: diffusers) the weights are a folder `<name>[_<step>]/` holding
  // `transformer/` as diffusers writes it: config.json and shards of at most 5 GB with their index.
  RunSaves(std::filesystem::path dir, std::string name, int keep, bool diffusers_folder = false);

  // Writes the state and the weights for `step` (final: the weights as `<name>.safetensors`, no state).
  // Rotates step saves beyond `keep` (0 keeps them all, as AI Toolkit's slicing does). Returns the weights
  // file. Throws SaveError, or NonFiniteStop (nothing written) when a trained tensor — the EMA's where it is
  // what is saved — is not finite in save.dtype.
  std::filesystem::path save(Session& session, int64_t step, bool final);
  // Restores the newest state that reads whole into the session; returns its step, or nullopt when there is
  // none. A newer state that does not read (truncated, damaged) is skipped with a warning naming it. With no
  // gclab state that reads, a folder AI Toolkit wrote is resumed as AI Toolkit resumes it (resume_from_aitk,
  // train/aitk_resume.h).
  std::optional<int64_t> resume(Session& session);

  // The newest "<name>_<step>.state.safetensors" in dir, if any.
  std::optional<std::filesystem::path> newest_state() const;

 private:
  std::filesystem::path dir_;
  std::string name_;
  int keep_;
  bool diffusers_folder_;
  std::filesystem::path weights_path(const std::string& stem) const;
  std::vector<std::filesystem::path> states() const;  // "<name>_<step>.state.safetensors", oldest first
  std::vector<std::pair<std::filesystem::path, std::filesystem::path>> step_saves_;  // (weights, state)
};

}  // namespace gclab::train
