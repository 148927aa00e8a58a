#!/usr/bin/env bash
# The load table of docs/results/quantization.md: `gclab estimate` (meta device, no run) for each shared AI
# Toolkit config as written and with model.low_vram flipped: the load's device and host peaks (GiB), as the
# arch's AI Toolkit loader quantizes the transformer (train/loading.h).
set -euo pipefail
cd "$(dirname "$0")/../.."
gclab=build/bin/gclab
shared=${GCLAB_SHARED_DIR:-../shared}/aitk-configs
echo "| config | low_vram | transformer quantized | device peak | host peak |"
echo "|---|---|---|---:|---:|"
for c in flux_24gb flux_schnell_24gb flex_24gb flex2_24gb qwen_image_24gb qwen_image_edit_32gb \
  qwen_image_edit_2509_32gb; do
  for lv in false true; do
    "$gclab" estimate "$shared/train_lora_$c.yaml" --set "model.low_vram=$lv" --json 2>/dev/null |
      python3 -c '
import json, sys
e = json.load(sys.stdin)["estimate"]; G = 2 ** 30; l = e["load"]
where = "in host memory" if l["host_peak"] > 0 else "on the device"
print("| %s | %s | %s | %.2f | %.2f |" % (sys.argv[1], sys.argv[2], where, l["device_peak"] / G, l["host_peak"] / G))' \
        "train_lora_$c" "$lv"
  done
done
