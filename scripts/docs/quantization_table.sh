#!/usr/bin/env bash
# The "bytes per qtype" table of docs/results/quantization.md: `gclab estimate` (meta device, no run) for
# each family's AI Toolkit config at 1024², batch 1, LoRA rank 16, the text encoders resident in bf16
# (quantize_te off, embeddings not cached) so that only the transformer's storage changes. GiB.
set -euo pipefail
cd "$(dirname "$0")/../.."
gclab=build/bin/gclab
shared=${GCLAB_SHARED_DIR:-../shared}/aitk-configs
row() {  # family qtype config [--set ...]
  local family=$1 qtype=$2 config=$3 label=${2//|/ + adapter }
  shift 3
  local q=(--set model.quantize=true --set "model.qtype=$qtype")
  [ "$qtype" = bf16 ] && q=(--set model.quantize=false)
  "$gclab" estimate "$config" "$@" "${q[@]}" --set model.quantize_te=false --set train.cache_text_embeddings=false \
    --set 'datasets.0.resolution=[1024]' --set network.linear=16 --set train.batch_size=1 --json 2>/dev/null |
    python3 -c '
import json, sys
e = json.load(sys.stdin)["estimate"]; G = 2 ** 30
r = [x for x in e["per_resolution"] if x["resolution"] == 1024][0]
print("| %s | %s | %.2f | %.2f | %.2f |" % (sys.argv[1], sys.argv[2], e["weights"] / G, r["gc_full"]["total"] / G,
                                             r["gc_off"]["total"] / G))' "$family" "$label"
}
echo "| family | qtype | weights | GC full | GC off |"
echo "|---|---|---:|---:|---:|"
for q in bf16 qfloat8 float8 int8 uint2 uint3 uint4 uint6; do row FLUX.1-dev "$q" "$shared/train_lora_flux_24gb.yaml"; done
# "uint3|name": an accuracy-recovery adapter that is not a local file, built at rank 16.
for q in bf16 qfloat8 float8 int8 uint3 "uint3|rank16" uint4; do
  row Qwen-Image "$q" "$shared/train_lora_qwen_image_24gb.yaml"
done
for q in bf16 qfloat8 int8 uint3; do row Z-Image "$q" configs/aitk-ui/zimage_turbo.yaml; done
for q in bf16 qfloat8 int8 uint3; do row Chroma "$q" configs/aitk-ui/chroma.yaml; done
for q in bf16 qfloat8 int8 uint3; do row FLUX.2-dev "$q" configs/aitk-ui/flux2.yaml; done
for q in bf16 qfloat8 int8 uint3; do row FLUX.2-klein-4B "$q" configs/aitk-ui/flux2_klein_4b.yaml; done
for q in bf16 qfloat8 int8 uint3; do row FLUX.2-klein-9B "$q" configs/aitk-ui/flux2_klein_9b.yaml; done
for q in bf16 qfloat8 int8 uint3; do
  row SD3.5-large "$q" "$shared/train_lora_flux_24gb.yaml" --set model.arch=sd3 \
    --set model.name_or_path=stabilityai/stable-diffusion-3.5-large
done
