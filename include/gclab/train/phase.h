// The phases of a run whose memory peaks gclab records (DESIGN.md section 5), and what runs inside one
// when it is one of the autoencoder's passes: the OOM report names both ("sample", "vae decode").
#pragma once

namespace gclab::train {

enum class Phase { setup, data, text, forward, backward, optimizer, sample, save };
// "setup", "data", ... as the metrics and reports write them.
const char* phase_name(Phase phase);

enum class Activity { model, vae_encode, vae_decode };
// "", "vae encode", "vae decode"
const char* activity_name(Activity activity);

}  // namespace gclab::train
