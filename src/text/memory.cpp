#include "gclab/text/memory.h"

#include <algorithm>

#include "gclab/memory/live_set.h"

namespace gclab::text {

namespace {

// The live set of an encode with the encoders' building blocks, each as the encoders' code runs it; sizes
// in elements of the compute dtype unless said otherwise, every result allocated in the live set.
class TextWalk {
 public:
  explicit TextWalk(const EncodeMemoryOptions& o) : o_(o) {}
  memory::LiveSet s;

  int64_t act(int64_t elements) const { return elements * o_.dtype_bytes; }
  bool half() const { return o_.dtype_bytes < 4; }

  // A Linear on `rows` rows: its output; a quantized one first dequantizes its weight (the codes converted,
  // then scaled: two copies for a moment), which then sits beside the matmul's output.
  int64_t linear(int64_t rows, int64_t in, int64_t out) {
    const int64_t y = act(rows * out);
    if (o_.quantized_linears) {
      const int64_t w = act(in * out);
      s.spike(2 * w);
      s.spike(w + y);
    }
    s.alloc(y);
    return y;
  }
  // LayerNorm: the output beside the float32 mean and inverse deviation of each row.
  int64_t layer_norm(int64_t rows, int64_t width) {
    const int64_t y = act(rows * width);
    s.spike(y + 8 * rows);
    s.alloc(y);
    return y;
  }
  // Qwen's RMSNorm (qwen_lm.cpp): the input in float32 (a copy in a half dtype) kept while its square, the
  // row means and the float32 normalised rows are made; then the normalised rows in the dtype times the weight.
  int64_t qwen_rms_norm(int64_t rows, int64_t width) {
    const int64_t n = rows * width, f = half() ? 4 * n : 0;
    s.alloc(f);
    s.spike(4 * n + 12 * rows + 4 * n);  // the square, its mean (+ eps, rsqrt), the normalised rows
    s.alloc(4 * n);
    if (half()) s.alloc(act(n));  // back to the dtype
    const int64_t y = act(n);
    s.alloc(y);
    if (half()) s.free(act(n));
    s.free(4 * n + f);
    return y;
  }
  // diffusers' RMSNorm (nn::RMSNorm) and T5's norm: the square's row means in float32 first, then the input
  // times their inverse square root in float32, in the dtype, times the weight.
  int64_t rms_norm(int64_t rows, int64_t width) {
    const int64_t n = rows * width;
    s.spike((half() ? 4 * n : 0) + 4 * n + 4 * rows);  // the float32 copy, its square, the means
    s.alloc(4 * rows);
    s.spike(8 * rows + 4 * n);  // + eps, rsqrt, the float32 product
    s.alloc(4 * n);
    if (half()) s.alloc(act(n)), s.free(4 * n);
    const int64_t y = act(n);
    s.alloc(y);
    s.free((half() ? act(n) : 4 * n) + 4 * rows);
    return y;
  }
  // scaled_dot_product_attention: its output in the dtype, the kernel's temporaries beside it, and a
  // contiguous copy of an additive mask that is not (`mask_copy` bytes: T5's bias viewed from [T, T, heads]).
  int64_t attention(int64_t batch_heads, int64_t q_len, int64_t kv_len, int64_t head_dim, int64_t mask_copy = 0) {
    const int64_t out = act(batch_heads * q_len * head_dim);
    s.spike(out + mask_copy +
            (o_.cpu ? memory::cpu_flash_attention_temporaries(batch_heads, q_len, kv_len, head_dim, o_.threads,
                                                              o_.dtype_bytes)
                    : 4 * batch_heads * q_len));
    s.alloc(out);
    return out;
  }
  // nn::apply_rope_half on `bytes` of input: x * cos, the negated half, the rotated copy and its product
  // with sin live until their sum is made; the sum is kept.
  int64_t rope(int64_t bytes) {
    s.spike(bytes + bytes / 2 + bytes + bytes + bytes);
    s.alloc(bytes);
    return bytes;
  }
  // nn::causal_additive_mask: the bool causal mask (ones, their upper triangle), with the padded keys
  // [B, 1, T, T] (a bool row per input), then zeros in the dtype filled from it; returns the mask's bytes,
  // allocated (the bool masks freed).
  int64_t causal_mask(int64_t batch, int64_t tokens, bool masked) {
    const int64_t square = tokens * tokens;
    s.alloc(square), s.alloc(square), s.free(square);
    int64_t hidden = square;
    if (masked) s.alloc(batch * tokens), s.alloc(batch * square), s.free(batch * tokens + square), hidden *= batch;
    const int64_t mask = act(hidden);
    s.alloc(mask), s.alloc(mask), s.free(mask + hidden);
    return mask;
  }
  // nn::swiglu on `rows` rows (the input the caller's): silu(gate) replaces gate's output, then up's output
  // and the product, then down's output; the product is freed when it returns.
  int64_t swiglu(int64_t rows, int64_t width, int64_t inter) {
    const int64_t i = linear(rows, width, inter);
    s.alloc(i);  // silu
    s.free(i);   // gate's output
    linear(rows, width, inter);
    s.alloc(i);  // the product
    s.free(2 * i);
    const int64_t y = linear(rows, inter, width);
    s.free(i);
    return y;
  }

  // The vision tower's forward (qwen_vision.cpp) on the images; returns its tokens' bytes, allocated.
  int64_t vision(const QwenVisionConfig& c, const std::vector<VisionGrid>& images);

 private:
  EncodeMemoryOptions o_;
};

int64_t TextWalk::vision(const QwenVisionConfig& c, const std::vector<VisionGrid>& images) {
  const int64_t m = c.spatial_merge_size, unit = m * m, vw = c.window_size / m / c.patch_size;
  const int64_t d = c.hidden_size, hd = d / c.num_heads;
  // The layout: the patches' positions and the windows' lengths (get_vision_window_index: merge units
  // padded to whole windows, empty windows dropped), each image's frame.
  std::vector<int64_t> frames, windows;
  int64_t n = 0;
  for (const VisionGrid& g : images) {
    frames.push_back(g.rows * g.columns);
    n += g.rows * g.columns;
    const int64_t lh = g.rows / m, lw = g.columns / m;
    for (int64_t wr = 0; wr * vw < lh; ++wr)
      for (int64_t wc = 0; wc * vw < lw; ++wc)
        windows.push_back(std::min(vw, lh - wr * vw) * std::min(vw, lw - wc * vw) * unit);
  }
  const int64_t layout = 16 * n + 8 * (n / unit);
  s.alloc(layout);
  // The patch embedding: a convolution whose stride is its kernel, its 3 input channels read as they are and
  // its output computed in oneDNN's blocked layout and reordered (vae/memory.h's rule).
  const int64_t x = act(n * d);
  s.spike(2 * x);
  s.alloc(x);
  s.alloc(x);  // reordered into windows
  s.free(x);
  // The rotary table in float32: the (row, column) frequencies, side by side, twice, in window order; cos, sin.
  s.spike(8 * n);
  s.alloc(2 * n * hd);      // freqs [N, 2, hd / 4]
  s.alloc(2 * n * hd);      // hw
  s.spike(4 * n * hd);      // cat({hw, hw}) before its reordering
  s.alloc(3 * 4 * n * hd);  // emb, cos, sin
  const int64_t table = 4 * n * hd + 3 * 4 * n * hd;
  for (int64_t b = 0; b < c.depth; ++b) {
    const bool full =
        std::find(c.fullatt_block_indexes.begin(), c.fullatt_block_indexes.end(), b) != c.fullatt_block_indexes.end();
    const int64_t norm = rms_norm(n, d);
    const int64_t qkv = linear(n, d, 3 * d);
    s.free(norm);
    // q and k rotated in float32 (a float32 copy of each in a half dtype), back in the dtype.
    for (int i = 0; i < 2; ++i) {
      if (half()) s.alloc(4 * n * d);
      rope(4 * n * d);
      if (half()) s.alloc(x), s.free(2 * 4 * n * d);
    }
    int64_t parts = 0;
    for (int64_t len : full ? frames : windows) parts += attention(c.num_heads, len, len, hd);
    s.alloc(x);  // the windows' outputs concatenated
    linear(n, d, d);
    s.alloc(x);     // + the residual
    s.free(3 * x);  // the concatenation, proj's output, the old hidden states
    s.free(parts + qkv + 2 * (half() ? x : 4 * n * d));
    const int64_t norm2 = rms_norm(n, d);
    const int64_t mlp = swiglu(n, d, c.intermediate_size);
    s.alloc(x);
    s.free(norm2 + mlp + x);
  }
  // The patch merger: norm, Linear, GELU, Linear on the merge units; then back from window order.
  const int64_t tokens = n / unit, out = act(tokens * c.out_hidden_size);
  const int64_t norm = rms_norm(n, d);
  const int64_t in = linear(tokens, unit * d, unit * d);
  s.alloc(in);  // gelu
  linear(tokens, unit * d, c.out_hidden_size);
  s.free(norm + 2 * in);
  s.alloc(8 * tokens);  // argsort
  s.alloc(out);
  s.free(8 * tokens + out + x + table + layout);  // the merger's output in window order, the hidden states
  return out;
}

}  // namespace

int64_t predicted_encode_bytes(const ClipTextConfig& c, int64_t batch, int64_t tokens, bool masked,
                               const EncodeMemoryOptions& o) {
  TextWalk w(o);
  const int64_t bt = batch * tokens, d = c.hidden_size, inter = c.intermediate_size;
  const int64_t h = w.act(bt * d);
  w.s.alloc(h), w.s.alloc(h), w.s.free(h);  // token embeddings, + positions
  w.causal_mask(batch, tokens, masked);
  const int64_t layers = c.num_hidden_layers;
  for (int64_t l = 0; l < layers; ++l) {
    const bool keeps_old = l + 1 == layers && layers >= 2;  // the penultimate hidden states, returned
    const int64_t n = w.layer_norm(bt, d);
    const int64_t qkv = w.linear(bt, d, d) + w.linear(bt, d, d) + w.linear(bt, d, d);
    const int64_t a = w.attention(batch * c.num_attention_heads, tokens, tokens, d / c.num_attention_heads);
    w.s.free(qkv);
    const int64_t out = w.linear(bt, d, d);
    w.s.alloc(h);
    w.s.free(out + (keeps_old ? 0 : h) + a + n);
    const int64_t n2 = w.layer_norm(bt, d);
    const int64_t f = w.linear(bt, d, inter);
    w.s.free(n2);
    if (c.hidden_act == "quick_gelu")  // x * sigmoid(1.702 x): both temporaries beside the product
      w.s.alloc(3 * f), w.s.free(3 * f);
    else
      w.s.alloc(f), w.s.free(f);
    const int64_t down = w.linear(bt, inter, d);
    w.s.alloc(h);
    w.s.free(down + h + f);
  }
  w.layer_norm(bt, d);
  w.s.alloc(w.act(batch * (d + (c.with_projection ? c.projection_dim : 0))));  // pooled (projected)
  return w.s.peak();
}

int64_t predicted_encode_bytes(const T5Config& c, int64_t batch, int64_t tokens, bool masked,
                               const EncodeMemoryOptions& o) {
  TextWalk w(o);
  const int64_t bt = batch * tokens, d = c.d_model, inner = c.num_heads * c.d_kv, t2 = tokens * tokens;
  const int64_t h = w.act(bt * d);
  w.s.alloc(h);
  // The relative-position bias (t5.cpp position_bias): int64 [T, T] differences, bucketed — each
  // expression's temporaries alive to its end — then the bias [T, T, heads] looked up from them.
  w.s.alloc(16 * tokens + 8 * t2);                                               // the two aranges, their difference
  w.s.alloc(t2 + 8 * t2 + 8 * t2), w.s.free(t2 + 8 * t2);                        // (relative > 0) as int64 times half
  w.s.alloc(8 * t2 + t2);                                                        // |relative|, is_small
  w.s.alloc(5 * 4 * t2 + 8 * t2 + 8 * t2), w.s.free(5 * 4 * t2 + 8 * t2);        // the logarithmic buckets
  w.s.alloc(8 * t2 + 8 * t2), w.s.free(2 * 8 * t2);                              // min with a full_like
  w.s.alloc(8 * t2 + 8 * t2), w.s.free(8 * t2 + 8 * t2 + 8 * t2 + t2 + 8 * t2);  // where, the sum
  w.s.free(16 * tokens + 8 * t2);
  int64_t bias = w.act(t2 * c.num_heads);
  w.s.alloc(bias), w.s.free(8 * t2);
  if (masked) {
    const int64_t filled = w.act(batch * c.num_heads * t2);
    w.s.alloc(bt), w.s.alloc(filled), w.s.free(bt + bias);
    bias = filled;
  }
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const int64_t n = w.rms_norm(bt, d);
    const int64_t qkv = w.linear(bt, d, inner) + w.linear(bt, d, inner) + w.linear(bt, d, inner);
    const int64_t a = w.attention(batch * c.num_heads, tokens, tokens, c.d_kv, masked ? 0 : bias);
    w.s.free(qkv);
    const int64_t out = w.linear(bt, inner, d);
    w.s.alloc(h);
    w.s.free(out + h + a + n);
    const int64_t n2 = w.rms_norm(bt, d);
    const int64_t f = w.linear(bt, d, c.d_ff);
    w.s.alloc(f), w.s.free(f);  // the activation replaces wi_0's output
    if (c.gated) {
      w.linear(bt, d, c.d_ff);
      w.s.alloc(f), w.s.free(2 * f);
    }
    const int64_t down = w.linear(bt, c.d_ff, d);
    w.s.alloc(h);
    w.s.free(down + h + f + n2);
  }
  w.rms_norm(bt, d);
  return w.s.peak();
}

int64_t predicted_vision_bytes(const QwenVisionConfig& config, const std::vector<VisionGrid>& images,
                               const EncodeMemoryOptions& options) {
  TextWalk w(options);
  w.vision(config, images);
  return w.s.peak();
}

int64_t predicted_encode_bytes(const QwenLmConfig& c, int64_t batch, int64_t tokens, bool masked,
                               const EncodeMemoryOptions& o, const std::vector<VisionGrid>& images,
                               const QwenVisionConfig* vision) {
  TextWalk w(o);
  const int64_t bt = batch * tokens, d = c.hidden_size, hd = c.head_dim;
  const int64_t h = w.act(bt * d);
  if (!vision && c.vision) vision = &*c.vision;
  const bool multimodal = !images.empty() && vision;
  if (multimodal) {
    // The patches as the processor gives them, and their copy in the encoder's dtype, beside the encode.
    const QwenVisionConfig& v = *vision;
    int64_t patches = 0;
    for (const VisionGrid& g : images) patches += g.rows * g.columns;
    const int64_t patch = v.in_channels * v.temporal_patch_size * v.patch_size * v.patch_size;
    w.s.alloc(4 * patches * patch + w.act(patches * patch));
    w.s.alloc(h + bt);  // the embeddings, where the image tokens are
    w.vision(v, images);
    w.s.alloc(h), w.s.free(h);  // the tower's tokens scattered into a copy of the embeddings
    w.s.spike(bt);              // get_rope_index's kept tokens
    w.s.alloc(3 * 8 * bt);      // the positions [3, B, T]
  } else {
    w.s.alloc(8 * tokens + h);  // the positions, the embeddings
  }
  // The rotary table: the positions' frequencies (per section, from three position rows), twice; cos, sin
  // in float32, then in the dtype.
  if (multimodal) {
    w.s.alloc(3 * 4 * bt), w.s.alloc(3 * 4 * bt * (hd / 2)), w.s.free(3 * 4 * bt);
    w.s.alloc(4 * bt * (hd / 2));
  } else {
    w.s.alloc(4 * bt), w.s.alloc(4 * bt * (hd / 2)), w.s.free(4 * bt);
  }
  w.s.alloc(4 * bt * hd);  // emb
  for (int i = 0; i < 2; ++i) {
    w.s.alloc(4 * bt * hd);
    if (w.half()) w.s.alloc(w.act(bt * hd)), w.s.free(4 * bt * hd);
  }
  w.causal_mask(batch, tokens, masked);
  const int64_t groups = c.num_attention_heads / c.num_key_value_heads;
  const int64_t q = w.act(bt * c.num_attention_heads * hd), kv = w.act(bt * c.num_key_value_heads * hd);
  const int64_t layers = c.num_hidden_layers;
  for (int64_t l = 0; l < layers; ++l) {
    // The input embeddings are the caller's; the penultimate hidden states are kept.
    const bool keeps_old = l == 0 || (l + 1 == layers && layers >= 2);
    const int64_t n = w.qwen_rms_norm(bt, d);
    w.linear(bt, d, c.num_attention_heads * hd);
    w.linear(bt, d, c.num_key_value_heads * hd);
    if (c.qk_norm) {
      w.qwen_rms_norm(bt * c.num_attention_heads, hd), w.s.free(q);
      w.qwen_rms_norm(bt * c.num_key_value_heads, hd), w.s.free(kv);
    }
    w.rope(q), w.s.free(q);
    w.rope(kv), w.s.alloc(kv * groups), w.s.free(2 * kv);
    w.linear(bt, d, c.num_key_value_heads * hd), w.s.alloc(kv * groups), w.s.free(kv);
    const int64_t a = w.attention(batch * c.num_attention_heads, tokens, tokens, hd);
    const int64_t out = w.linear(bt, c.num_attention_heads * hd, d);
    w.s.alloc(h);
    w.s.free(out + (keeps_old ? 0 : h) + q + 2 * kv * groups + a + n);
    const int64_t n2 = w.qwen_rms_norm(bt, d);
    const int64_t mlp = w.swiglu(bt, d, c.intermediate_size);
    w.s.alloc(h);
    w.s.free(n2 + mlp + h);
  }
  w.qwen_rms_norm(bt, d);
  return w.s.peak();
}

}  // namespace gclab::text
