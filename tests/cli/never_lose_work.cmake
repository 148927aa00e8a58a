# Issue 46: a run never loses good weights. As a user meets it, through the gclab executable:
# - a loss that is not finite skips its step's update (AI Toolkit's SDTrainer.py:2221-2224), is said in the
#   log and counted in metrics.jsonl, and never reaches a save; train.max_nonfinite_steps in a row stop the
#   run with exit 1 and the saves before kept;
# - a second run on a folder a live run holds is refused by name (exit 2), and a run killed with SIGKILL
#   leaves no lock behind;
# - a run killed inside a save leaves the previous save whole, and the next run resumes from it;
# - a damaged newest state is passed over with a warning naming it, and the run resumes from the one before.
include("${CMAKE_CURRENT_LIST_DIR}/cli_helpers.cmake")

set(dir "${WORK}/never_lose_work")
file(REMOVE_RECURSE "${dir}")
expect_run(0 "${GCLAB}" synth --out "${dir}/data" --count 4 --sizes 64x64)
file(WRITE "${dir}/cfg.yaml" "name: run\ntraining_folder: ${dir}\ndevice: cpu\ndatasets:\n  - folder_path: ${dir}/data\n    resolution: [64]\ntrain: {batch_size: 2, steps: 4, lr: 1e-3}\nsave: {save_every: 2}\nmodel: {arch: tiny-flux, vae: dct}\nnetwork: {type: lora, linear: 4}\n")

# --- Not finite: lr 1e12 blows the LoRA up at step 1 (its weights ~1e12), and step 2's loss is NaN onwards. -
# Saved in float32 the weights are finite: the run ends (exit 0) with steps 2-6 skipped, the save due at step
# 3 deferred, and a final LoRA without NaN or inf.
expect_run(0 "${GCLAB}" train "${dir}/cfg.yaml" --set name=nan --set train.lr=1e12 --set train.steps=6
           --set save.save_every=3 --set save.dtype=float32)
expect_contains("${last_err}" "the loss is not finite; no gradient and no update")
expect_contains("${last_err}" "save deferred")
file(STRINGS "${dir}/nan/metrics.jsonl" lines)
list(GET lines -1 last)
expect_contains("${last}" "\"nonfinite_steps\":5")
execute_process(COMMAND "${PYTHON}" -c
  "import sys, torch; from safetensors.torch import load_file; t = load_file(sys.argv[1]); sys.exit(0 if all(torch.isfinite(v).all() for v in t.values()) else 1)"
  "${dir}/nan/nan.safetensors" RESULT_VARIABLE finite)
if(NOT finite EQUAL 0)
  message(FATAL_ERROR "the final LoRA holds NaN or inf")
endif()
# In AI Toolkit's default save dtype (float16) such weights are inf: the save is refused (exit 1) and the good
# save before it stays. A run to step 1 at a sane lr, then resumed at lr 1e12: step 2's save is refused.
expect_run(0 "${GCLAB}" train "${dir}/cfg.yaml" --set name=nan16 --set train.steps=1)
expect_run(1 "${GCLAB}" train "${dir}/cfg.yaml" --set name=nan16 --set train.lr=1e12 --set train.steps=3
           --set save.save_every=1)
expect_contains("${last_err}" "not finite in save.dtype Half at step 2")
expect_contains("${last_err}" "nan16_000000001.state.safetensors")
if(NOT EXISTS "${dir}/nan16/nan16_000000001.state.safetensors" OR EXISTS "${dir}/nan16/nan16_000000002.safetensors")
  message(FATAL_ERROR "the step-1 save is not the one kept")
endif()
# train.max_nonfinite_steps in a row stop the run: exit 1, the saves before intact.
expect_run(1 "${GCLAB}" train "${dir}/cfg.yaml" --set name=nan_stop --set train.lr=1e12 --set train.steps=20
           --set train.max_nonfinite_steps=3 --set save.dtype=float32)
expect_contains("${last_err}" "3 steps in a row had a loss that was not finite")
expect_contains("${last_err}" "The saves made before are intact")

# --- The folder lock: flock(1) holds the run folder's lock as a live run would. ----------------------------
file(MAKE_DIRECTORY "${dir}/run")
expect_run(2 flock "${dir}/run/.gclab.lock" "${GCLAB}" train "${dir}/cfg.yaml")
expect_contains("${last_err}" "is in use by another gclab train")

# --- Killed inside a save: the 3rd file written is step 4's state (step 2 wrote its state and its LoRA). ----
execute_process(COMMAND "${CMAKE_COMMAND}" -E env GCLAB_FAULT_KILL_IN_SAVE=3 "${GCLAB}" train "${dir}/cfg.yaml"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "the fault did not kill the run: ${err}")
endif()
file(GLOB half "${dir}/run/*.tmp-*")
if(NOT half)
  message(FATAL_ERROR "no half-written save: the kill came elsewhere (${rc})\n${err}")
endif()
# The SIGKILLed run left its lock behind in no form: the next run takes the folder and resumes from step 2.
expect_run(0 "${GCLAB}" train "${dir}/cfg.yaml")
expect_contains("${last_err}" "run_000000002.state.safetensors at step 2")
expect_contains("${last_err}" "a save an earlier run did not finish")
expect_contains("${last_err}" "done: steps 2-4")

# --- A damaged newest state: truncated, it is passed over by name. ------------------------------------------
file(SIZE "${dir}/run/run_000000004.state.safetensors" size)
math(EXPR half_size "${size} / 2")
execute_process(COMMAND truncate -s ${half_size} "${dir}/run/run_000000004.state.safetensors")
expect_run(0 "${GCLAB}" train "${dir}/cfg.yaml" --set train.steps=6)
expect_contains("${last_err}" "not resuming from ${dir}/run/run_000000004.state.safetensors")
expect_contains("${last_err}" "run_000000002.state.safetensors at step 2")
expect_contains("${last_err}" "done: steps 2-6")
file(REMOVE_RECURSE "${dir}")
