# Runs the gclab executable the way a user does and checks exit codes and output.
include("${CMAKE_CURRENT_LIST_DIR}/cli_helpers.cmake")

set(flux "${SHARED}/aitk-configs/train_lora_flux_24gb.yaml")

expect_run(0 "${GCLAB}" check "${flux}")
expect_contains("${last_out}" "linear: 16")
expect_contains("${last_out}" "optimizer: \"adamw8bit\"")
expect_contains("${last_out}" "resolution: [512, 768, 1024]")
expect_contains("${last_out}" "checkpoint_policy: \"full\"")
expect_contains("${last_err}" "ignored")
# The model the config selects, counted on a meta-device build.
expect_contains("${last_out}" "preset: \"flux-dev\"")
expect_contains("${last_out}" "parameters: 11901408320")
expect_contains("${last_out}" "LoRA on 494 Linear modules")
expect_contains("${last_out}" "{at: \"datasets[0] 1024x1024\", image: 4096, text: 512}")

expect_run(0 "${GCLAB}" check "${flux}" --set train.gradient_checkpointing=false --vram-cap 24GiB)
expect_contains("${last_out}" "checkpoint_policy: \"off\"")
expect_contains("${last_out}" "vram_cap: 24GiB")

expect_run(2 "${GCLAB}" check "${flux}" --set train.batch_size=0)
expect_contains("${last_err}" "train.batch_size")
expect_contains("${last_err}" "--set train.batch_size=0")

expect_run(2 "${GCLAB}" check "${flux}" --set train.checkpoint_policy=sometimes)
expect_contains("${last_err}" "train.checkpoint_policy (--set train.checkpoint_policy=sometimes)")
expect_contains("${last_err}" "every:N")

expect_run(0 "${GCLAB}" check "${flux}" --set train.checkpoint_policy=every:2)
expect_contains("${last_out}" "checkpoint_policy: \"every:2\"")
# Partial policies are predicted phase by phase too: every other block keeps its activations (45.44 GiB at
# 1024², between GC full's 19.54 and GC off's 71.39).
expect_contains("${last_out}" "policy: \"every:2\"\n  predicted:\n    backward: 48787511948")

expect_run(2 "${GCLAB}" check "${SHARED}/aitk-configs/train_lora_lumina.yaml")
expect_contains("${last_err}" "lumina2")
# AI Toolkit's Wan 2.1 1.3B example: the 1.3B by its name_or_path, UMT5 quantized (quantize_te).
expect_run(0 "${GCLAB}" check "${SHARED}/aitk-configs/train_lora_wan21_1b_24gb.yaml")
expect_contains("${last_out}" "wan21-1.3b")

expect_run(2 "${GCLAB}" check /nonexistent/config.yaml)
expect_contains("${last_err}" "cannot be opened")

expect_run(2 "${GCLAB}" check)
expect_run(2 "${GCLAB}" frobnicate)
# The example config's folder is a placeholder: train refuses it, naming the field (exit 2); so is a
# CUDA device on a machine without one.
expect_run(2 "${GCLAB}" train "${flux}")
expect_contains("${last_err}" "datasets[0].folder_path")
expect_run(2 "${GCLAB}" train "${flux}" --set device=cuda:7 --set datasets.0.folder_path=${SHARED})
expect_run(2 "${GCLAB}" fit "${flux}" --set device=cpu)
expect_contains("${last_err}" "needs a cap")
# A full-size model does not fit this machine's memory: bench refuses before building it.
expect_run(2 "${GCLAB}" bench "${flux}" --set device=cpu)
expect_contains("${last_err}" "does not fit")

expect_run(0 "${GCLAB}" info)
expect_contains("${last_out}" "cuda_compiled: true")

# Every bad command-line value is exit 2 with the option named (was: exit 1, "internal error").
expect_run(2 "${GCLAB}" fit "${SOURCE}/configs/quickstart.yaml" --vram-cap 60MiB --resolution abc)
expect_contains("${last_err}" "--resolution")
expect_run(2 "${GCLAB}" bench "${SOURCE}/configs/quickstart.yaml" --gc sometimes)
expect_contains("${last_err}" "--gc")
# A policy's own commas stay inside it: the bad one named whole, after blocks:[0,3] read as one policy.
expect_run(2 "${GCLAB}" bench "${SOURCE}/configs/quickstart.yaml" --gc "blocks:[0,3],modes:[full,sometimes]")
expect_contains("${last_err}" "'modes:[full,sometimes]'")
# --caps are auto's: without auto among --gc they are refused.
expect_run(2 "${GCLAB}" bench "${SOURCE}/configs/quickstart.yaml" --gc off,full --caps 50%)
expect_contains("${last_err}" "--caps")
# check prints the plan checkpoint_policy auto chose under the cap.
expect_run(0 "${GCLAB}" check "${SOURCE}/configs/quickstart.yaml" --set train.checkpoint_policy=auto --vram-cap 60MiB)
expect_contains("${last_out}" "checkpoint policy auto: ")
# train --dry-run validates and builds on the meta device, trains nothing.
expect_run(0 "${GCLAB}" train "${SOURCE}/configs/quickstart.yaml" --dry-run)
expect_contains("${last_err}" "nothing was trained")
