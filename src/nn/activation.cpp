#include "gclab/nn/activation.h"

#include <torch/torch.h>

namespace gclab::nn {

std::optional<Activation> parse_activation(const std::string& name) {
  if (name == "relu") return Activation::relu;
  if (name == "gelu") return Activation::gelu;
  if (name == "gelu_new" || name == "gelu_pytorch_tanh") return Activation::gelu_tanh;
  if (name == "silu" || name == "swish") return Activation::silu;
  if (name == "quick_gelu") return Activation::quick_gelu;
  return std::nullopt;
}

const char* name_of(Activation activation) {
  switch (activation) {
    case Activation::relu:
      return "relu";
    case Activation::gelu:
      return "gelu";
    case Activation::gelu_tanh:
      return "gelu_new";
    case Activation::silu:
      return "silu";
    case Activation::quick_gelu:
      return "quick_gelu";
  }
  return "?";
}

torch::Tensor activate(Activation activation, const torch::Tensor& x) {
  switch (activation) {
    case Activation::relu:
      return torch::relu(x);
    case Activation::gelu:
      return torch::gelu(x);
    case Activation::gelu_tanh:
      return torch::gelu(x, "tanh");
    case Activation::silu:
      return torch::silu(x);
    case Activation::quick_gelu:
      return x * torch::sigmoid(1.702 * x);
  }
  throw std::logic_error("unknown activation");
}

}  // namespace gclab::nn
