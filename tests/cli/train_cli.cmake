# `gclab synth` and `gclab train` as a user runs them: exit codes and messages for bad data.
include("${CMAKE_CURRENT_LIST_DIR}/cli_helpers.cmake")

set(dir "${WORK}/train_cli")
file(REMOVE_RECURSE "${dir}")
expect_run(2 "${GCLAB}" synth --out "${dir}/data" --sizes 64by64)
expect_contains("${last_err}" "WIDTHxHEIGHT")
expect_run(0 "${GCLAB}" synth --out "${dir}/data" --count 4 --sizes 64x64)
file(WRITE "${dir}/data/corrupt.png" "not an image at all")
file(COPY "${dir}/data/synth_0000.png" DESTINATION "${dir}/data/sub")
file(RENAME "${dir}/data/sub/synth_0000.png" "${dir}/data/truncated_caption.png")
file(WRITE "${dir}/data/truncated_caption.txt" "a red cir")
file(WRITE "${dir}/cfg.yaml" "name: cli\ntraining_folder: ${dir}\ndevice: cpu\ndatasets:\n  - folder_path: ${dir}/data\n    resolution: [64]\ntrain: {batch_size: 2, steps: 3, lr: 1e-3}\nmodel: {arch: tiny-dit}\n")

# A corrupt image is skipped with a warning naming it; the run completes.
expect_run(0 "${GCLAB}" train "${dir}/cfg.yaml")
expect_contains("${last_err}" "corrupt.png: skipped")
expect_contains("${last_err}" "done: steps 0-3")
if(NOT EXISTS "${dir}/cli/cli.safetensors")
  message(FATAL_ERROR "no weights written")
endif()
# Run again, a finished run resumes from its newest save, as AI Toolkit does (BaseSDTrainProcess.py:2048,
# 2191-2215): it trains nothing more and says where it resumed; --resume says the same; --from-scratch
# trains from step 0.
expect_run(0 "${GCLAB}" train "${dir}/cfg.yaml")
expect_contains("${last_err}" "resumed from")
expect_contains("${last_err}" "done: steps 3-3")
expect_run(0 "${GCLAB}" train "${dir}/cfg.yaml" --resume)
expect_contains("${last_err}" "resumed from")
expect_run(0 "${GCLAB}" train "${dir}/cfg.yaml" --from-scratch)
expect_contains("${last_err}" "done: steps 0-3")
expect_run(2 "${GCLAB}" train "${dir}/cfg.yaml" --from-scratch --resume)

# Ctrl-C: the run saves at the next step boundary and exits 130, so a script can tell it from a finished run.
expect_run(130 timeout --preserve-status -s INT 5 "${GCLAB}" train "${dir}/cfg.yaml" --set name=interrupted
           --set train.steps=1000000)
expect_contains("${last_err}" "interrupted")
file(GLOB interrupted_states "${dir}/interrupted/interrupted_*.state.safetensors")
if(NOT interrupted_states)
  message(FATAL_ERROR "Ctrl-C saved no state")
endif()

# A folder that does not exist, and an empty one: exit 2, the field named.
expect_run(2 "${GCLAB}" train "${dir}/cfg.yaml" --set "datasets.0.folder_path=${dir}/nope")
expect_contains("${last_err}" "datasets[0].folder_path")
file(MAKE_DIRECTORY "${dir}/empty")
expect_run(2 "${GCLAB}" train "${dir}/cfg.yaml" --set "datasets.0.folder_path=${dir}/empty")
expect_contains("${last_err}" "no usable images")
file(REMOVE_RECURSE "${dir}")

# The OOM lab as a user meets it: exit code 3, the phase and the first fix in the log, the report written.
set(oom "${WORK}/oom_cli")
file(REMOVE_RECURSE "${oom}")
expect_run(0 "${GCLAB}" synth --out "${oom}/data" --count 4 --sizes 512x512)
expect_run(3 "${GCLAB}" train "${SOURCE}/configs/oom/cpu_gc_off.yaml" --set "datasets.0.folder_path=${oom}/data"
           --set "training_folder=${oom}/out")
expect_contains("${last_err}" "out of memory at step 1 in `forward`")
expect_contains("${last_err}" "first fix: train.gradient_checkpointing: true")
if(NOT EXISTS "${oom}/out/gc_off/oom_report.md")
  message(FATAL_ERROR "no oom_report.md")
endif()
file(REMOVE_RECURSE "${oom}")
