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

# Video clips (issue 48): `gclab synth --video` writes MP4 files beside their captions; a video arch trains on
# them with num_frames, a broken video file skipped with a warning naming it; a format it cannot write: exit 2.
set(video "${WORK}/video_cli")
file(REMOVE_RECURSE "${video}")
expect_run(2 "${GCLAB}" synth --video --format avi --out "${video}/clips")
expect_contains("${last_err}" "--format must be mp4, webm, mov, mkv or gif")
expect_run(0 "${GCLAB}" synth --video --out "${video}/clips" --count 2 --sizes 64x48)
expect_contains("${last_out}" "mp4 clips of 17 frames")
foreach(f synth_0000.mp4 synth_0000.txt synth_0001.mp4)
  if(NOT EXISTS "${video}/clips/${f}")
    message(FATAL_ERROR "gclab synth --video wrote no ${f}")
  endif()
endforeach()
file(WRITE "${video}/clips/broken.mp4" "not a video")
file(WRITE "${video}/cfg.yaml" "name: v\ntraining_folder: ${video}\ndevice: cpu\ndatasets:\n  - folder_path: ${video}/clips\n    resolution: [64]\n    num_frames: 5\ntrain: {batch_size: 1, steps: 1, lr: 1e-3}\nmodel: {arch: tiny-wan21}\n")
# estimate over frames x resolution: a row each; a frame count below 1 is exit 2.
expect_run(0 "${GCLAB}" estimate "${video}/cfg.yaml" --frames 1,5 --resolution 64,96 --json)
string(JSON rows LENGTH "${last_out}" estimate per_resolution)
if(NOT rows EQUAL 4)
  message(FATAL_ERROR "estimate --frames 1,5 --resolution 64,96 gave ${rows} rows, not 4:\n${last_out}")
endif()
string(JSON frames GET "${last_out}" estimate per_resolution 3 frames)
if(NOT frames EQUAL 5)
  message(FATAL_ERROR "the last row is at ${frames} frames, not 5")
endif()
expect_run(2 "${GCLAB}" estimate "${video}/cfg.yaml" --frames 0)
expect_contains("${last_err}" "--frames")
expect_run(0 "${GCLAB}" train "${video}/cfg.yaml")
expect_contains("${last_err}" "broken.mp4: skipped, not a readable video")
expect_contains("${last_err}" "done: steps 0-1")
file(REMOVE_RECURSE "${video}")

# The OOM lab as a user meets it: exit code 3, the phase and the first fix in the log, the report written.
set(oom "${WORK}/oom_cli")
file(REMOVE_RECURSE "${oom}")
expect_run(0 "${GCLAB}" synth --out "${oom}/data" --count 4 --sizes 512x512)
expect_run(3 "${GCLAB}" train "${SOURCE}/configs/oom/cpu_gc_off.yaml" --set "datasets.0.folder_path=${oom}/data"
           --set "training_folder=${oom}/out")
expect_contains("${last_err}" "out of memory at step 1 in `forward`")
# The first fix: checkpoint_policy auto, which fits the cap for less recompute than full.
expect_contains("${last_err}" "first fix: train.checkpoint_policy: auto (here modes:[")
if(NOT EXISTS "${oom}/out/gc_off/oom_report.md")
  message(FATAL_ERROR "no oom_report.md")
endif()
file(REMOVE_RECURSE "${oom}")
