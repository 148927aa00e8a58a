// The activation functions the encoders' configs name (transformers' ACT2FN spellings), as a type: read once
// from config.json, applied without a string comparison per call.
#pragma once

#include <torch/types.h>

#include <optional>
#include <string>

namespace gclab::nn {

enum class Activation {
  relu,
  gelu,        // erf GELU ("gelu")
  gelu_tanh,   // the tanh approximation ("gelu_new", "gelu_pytorch_tanh")
  silu,        // "silu", "swish"
  quick_gelu,  // x * sigmoid(1.702 x) ("quick_gelu": CLIP-L)
};

// The transformers name's activation; nullopt for one gclab does not build.
std::optional<Activation> parse_activation(const std::string& name);
const char* name_of(Activation activation);
torch::Tensor activate(Activation activation, const torch::Tensor& x);

}  // namespace gclab::nn
