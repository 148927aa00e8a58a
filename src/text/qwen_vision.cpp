#include "gclab/text/qwen_vision.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "gclab/io/safetensors.h"
#include "gclab/memory/placement.h"
#include "gclab/nn/meta_kernels.h"

namespace gclab::text {

QwenVisionConfig QwenVisionConfig::tiny(int64_t out_hidden) {
  QwenVisionConfig c;
  c.depth = 2, c.hidden_size = 32, c.intermediate_size = 64, c.num_heads = 4, c.out_hidden_size = out_hidden;
  c.fullatt_block_indexes = {1};
  return c;
}

std::vector<int64_t> QwenVisionInput::tokens_per_image(int64_t spatial_merge_size) const {
  std::vector<int64_t> out;
  const torch::Tensor g = grid_thw.to(torch::kCPU, torch::kLong).contiguous();
  const auto a = g.accessor<int64_t, 2>();
  for (int64_t i = 0; i < g.size(0); ++i)
    out.push_back(a[i][0] * a[i][1] * a[i][2] / (spatial_merge_size * spatial_merge_size));
  return out;
}

std::pair<int64_t, int64_t> qwen_vl_smart_resize(int64_t height, int64_t width, int64_t factor, int64_t min_pixels,
                                                 int64_t max_pixels) {
  if (height <= 0 || width <= 0) throw std::invalid_argument("an empty image has no Qwen2.5-VL size");
  const double h = static_cast<double>(height), w = static_cast<double>(width), f = static_cast<double>(factor);
  if (std::max(h, w) / std::min(h, w) > 200)
    throw std::invalid_argument("Qwen2.5-VL takes images with an aspect ratio below 200, got " +
                                std::to_string(height) + "x" + std::to_string(width));
  // Python's round() rounds halves to even, as nearbyint does in the default rounding mode.
  int64_t hb = static_cast<int64_t>(std::nearbyint(h / f)) * factor;
  int64_t wb = static_cast<int64_t>(std::nearbyint(w / f)) * factor;
  if (hb * wb > max_pixels) {
    const double beta = std::sqrt(h * w / static_cast<double>(max_pixels));
    hb = std::max(factor, static_cast<int64_t>(std::floor(h / beta / f)) * factor);
    wb = std::max(factor, static_cast<int64_t>(std::floor(w / beta / f)) * factor);
  } else if (hb * wb < min_pixels) {
    const double beta = std::sqrt(static_cast<double>(min_pixels) / (h * w));
    hb = static_cast<int64_t>(std::ceil(h * beta / f)) * factor;
    wb = static_cast<int64_t>(std::ceil(w * beta / f)) * factor;
  }
  return {hb, wb};
}

std::pair<int64_t, int64_t> qwen_edit_condition_size(int64_t height, int64_t width, int64_t area, bool plus) {
  const double ratio = static_cast<double>(height) / static_cast<double>(width);
  double h = std::sqrt(static_cast<double>(area) * ratio), w = h / ratio;
  if (plus) std::swap(h, w);  // width = sqrt(area * ratio), height = width / ratio
  // Python's round() on the 32nds: halves to even.
  return {static_cast<int64_t>(std::nearbyint(h / 32)) * 32, static_cast<int64_t>(std::nearbyint(w / 32)) * 32};
}

int64_t qwen_vl_image_tokens(int64_t height, int64_t width, const QwenVisionConfig& c) {
  const int64_t factor = c.patch_size * c.spatial_merge_size;
  const auto [h, w] = qwen_vl_smart_resize(height, width, factor, kQwenVlMinPixels, kQwenVlMaxPixels);
  return (h / factor) * (w / factor);
}

QwenVisionInput qwen_vl_image_input(const torch::Tensor& image, const QwenVisionConfig& c, int64_t min_pixels,
                                    int64_t max_pixels) {
  if (image.dim() != 3 || image.size(0) != c.in_channels)
    throw std::invalid_argument("a Qwen2.5-VL image is [" + std::to_string(c.in_channels) + ", H, W], got " +
                                c10::str(image.sizes()));
  const int64_t m = c.spatial_merge_size, p = c.patch_size;
  const auto [h, w] = qwen_vl_smart_resize(image.size(1), image.size(2), p * m, min_pixels, max_pixels);
  // The processor's work is the CPU's (host memory on a GPU run; a walk's as the device it stands for).
  const memory::CpuWork cpu;
  torch::Tensor x = memory::to_cpu(image).to(torch::kFloat).unsqueeze(0);
  if (h != image.size(1) || w != image.size(2)) {
    // The processor resizes the decoded uint8 image (PIL's bicubic, or torchvision's on the uint8 tensor);
    // torch's antialiased bicubic on uint8 follows PIL's filter, within one level of it.
    const torch::Tensor levels = (x * 255).round().clamp(0, 255).to(torch::kUInt8);
    x = nn::resize_bicubic_aa(levels, {h, w}).to(torch::kFloat) / 255;
  }
  // OPENAI_CLIP_MEAN / OPENAI_CLIP_STD (transformers' image_utils).
  const torch::Tensor mean = torch::tensor({0.48145466, 0.4578275, 0.40821073}, x.options()).view({1, 3, 1, 1});
  const torch::Tensor std = torch::tensor({0.26862954, 0.26130258, 0.27577711}, x.options()).view({1, 3, 1, 1});
  x = (x - mean) / std;
  const int64_t gh = h / p, gw = w / p, ch = c.in_channels;
  // Qwen2VLImageProcessor.patchify: merge blocks row-major, the patches of each block row-major, each patch's
  // pixels channel-major, the still image repeated over the temporal patch.
  x = x.reshape({1, ch, gh / m, m, p, gw / m, m, p}).permute({0, 2, 5, 3, 6, 1, 4, 7});
  x = x.unsqueeze(6).expand({-1, -1, -1, -1, -1, -1, c.temporal_patch_size, -1, -1});
  QwenVisionInput out;
  out.pixel_values = x.reshape({gh * gw, ch * c.temporal_patch_size * p * p}).contiguous();
  out.grid_thw = torch::tensor({int64_t{1}, gh, gw}, torch::kLong).view({1, 3});
  return out;
}

namespace {

// What the tower's forward needs from grid_thw (transformers' vision_utils): each patch's (row, column) in
// block-major order, the windows' order and boundaries, and each frame's boundaries.
struct VisionLayout {
  torch::Tensor positions;               // [patches, 2]
  torch::Tensor window_index;            // [patches / merge^2]: merge units in window order
  std::vector<int64_t> frames, windows;  // cumulative boundaries, in patches
};

VisionLayout vision_layout(const torch::Tensor& grid_thw, const QwenVisionConfig& c) {
  const int64_t m = c.spatial_merge_size, unit = m * m;
  const int64_t vw = c.window_size / m / c.patch_size;  // merge units per window side
  VisionLayout out;
  std::vector<torch::Tensor> positions, windows;
  out.frames = {0}, out.windows = {0};
  int64_t offset = 0;
  const torch::Tensor g = grid_thw.to(torch::kCPU, torch::kLong).contiguous();
  for (int64_t i = 0; i < g.size(0); ++i) {
    const int64_t t = g[i][0].item<int64_t>(), h = g[i][1].item<int64_t>(), w = g[i][2].item<int64_t>();
    if (t <= 0 || h <= 0 || w <= 0 || h % m || w % m)
      throw std::invalid_argument("image_grid_thw row " + std::to_string(i) + " is not a grid of whole " +
                                  std::to_string(m) + "x" + std::to_string(m) + " merge blocks: " + c10::str(g[i]));
    const torch::Tensor hp = torch::arange(h).view({h, 1}).expand({h, w});
    const torch::Tensor wp = torch::arange(w).view({1, w}).expand({h, w});
    auto blocks = [&](const torch::Tensor& a) { return a.reshape({h / m, m, w / m, m}).transpose(1, 2).flatten(); };
    positions.push_back(torch::stack({blocks(hp), blocks(wp)}, -1).repeat({t, 1}));
    for (int64_t f = 0; f < t; ++f) out.frames.push_back(out.frames.back() + h * w);
    // get_vision_window_index: the merge units padded (-100) to whole windows, read window by window.
    const int64_t lh = h / m, lw = w / m, ph = vw - lh % vw, pw = vw - lw % vw;
    const int64_t nh = (lh + ph) / vw, nw = (lw + pw) / vw;
    torch::Tensor index = torch::arange(t * lh * lw).reshape({t, lh, lw});
    index = torch::constant_pad_nd(index, {0, pw, 0, ph}, -100);
    index = index.reshape({t, nh, vw, nw, vw}).permute({0, 1, 3, 2, 4}).reshape({t, nh * nw, vw, vw});
    const torch::Tensor lengths = (index != -100).sum({2, 3}).reshape(-1);
    const torch::Tensor flat = index.reshape(-1);
    windows.push_back(flat.index({flat != -100}) + offset);
    for (int64_t n : std::vector<int64_t>(lengths.data_ptr<int64_t>(), lengths.data_ptr<int64_t>() + lengths.numel()))
      if (n > 0) out.windows.push_back(out.windows.back() + n * unit);  // unique_consecutive drops empty ones
    offset += t * lh * lw;
  }
  out.positions = torch::cat(positions);
  out.window_index = torch::cat(windows);
  return out;
}

// [patches, ...] reordered by merge unit: permute_input_for_window_attn.
torch::Tensor by_window(const torch::Tensor& x, const torch::Tensor& window_index, int64_t unit) {
  const int64_t n = x.size(0);
  return nn::index_rows(x.reshape({n / unit, -1}), window_index.to(x.device())).reshape({n, -1});
}

}  // namespace

struct QwenVisionTowerImpl::Block {
  nn::RMSNorm norm1{nullptr}, norm2{nullptr};
  nn::Linear qkv{nullptr}, proj{nullptr}, gate{nullptr}, up{nullptr}, down{nullptr};
};

QwenVisionTowerImpl::QwenVisionTowerImpl(const QwenVisionConfig& c, const torch::TensorOptions& options) : config_(c) {
  const int64_t d = c.hidden_size;
  if (d % c.num_heads || (d / c.num_heads) % 4)
    throw std::invalid_argument("vision tower: hidden_size / num_heads must be a multiple of 4");
  patch_weight_ =
      nn::holder_at(*this, "patch_embed.proj")
          .register_parameter(
              "weight",
              torch::randn({d, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size}, options) * 0.02);
  for (int64_t i = 0; i < c.depth; ++i) {
    auto b = std::make_shared<Block>();
    const std::string p = "blocks." + std::to_string(i) + ".";
    b->norm1 = nn::register_at(*this, p + "norm1", nn::RMSNorm(d, 1e-6, true, options));
    b->norm2 = nn::register_at(*this, p + "norm2", nn::RMSNorm(d, 1e-6, true, options));
    b->qkv = nn::register_at(*this, p + "attn.qkv", nn::Linear(nn::LinearOptions(d, 3 * d).tensor_options(options)));
    b->proj = nn::register_at(*this, p + "attn.proj", nn::Linear(nn::LinearOptions(d, d).tensor_options(options)));
    b->gate = nn::register_at(*this, p + "mlp.gate_proj",
                              nn::Linear(nn::LinearOptions(d, c.intermediate_size).tensor_options(options)));
    b->up = nn::register_at(*this, p + "mlp.up_proj",
                            nn::Linear(nn::LinearOptions(d, c.intermediate_size).tensor_options(options)));
    b->down = nn::register_at(*this, p + "mlp.down_proj",
                              nn::Linear(nn::LinearOptions(c.intermediate_size, d).tensor_options(options)));
    blocks_.push_back(b);
  }
  const int64_t merged = d * c.spatial_merge_size * c.spatial_merge_size;
  merger_norm_ = nn::register_at(*this, "merger.ln_q", nn::RMSNorm(d, 1e-6, true, options));
  merger_in_ =
      nn::register_at(*this, "merger.mlp.0", nn::Linear(nn::LinearOptions(merged, merged).tensor_options(options)));
  merger_out_ = nn::register_at(*this, "merger.mlp.2",
                                nn::Linear(nn::LinearOptions(merged, c.out_hidden_size).tensor_options(options)));
  for (auto& p : parameters()) p.set_requires_grad(false);
}

torch::Tensor QwenVisionTowerImpl::forward(const QwenVisionInput& input) {
  const auto& c = config_;
  const int64_t unit = c.spatial_merge_size * c.spatial_merge_size, heads = c.num_heads;
  const int64_t hd = c.hidden_size / heads,
                patch_dim = c.in_channels * c.temporal_patch_size * c.patch_size * c.patch_size;
  const VisionLayout layout = vision_layout(input.grid_thw, c);
  const torch::Tensor& pv = input.pixel_values;
  if (pv.dim() != 2 || pv.size(1) != patch_dim || pv.size(0) != layout.frames.back())
    throw std::invalid_argument("pixel_values must be [" + std::to_string(layout.frames.back()) + ", " +
                                std::to_string(patch_dim) + "] for image_grid_thw " + c10::str(input.grid_thw.sizes()) +
                                ", got " + c10::str(pv.sizes()));
  // Qwen2_5_VisionPatchEmbed: a Conv3d whose stride is its kernel over the whole patch, which is a Linear
  // on the patch's values (channel, frame, row, column: the weight's order).
  torch::Tensor h = at::linear(pv.to(patch_weight_.scalar_type()), patch_weight_.view({c.hidden_size, -1}));
  h = by_window(h, layout.window_index, unit);
  // Qwen2_5_VLVisionRotaryEmbedding: the row's frequencies then the column's, twice, in float32.
  const auto fopts = torch::TensorOptions().dtype(torch::kFloat).device(h.device());
  const int64_t spatial = hd / 2;
  const torch::Tensor inv_freq =
      1.0 / torch::pow(c.rope_theta, torch::arange(0, spatial, 2, fopts) / static_cast<double>(spatial));
  const torch::Tensor freqs = layout.positions.to(fopts).unsqueeze(-1) * inv_freq;  // [N, 2, hd / 4]
  const torch::Tensor hw = torch::cat({freqs.select(1, 0), freqs.select(1, 1)}, -1);
  const torch::Tensor emb = by_window(torch::cat({hw, hw}, -1), layout.window_index, unit).unsqueeze(1);
  const torch::Tensor cos = emb.cos(), sin = emb.sin();  // [N, 1, hd]
  const int64_t n = h.size(0);
  for (size_t i = 0; i < blocks_.size(); ++i) {
    Block& b = *blocks_[i];
    const bool full = std::find(c.fullatt_block_indexes.begin(), c.fullatt_block_indexes.end(),
                                static_cast<int64_t>(i)) != c.fullatt_block_indexes.end();
    const std::vector<int64_t>& bounds = full ? layout.frames : layout.windows;
    {  // the attention's tensors are freed before the MLP runs, as in transformers' forward
      const auto qkv = b.qkv->forward(b.norm1->forward(h)).reshape({n, 3, heads, hd}).unbind(1);
      // apply_rotary_pos_emb_vision: in float32, back to the activations' dtype.
      const torch::Tensor q = nn::apply_rope_half(qkv[0].to(torch::kFloat), cos, sin).to(h.scalar_type());
      const torch::Tensor k = nn::apply_rope_half(qkv[1].to(torch::kFloat), cos, sin).to(h.scalar_type());
      std::vector<torch::Tensor> parts;  // attention within each window (or frame), as the non-flash path does
      for (size_t s = 0; s + 1 < bounds.size(); ++s) {
        auto seg = [&](const torch::Tensor& x) {
          return x.slice(0, bounds[s], bounds[s + 1]).transpose(0, 1).unsqueeze(0);
        };
        parts.push_back(nn::attention(seg(q), seg(k), seg(qkv[2]), {}, 1.0 / std::sqrt(static_cast<double>(hd)))
                            .squeeze(0)
                            .transpose(0, 1));
      }
      h = h + b.proj->forward(torch::cat(parts).reshape({n, -1}));
    }
    h = h + nn::swiglu(*b.gate, *b.up, *b.down, b.norm2->forward(h));
  }
  // Qwen2_5_VLPatchMerger, then back from window order.
  torch::Tensor merged =
      merger_out_->forward(torch::gelu(merger_in_->forward(merger_norm_->forward(h).view({-1, c.hidden_size * unit}))));
  return nn::index_rows(merged, torch::argsort(layout.window_index).to(merged.device()));
}

QwenVisionInput qwen_vl_batch(const std::vector<QwenVisionInput>& images, const torch::Device& device,
                              torch::ScalarType dtype) {
  std::vector<torch::Tensor> pixels, grids;
  for (const QwenVisionInput& in : images) pixels.push_back(in.pixel_values), grids.push_back(in.grid_thw);
  torch::Tensor batched;
  {
    const memory::CpuWork cpu;  // the processor's batch, on the CPU
    batched = torch::cat(pixels);
  }
  return {memory::to_device(batched, device, dtype), torch::cat(grids)};
}

std::vector<std::string> load_qwen_vision_weights(QwenVisionTowerImpl& tower, const std::filesystem::path& path) {
  return io::load_module_weights(tower, path, io::transformers_weight_files(), [](const std::string& name) {
    return std::vector<std::string>{"visual." + name, "model.visual." + name};
  });
}

}  // namespace gclab::text
