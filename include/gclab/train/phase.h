// The phases of a run (memory/phase.h: the meter's and the prediction's), and what runs inside one when it
// is one of the autoencoder's passes or a preview's prompt encode: the OOM report names both ("sample",
// "vae decode").
#pragma once

#include "gclab/memory/phase.h"

namespace gclab::train {

using memory::Phase;
using memory::phase_name;

// first_frame: an image-to-video model's conditioning on the first frames (its image encoder, the VAE's encode).
enum class Activity { model, vae_encode, vae_decode, text_encode, first_frame };
// The caches filled before the first step, in the `cache` phase: the latents, then the captions' embeddings.
enum class CacheFill { latents, text };
// "", "vae encode", "vae decode", "text encode" (a preview encoding its prompts), "first-frame encode"
const char* activity_name(Activity activity);

}  // namespace gclab::train
