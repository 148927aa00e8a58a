// Flex.2's training inputs beside the latents: AI Toolkit's Flex2.condition_noisy_latents
// (extensions_built_in/flex2/flex2.py:376-527) with the mask helpers it calls (toolkit/util/mask.py:
// generate_random_mask, get_gaussian_kernel, random_dialate_mask; flex2.py:41-48 random_blur), step for step.
// The draws come from torch's generator (the run's), where AI Toolkit draws from Python's and NumPy's.
#include "model/families/flux/flex2_condition.h"

#include "gclab/config/user_error.h"
#include "gclab/data/image.h"
#include "gclab/memory/tracker.h"

#include <algorithm>
#include <cmath>

namespace gclab::model::flux {

namespace {

namespace F = torch::nn::functional;

double uniform(double lo, double hi) { return lo + (hi - lo) * torch::rand({1}, torch::kDouble).item<double>(); }
// numpy.random.randint(lo, hi): [lo, hi).
int64_t randint(int64_t lo, int64_t hi) { return torch::randint(lo, std::max(hi, lo + 1), {1}).item<int64_t>(); }
// `random.random() < p if p > 0 else False`: no draw at p = 0.
bool happens(double p) { return p > 0.0 && uniform(0.0, 1.0) < p; }

// get_gaussian_kernel(size, sigma): exp(-(x² + y²) / 2σ²) on linspace(-2σ, 2σ, size)², normalised.
torch::Tensor gaussian_kernel(int64_t size, double sigma) {
  const torch::Tensor x = torch::linspace(-sigma * 2, sigma * 2, size).view({1, -1}).repeat({size, 1});
  const torch::Tensor y = x.transpose(0, 1);
  torch::Tensor g = torch::exp(-(x.square() + y.square()) / (2 * sigma * sigma));
  return (g / g.sum()).view({1, 1, size, size});
}

// F.pad(x, (p, p, p, p), mode='reflect'); a latent too small to reflect that far is padded by replication
// instead (AI Toolkit would fail there).
torch::Tensor pad_reflect(const torch::Tensor& x, int64_t p) {
  const bool fits = p < x.size(-1) && p < x.size(-2);
  auto options = F::PadFuncOptions({p, p, p, p});
  if (fits)
    options.mode(torch::kReflect);
  else
    options.mode(torch::kReplicate);
  return F::pad(x, options);
}

torch::Tensor smooth(const torch::Tensor& x, const torch::Tensor& kernel) {
  return F::conv2d(pad_reflect(x, kernel.size(-1) / 2), kernel.to(x.device()));
}

// generate_random_mask(B, h, w): 1 to 3 smooth blobs per mask, covering 20-80%.
torch::Tensor random_blob_mask(int64_t batch, int64_t h, int64_t w, const torch::Device& device) {
  const auto opts = torch::TensorOptions().device(device);
  torch::Tensor masks = torch::zeros({batch, 1, h, w}, opts);
  const torch::Tensor y = torch::arange(h, opts).to(torch::kFloat).view({h, 1}).expand({h, w});
  const torch::Tensor x = torch::arange(w, opts).to(torch::kFloat).view({1, w}).expand({h, w});
  const torch::Tensor small = gaussian_kernel(7, 1.0), large = gaussian_kernel(15, 2.5);
  const int64_t max_radius = std::min(h, w) / 3, min_radius = std::min(h, w) / 8;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t blobs = randint(1, 4);
    const double target = uniform(0.2, 0.8);
    torch::Tensor mask = torch::zeros({1, 1, h, w}, opts);
    for (int64_t k = 0; k < blobs; ++k) {
      torch::Tensor field = torch::zeros({h, w}, opts);
      const int64_t waves = randint(2, 5);
      for (int64_t i = 0; i < waves; ++i) {
        const double fx = uniform(1.0, 3.0) * M_PI / static_cast<double>(w);
        const double fy = uniform(1.0, 3.0) * M_PI / static_cast<double>(h);
        const double px = uniform(0, 2 * M_PI), py = uniform(0, 2 * M_PI);
        const double amp = uniform(0.5, 1.0) * static_cast<double>(max_radius) / (static_cast<double>(i) + 1.5);
        field = field + torch::sin(x * fx + px) * torch::sin(y * fy + py) * amp;
      }
      const int64_t cy = randint(h / 4, 3 * h / 4), cx = randint(w / 4, 3 * w / 4);
      const int64_t radius = randint(min_radius, max_radius);
      const double sy = uniform(0.6, 1.4), sx = uniform(0.6, 1.4), theta = uniform(0, 2 * M_PI);
      const torch::Tensor ys = (y - static_cast<double>(cy)) * sy, xs = (x - static_cast<double>(cx)) * sx;
      const torch::Tensor ry = ys * std::cos(theta) - xs * std::sin(theta);
      const torch::Tensor rx = ys * std::sin(theta) + xs * std::cos(theta);
      const torch::Tensor distance = torch::sqrt(ry.square() + rx.square()) + field;
      torch::Tensor blob = (distance < static_cast<double>(radius)).to(torch::kFloat).view({1, 1, h, w});
      blob = (smooth(blob, large) > uniform(0.3, 0.6)).to(torch::kFloat);
      blob = (smooth(blob, small) > 0.5).to(torch::kFloat);
      mask = torch::maximum(mask, blob);
    }
    const double coverage = mask.mean().item<double>();
    if (coverage > 0 && coverage < target * 0.7)  // too small: dilate
      mask = F::max_pool2d(pad_reflect(mask, 2), F::MaxPool2dFuncOptions(5).stride(1));
    else if (coverage > 0 && coverage > target * 1.3)  // too large: erode
      mask = (F::avg_pool2d(pad_reflect(mask, 1), F::AvgPool2dFuncOptions(3).stride(1)) > 0.7).to(torch::kFloat);
    masks[b] = (smooth(mask, small) > 0.5).to(torch::kFloat)[0];
  }
  return masks;
}

// random_blur(mask, 3, 8, p=0.5): torchvision's gaussian_blur with an odd kernel of 3 to 9 and its default
// sigma, reflect-padded.
torch::Tensor random_blur(const torch::Tensor& mask) {
  if (!(uniform(0.0, 1.0) < 0.5)) return mask;
  int64_t k = torch::randint(3, 9, {1}).item<int64_t>();  // random.randint(3, 8), inclusive
  if (k % 2 == 0) ++k;
  const double sigma = 0.3 * ((static_cast<double>(k) - 1) * 0.5 - 1) + 0.8;
  const torch::Tensor t = torch::linspace(-(static_cast<double>(k) - 1) / 2, (static_cast<double>(k) - 1) / 2, k);
  torch::Tensor g = torch::exp(-0.5 * (t / sigma).square());
  g = g / g.sum();
  const torch::Tensor kernel = torch::outer(g, g).view({1, 1, k, k}).to(mask.options());
  return F::conv2d(pad_reflect(mask, k / 2), kernel);
}

// random_dialate_mask(mask, 0.05): per sample an odd box of up to 5% of the width, thresholded at a random
// level in [0.2, 0.8].
torch::Tensor random_dilate(const torch::Tensor& mask) {
  const int64_t max_size = std::max<int64_t>(3, static_cast<int64_t>(static_cast<double>(mask.size(-1)) * 0.05));
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& chunk : mask.chunk(mask.size(0), 0)) {
    int64_t k = randint(1, max_size);
    if (k < 2) {
      out.push_back(chunk);
      continue;
    }
    if (k % 2 == 0) ++k;
    const torch::Tensor kernel = torch::ones({1, 1, k, k}, chunk.options()) / static_cast<double>(k * k);
    const torch::Tensor padded = F::pad(chunk, F::PadFuncOptions({k / 2, k / 2, k / 2, k / 2}));
    out.push_back((F::conv2d(padded, kernel) > uniform(0.2, 0.8)).to(chunk.scalar_type()));
  }
  return torch::cat(out, 0);
}

}  // namespace

torch::Tensor flex2_condition(const config::ModelKwargs& k, const torch::Tensor& x0,
                              const std::vector<torch::Tensor>& controls, const torch::Tensor& keep_image) {
  torch::NoGradGuard no_grad;
  const int64_t batch = x0.size(0), h = x0.size(2), w = x0.size(3);
  // Inpainting (flex2.py:383-467): the batch's mask (its inpainting images' alpha, else its loss mask), none
  // when inpaint_random_chance says so, a random one when there is none and do_random_inpainting asks.
  const bool inpaint_dropout = happens(k.inpaint_dropout);
  torch::Tensor keep;  // 1: keep, 0: inpaint, at the latents' size
  if (keep_image.defined())
    keep = F::interpolate(
        keep_image.to(x0.device(), x0.scalar_type()),
        F::InterpolateFuncOptions().size(std::vector<int64_t>{h, w}).mode(torch::kBilinear).align_corners(false));
  if (happens(k.inpaint_random_chance)) keep = torch::Tensor();  // "force a random tensor"
  if (!keep.defined() && !inpaint_dropout && k.do_random_inpainting)
    keep = (1 - random_blob_mask(batch, h, w, x0.device())).to(x0.scalar_type());
  torch::Tensor inpaint;
  if (keep.defined() && !inpaint_dropout) {
    if (k.random_blur_mask) keep = random_blur(keep);
    if (happens(k.invert_inpaint_mask_chance)) keep = 1 - keep;
    const torch::Tensor masked = x0 * keep;  // the latents zeroed where the model inpaints
    if (k.random_dialate_mask) keep = random_dilate(keep);
    inpaint = torch::cat({masked, 1 - keep}, 1);  // the mask: 1 where it inpaints
  } else {
    // "we are technically inpainting everything": zero latents, a mask of ones.
    inpaint = torch::cat({torch::zeros_like(x0), torch::ones({batch, 1, h, w}, x0.options())}, 1);
  }
  // The control (flex2.py:469-524): zeros without one or when dropped, else one control folder's latents,
  // chosen for the batch.
  torch::Tensor control;
  if (controls.empty() || happens(k.control_dropout))
    control = torch::zeros_like(x0);
  else
    control = controls.at(static_cast<size_t>(randint(0, static_cast<int64_t>(controls.size())))).to(x0.options());
  return torch::cat({inpaint, control}, 1);
}

namespace {

// generate_single_image's test (flex2.py:236): the file's name says it is an inpainting image.
bool names_inpainting(const std::filesystem::path& file) {
  return file.filename().string().find(".inpaint.") != std::string::npos;
}

}  // namespace

void check_flex2_preview_control(const std::filesystem::path& file, int index) {
  const bool inpaint = names_inpainting(file);
  if (inpaint && !data::opens_as_rgba(file))
    throw UserError("sample: ctrl_img " + file.string() +
                    " is named as an inpainting image (.inpaint.) but has no alpha channel; Flex.2's preview "
                    "refuses it (flex2.py:238-240). Give it an alpha (0 where the model inpaints) or rename it.");
  const int slot = inpaint ? 0 : 1;  // the pipeline's control_image_list: [inpainting, control]
  if (index != slot)
    throw UserError("sample: ctrl_img " + file.string() + " is " +
                    (inpaint ? "an inpainting image (slot 0)" : "a control image (slot 1)") + " but ctrl_idx is " +
                    std::to_string(index) + (index == 0 ? " (the default)" : "") +
                    ": Flex.2's pipeline would put it where its transformer takes " +
                    (index == 0   ? "the inpainting latents and mask"
                     : index == 1 ? "the control latents"
                                  : "nothing") +
                    " and fail at the first preview. Give the prompt --ctrl_idx " + std::to_string(slot) +
                    " (or ctrl_idx: " + std::to_string(slot) + " in its sample item).");
}

torch::Tensor flex2_preview_condition(const std::filesystem::path& file, int index, int width, int height,
                                      const std::function<torch::Tensor(const torch::Tensor&)>& encode) {
  torch::NoGradGuard no_grad;
  const bool inpaint = names_inpainting(file);  // checked when the run was planned (check_flex2_preview_control)
  torch::Tensor pixels, image;
  {
    memory::HostScope host;  // read and prepared in host memory, as the pipeline does: the encode copies it
    pixels = inpaint ? data::decode_image_rgba(file) : data::decode_image_rgb(file);
    // prepare_image: resized to the preview's size, in [-1, 1] (diffusers' VaeImageProcessor.preprocess).
    image = data::to_unit_range(data::resize_rgb(pixels.narrow(2, 0, 3).contiguous(), width, height)).unsqueeze(0);
  }
  const torch::Tensor z = encode(image);
  const int64_t h = z.size(2), w = z.size(3);
  std::vector<torch::Tensor> slots = {torch::cat({torch::zeros_like(z), torch::ones({1, 1, h, w}, z.options())}, 1),
                                      torch::zeros_like(z)};
  torch::Tensor entry = z;
  if (inpaint) {  // pipeline.py:184-223: the alpha / 255 at the image's size, bilinear to the latents'
    const torch::Tensor alpha = pixels.narrow(2, 3, 1).permute({2, 0, 1}).unsqueeze(0).to(z.options()) / 255.0;
    const torch::Tensor keep = F::interpolate(
        alpha,
        F::InterpolateFuncOptions().size(std::vector<int64_t>{h, w}).mode(torch::kBilinear).align_corners(false));
    entry = torch::cat({z * keep, 1 - keep}, 1);
  }
  slots.at(static_cast<size_t>(index)) = entry;
  return torch::cat(slots, 1);
}

}  // namespace gclab::model::flux
