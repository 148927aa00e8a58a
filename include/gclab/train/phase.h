// The phases of a run whose memory peaks gclab records (DESIGN.md section 5), and what runs inside one
// when it is one of the autoencoder's passes or a preview's prompt encode: the OOM report names both
// ("sample", "vae decode").
#pragma once

namespace gclab::train {

enum class Phase { setup, data, text, forward, backward, optimizer, sample, save };
// "setup", "data", ... as the metrics and reports write them.
const char* phase_name(Phase phase);

enum class Activity { model, vae_encode, vae_decode, text_encode };
// "", "vae encode", "vae decode", "text encode" (a preview encoding its prompts)
const char* activity_name(Activity activity);

}  // namespace gclab::train
