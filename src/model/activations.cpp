#include "gclab/model/activations.h"
#include "gclab/model/lora.h"

#include <algorithm>

namespace gclab::model {

namespace {

// Byte counts of the tensors one block saves, named after the forward's own variables (blocks.cpp).
// Sizes are in elements times bytes; `rows` are token vectors (B x tokens).
struct Ledger {
  int64_t B, D, H, e, r;
  bool full;  // weights trained (not LoRA): tensors only a weight's gradient needs are saved too
  int64_t ln_stats_bytes;
  int64_t dropout_mask_bytes;      // per rank-sized element, with LoRA dropout
  static constexpr int64_t f = 4;  // float32 internals

  int64_t act(int64_t elements) const { return elements * e; }
  // A LoRA adapter keeps its rank-r intermediate (lora_A's output, or its dropout, saved by lora_B) and,
  // with dropout, the dropout's mask.
  int64_t lora(int64_t rows) const { return r > 0 ? rows * r * (e + dropout_mask_bytes) : 0; }
  int64_t layer_norm_stats(int64_t rows) const { return 2 * rows * ln_stats_bytes; }  // mean and 1/std
  // RMSNorm (diffusers): a float32 copy of a non-float32 input (pow's), 1/rms per vector, and the
  // normalised input when the weight is trained (for the weight's gradient).
  int64_t rms_norm(int64_t elements, int64_t vectors) const {
    return (e != 4 ? elements * f : 0) + vectors * f + (full ? act(elements) : 0);
  }
  // Fused attention: output and log-sum-exp (q, k, v are counted where they are made).
  int64_t attention(int64_t rows) const { return act(rows * D) + B * H * (rows / B) * f; }
};

// FLUX / Qwen-Image double-stream block; `n` image tokens (with references), `t` text tokens, `m` MLP width;
// `zero_cond`: Qwen-Image-Edit-2511's per-token modulation of the reference tokens.
int64_t double_stream(const Ledger& L, int64_t n, int64_t t, int64_t m, bool zero_cond = false) {
  const int64_t B = L.B, D = L.D, H = L.H, ni = B * n, nt = B * t, ns = ni + nt;
  int64_t bytes = 0;
  bytes += 2 * L.act(B * D) + L.lora(B) * 2;  // silu(temb), its two modulation Linears' inputs
  bytes += 2 * L.act(B * 6 * D);              // emb, cemb: kept by the gate views
  // attention sub-block
  bytes += L.layer_norm_stats(ns);            // LN of both streams
  bytes += L.act(ns * D) + 2 * L.act(B * D);  // LN outputs (saved by the modulation mul), 1 + scale
  bytes += L.act(ns * D);                     // modulated streams: the q/k/v projections' input
  bytes += 2 * L.act(ns * D);                 // to_q, to_k (img) and add_q_proj, add_k_proj (txt) outputs
  bytes += 2 * (L.rms_norm(ni * D, B * H * n) + L.rms_norm(nt * D, B * H * t));  // QK-norms
  bytes += 2 * L.act(ns * D);                                                    // the joint q and k, roped
  bytes += L.act(ns * D);                                                        // the joint v
  bytes += L.attention(ns);
  // The fused kernel's output comes back head-major for a concatenated q, so merging heads copies it
  // (ns x D); the output projections then save their stream's slice — views of that copy at batch 1,
  // contiguous copies of their own beyond. Either way one ns x D tensor stays.
  bytes += L.act(ns * D);
  bytes += L.act(ns * D);                    // to_out / to_add_out outputs (saved by the gate mul)
  bytes += L.lora(ni) * 4 + L.lora(nt) * 4;  // to_q/k/v/out, add_q/k/v_proj/to_add_out
  // MLP sub-block
  bytes += L.act(ns * D);  // the streams after attention (LN input)
  bytes += L.layer_norm_stats(ns) + L.act(ns * D) + 2 * L.act(B * D) + L.act(ns * D);  // LN, 1 + scale, modulated
  bytes += 2 * L.act(ns * m);                                                          // GELU input and output
  bytes += L.act(ns * D);  // net.2 outputs (saved by the gate mul)
  bytes += L.lora(ni) * 2 + L.lora(nt) * 2;
  if (zero_cond) {
    // The image stream's scale and gate are chosen per token (torch::where), so in each sub-block 1 + scale
    // and the gate the gate mul keeps are [B, n, D] tensors rather than [B, 1, D] and views of emb; emb
    // itself is then kept by nothing; the embedding of t = 0 adds one more SiLU input to img_mod.
    bytes += 2 * (L.act(ni * D) - L.act(B * D)) + 2 * L.act(ni * D) - L.act(B * 6 * D);
    bytes += L.act(B * D) + L.lora(B);
  }
  return bytes;
}

int64_t flux_single(const Ledger& L, int64_t s, int64_t m) {
  const int64_t B = L.B, D = L.D, H = L.H, ns = B * s;
  int64_t bytes = L.act(B * D) + L.lora(B) + L.act(B * 3 * D);                   // silu(temb), emb
  bytes += L.layer_norm_stats(ns) + L.act(ns * D) + L.act(B * D);                // LN, its output, 1 + scale
  bytes += L.act(ns * D);                                                        // norm_x: input of proj_mlp and q/k/v
  bytes += L.act(ns * m);                                                        // proj_mlp output (GELU's input)
  bytes += L.act(ns * (D + m));                                                  // cat(attn, mlp): proj_out's input
  bytes += 2 * (L.act(ns * D) + L.rms_norm(ns * D, B * H * s) + L.act(ns * D));  // q, k: proj, norm, roped
  bytes += L.act(ns * D);                                                        // v
  bytes += L.attention(ns);
  bytes += L.act(ns * D);   // proj_out output (gate mul)
  bytes += L.lora(ns) * 5;  // proj_mlp, to_q/k/v, proj_out
  return bytes;
}

int64_t zimage_block(const Ledger& L, int64_t s, int64_t m, bool modulation) {
  const int64_t B = L.B, D = L.D, H = L.H, ns = B * s, x = ns * D;
  int64_t bytes = 0;
  if (modulation)
    bytes += 4 * L.act(B * D) + L.lora(B);  // 1 + scale_msa, tanh(gate_msa), 1 + scale_mlp, tanh(gate_mlp)
  bytes += L.rms_norm(x, ns) + L.act(x);    // attention_norm1 (its output: scale mul / q,k,v input)
  if (modulation) bytes += L.act(x);        // attention input = norm1 * scale
  bytes += 2 * (L.act(x) + L.rms_norm(x, B * H * s) + L.act(x));  // q, k: proj, norm, roped
  bytes += L.act(x);                                              // v
  bytes += L.attention(ns);
  bytes += L.act(x);                                                    // to_out output (attention_norm2's input)
  bytes += L.rms_norm(x, ns) + (modulation ? L.act(x) : 0);             // attention_norm2 (output saved by the gate)
  bytes += L.act(x);                                                    // h after attention (ffn_norm1's input)
  bytes += L.rms_norm(x, ns) + L.act(x);                                // ffn_norm1, its output
  if (modulation) bytes += L.act(x);                                    // FFN input = norm * scale
  bytes += 4 * L.act(ns * m);                                           // w1 out, silu(w1 out), w3 out, their product
  bytes += L.act(x) + L.rms_norm(x, ns) + (modulation ? L.act(x) : 0);  // w2 out, ffn_norm2 (gate)
  bytes += L.lora(ns) * 7;                                              // to_q/k/v/out, w1, w2, w3
  return bytes;
}

int64_t sd3_joint(const Ledger& L, int64_t n, int64_t t, int64_t m, bool pre_only) {
  const int64_t B = L.B, D = L.D, H = L.H, ni = B * n, nt = B * t, ns = ni + nt;
  int64_t bytes = 2 * L.act(B * D) + 2 * L.lora(B) + L.act(B * 6 * D);                 // silu(temb) x2, emb
  if (!pre_only) bytes += L.act(B * 6 * D);                                            // cemb (kept by the text gates)
  bytes += L.layer_norm_stats(ns) + L.act(ns * D) + 2 * L.act(B * D) + L.act(ns * D);  // LN, 1 + scale, modulated
  bytes += 2 * L.act(ns * D);  // to_q, to_k, add_q_proj, add_k_proj
  bytes += 2 * (L.rms_norm(ni * D, B * H * n) + L.rms_norm(nt * D, B * H * t));
  bytes += 3 * L.act(ns * D);  // joint q, k, v
  bytes += L.attention(ns);
  const int64_t out_rows = pre_only ? ni : ns;  // the text stream's attention output is unused when pre-only
  // The merged attention output (see double_stream): at batch 1 the image slice is a view that keeps the
  // whole merged copy; beyond, a copy of the slice alone.
  bytes += L.act((pre_only && B > 1 ? ni : ns) * D);
  bytes += L.act(out_rows * D);  // to_out / to_add_out outputs
  bytes += L.lora(ni) * 4 + L.lora(nt) * (pre_only ? 3 : 4);
  // MLP sub-block, per stream still running
  bytes += 4 * L.act(out_rows * D) + L.layer_norm_stats(out_rows) + (pre_only ? 1 : 2) * L.act(B * D);
  bytes += 2 * L.act(out_rows * m);
  bytes += (L.lora(ni) + (pre_only ? 0 : L.lora(nt))) * 2;
  return bytes;
}

int64_t dit_block(const Ledger& L, int64_t n, int64_t m) {
  const int64_t B = L.B, D = L.D, ni = B * n;
  int64_t bytes = L.act(B * D) + L.lora(B) + L.act(B * 6 * D);                     // silu(c), emb
  bytes += L.layer_norm_stats(ni) + L.act(ni * D) + L.act(B * D) + L.act(ni * D);  // LN, 1 + scale, modulated
  bytes += L.act(3 * ni * D);  // qkv output: q, k, v are views of it
  bytes += L.attention(ni);    // (its transposed output is proj's input)
  bytes += L.act(ni * D);      // proj output (gate)
  bytes += L.act(ni * D);      // h after attention
  bytes += L.layer_norm_stats(ni) + L.act(ni * D) + L.act(B * D) + L.act(ni * D);
  bytes += 2 * L.act(ni * m) + L.act(ni * D);  // fc1 out, GELU out, fc2 out
  bytes += L.lora(ni) * 4;                     // qkv, proj, fc1, fc2
  return bytes;
}

}  // namespace

std::vector<int64_t> dequantized_weight_bytes(const DiffusionTransformer& model, bool conditioning_grad) {
  std::vector<int64_t> out;
  bool any = false;
  for (const auto& block : model.blocks()) {
    int64_t bytes = 0;
    for (auto& [path, linear] : nn::named_linears(*block)) bytes += linear->dequantized_bytes();
    if (!conditioning_grad)
      for (auto& linear : block->modulation_linears()) bytes -= linear->dequantized_bytes();
    any = any || bytes > 0;
    out.push_back(bytes);
  }
  return any ? out : std::vector<int64_t>{};
}

ActivationOptions activation_options(const config::ProcessConfig& config, bool cuda) {
  ActivationOptions o;
  o.element_bytes = config::dtype_bytes(config.train.dtype);
  o.lora_rank = config.network ? lora_options(*config.network).rank : 0;
  if (config.network && lora_options(*config.network).dropout > 0)
    o.lora_dropout_mask_bytes = cuda ? 1 : o.element_bytes;
  o.conditioning_grad = !config.network;
  o.layer_norm_stats_bytes = cuda ? 4 : o.element_bytes;
  return o;
}

ActivationEstimate estimate_activations(const ModelSpec& s, int64_t batch, int64_t height, int64_t width, int64_t text,
                                        const ActivationOptions& o) {
  const Ledger L{batch,
                 s.hidden,
                 s.heads,
                 o.element_bytes,
                 o.lora_rank,
                 o.lora_rank == 0,
                 o.layer_norm_stats_bytes,
                 o.lora_rank > 0 ? o.lora_dropout_mask_bytes : 0};
  ActivationEstimate est;
  const int64_t n = image_tokens(s, height, width) + reference_tokens(s, s.edit ? 1 : 0);
  const int64_t t = text > 0 ? text : text_tokens(s, kNominalCaptionTokens);
  est.image_tokens = n;
  est.text_tokens = t;
  const int64_t D = s.hidden, e = o.element_bytes, m = s.mlp_hidden;
  auto add = [&](const std::string& kind, int count, int64_t saved, int64_t input) {
    if (count > 0) est.blocks.push_back({kind, count, saved, input});
  };
  if (s.family == Family::flux) {
    add("double", s.double_blocks, double_stream(L, n, t, m), batch * (n + t) * D * e);
    add("single", s.single_blocks, flux_single(L, n + t, m), batch * (n + t) * D * e);
  } else if (s.family == Family::qwen_image) {
    add("double", s.double_blocks, double_stream(L, n, t, m, s.zero_cond_t), batch * (n + t) * D * e);
  } else if (s.family == Family::zimage) {
    const int64_t n_pad = (n + 31) / 32 * 32;
    add("noise refiner", s.refiner_blocks, zimage_block(L, n_pad, m, true), batch * n_pad * D * e);
    add("context refiner", s.refiner_blocks, zimage_block(L, t, m, false), batch * t * D * e);
    add("single", s.single_blocks, zimage_block(L, n_pad + t, m, true), batch * (n_pad + t) * D * e);
  } else if (s.family == Family::sd3) {
    add("joint", s.double_blocks - 1, sd3_joint(L, n, t, m, false), batch * (n + t) * D * e);
    add("joint (last)", 1, sd3_joint(L, n, t, m, true), batch * (n + t) * D * e);
  } else if (s.family == Family::dit) {
    add("dit", s.single_blocks, dit_block(L, n, m), batch * n * D * e);
  }
  int64_t largest_block = 0;
  size_t index = 0;  // the block's place in the model, for its dequantized weights
  for (const auto& b : est.blocks)
    for (int k = 0; k < b.count; ++k, ++index) {
      const int64_t weights = index < o.dequantized_weight_bytes.size() ? o.dequantized_weight_bytes[index] : 0;
      est.total_off_bytes += b.saved_bytes + weights;
      est.total_full_bytes += b.input_bytes;
      largest_block = std::max(largest_block, b.saved_bytes + weights);
    }
  est.full_with_recompute_bytes = est.total_full_bytes + largest_block;
  return est;
}

}  // namespace gclab::model
