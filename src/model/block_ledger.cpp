#include "gclab/model/block_ledger.h"

namespace gclab::model {

int64_t double_stream(const BlockLedger& L, int64_t n, int64_t t, int64_t m, bool zero_cond) {
  const int64_t B = L.B, D = L.D, H = L.H, ni = B * n, nt = B * t, ns = ni + nt;
  int64_t bytes = 0;
  bytes += 2 * L.linear_input(B, D) + L.lora(B) * 2;  // silu(temb) twice: the two modulation Linears' inputs
  bytes += 2 * L.act(B * 6 * D);                      // emb, cemb: kept by the gate views
  // attention sub-block
  bytes += L.layer_norm_stats(ns);                               // LN of both streams
  bytes += L.act(ns * D) + 2 * L.act(B * D);                     // LN outputs (saved by the modulation mul), 1 + scale
  bytes += L.linear_input(ni, D, 3) + L.linear_input(nt, D, 3);  // modulated streams: the q/k/v projections' input
  bytes += 2 * L.act(ns * D);  // to_q, to_k (img) and add_q_proj, add_k_proj (txt) outputs
  bytes += 2 * (L.rms_norm(ni * D, B * H * n) + L.rms_norm(nt * D, B * H * t));  // QK-norms
  bytes += 2 * L.act(ns * D);                                                    // the joint q and k, roped
  bytes += L.act(ns * D);                                                        // the joint v
  bytes += L.attention(ns);
  // The fused kernel's output comes back head-major for a concatenated q, so merging heads copies it
  // (ns x D); the output projections then save their stream's slice — views of that copy at batch 1,
  // contiguous copies of their own beyond. Either way one ns x D tensor stays (or the adapters' copies).
  bytes += L.linear_input(ni, D) + L.linear_input(nt, D);
  bytes += L.act(ns * D);                    // to_out / to_add_out outputs (saved by the gate mul)
  bytes += L.lora(ni) * 4 + L.lora(nt) * 4;  // to_q/k/v/out, add_q/k/v_proj/to_add_out
  // MLP sub-block
  bytes += L.act(ns * D);                                                  // the streams after attention (LN input)
  bytes += L.layer_norm_stats(ns) + L.act(ns * D) + 2 * L.act(B * D);      // LN, 1 + scale
  bytes += L.linear_input(ni, D) + L.linear_input(nt, D);                  // modulated: net.0's input
  bytes += L.act(ns * m) + L.linear_input(ni, m) + L.linear_input(nt, m);  // GELU input, output (net.2's input)
  bytes += L.act(ns * D);                                                  // net.2 outputs (saved by the gate mul)
  bytes += L.lora(ni) * 2 + L.lora(nt) * 2;
  if (zero_cond) {
    // The image stream's scale and gate are chosen per token (torch::where), so in each sub-block 1 + scale
    // and the gate the gate mul keeps are [B, n, D] tensors rather than [B, 1, D] and views of emb; emb
    // itself is then kept by nothing; the embedding of t = 0 adds one more SiLU input to img_mod.
    bytes += 2 * (L.act(ni * D) - L.act(B * D)) + 2 * L.act(ni * D) - L.act(B * 6 * D);
    bytes += L.linear_input(B, D) + L.lora(B);
  }
  return bytes;
}

int64_t flux_single(const BlockLedger& L, int64_t s, int64_t m) {
  const int64_t B = L.B, D = L.D, H = L.H, ns = B * s;
  int64_t bytes = L.linear_input(B, D) + L.lora(B) + L.act(B * 3 * D);           // silu(temb), emb
  bytes += L.layer_norm_stats(ns) + L.act(ns * D) + L.act(B * D);                // LN, its output, 1 + scale
  bytes += L.linear_input(ns, D, 4);                                             // norm_x: input of proj_mlp and q/k/v
  bytes += L.act(ns * m);                                                        // proj_mlp output (GELU's input)
  bytes += L.linear_input(ns, D + m);                                            // cat(attn, mlp): proj_out's input
  bytes += 2 * (L.act(ns * D) + L.rms_norm(ns * D, B * H * s) + L.act(ns * D));  // q, k: proj, norm, roped
  bytes += L.act(ns * D);                                                        // v
  bytes += L.attention(ns);
  bytes += L.act(ns * D);   // proj_out output (gate mul)
  bytes += L.lora(ns) * 5;  // proj_mlp, to_q/k/v, proj_out
  return bytes;
}

int64_t zimage_block(const BlockLedger& L, int64_t s, int64_t m, int64_t adaln, bool modulation) {
  const int64_t B = L.B, D = L.D, H = L.H, ns = B * s, x = ns * D;
  int64_t bytes = 0;
  if (modulation)  // 1 + scale_msa, tanh(gate_msa), 1 + scale_mlp, tanh(gate_mlp); adaLN's input is the block's
    bytes += 4 * L.act(B * D) + L.lora(B) + L.lora_copies(B, adaln);
  // attention_norm1, its output (the scale mul's input, or q, k, v's without modulation)
  bytes += L.rms_norm(x, ns) + (modulation ? L.act(x) : L.linear_input(ns, D, 3));
  if (modulation) bytes += L.linear_input(ns, D, 3);              // attention input = norm1 * scale
  bytes += 2 * (L.act(x) + L.rms_norm(x, B * H * s) + L.act(x));  // q, k: proj, norm, roped
  bytes += L.act(x);                                              // v
  bytes += L.attention(ns) + L.lora_copies(ns, D);                // (its output is to_out's input)
  bytes += L.act(x);                                              // to_out output (attention_norm2's input)
  bytes += L.rms_norm(x, ns) + (modulation ? L.act(x) : 0);       // attention_norm2 (output saved by the gate)
  bytes += L.act(x);                                              // h after attention (ffn_norm1's input)
  bytes += L.rms_norm(x, ns) + (modulation ? L.act(x) : L.linear_input(ns, D, 2));  // ffn_norm1, its output
  if (modulation) bytes += L.linear_input(ns, D, 2);                                // FFN input = norm * scale
  bytes += 3 * L.act(ns * m) + L.linear_input(ns, m);  // w1 out, silu(w1 out), w3 out; their product (w2's input)
  bytes += L.act(x) + L.rms_norm(x, ns) + (modulation ? L.act(x) : 0);  // w2 out, ffn_norm2 (gate)
  bytes += L.lora(ns) * 7;                                              // to_q/k/v/out, w1, w2, w3
  return bytes;
}

int64_t sd3_joint(const BlockLedger& L, int64_t n, int64_t t, int64_t m, bool pre_only) {
  const int64_t B = L.B, D = L.D, H = L.H, ni = B * n, nt = B * t, ns = ni + nt;
  int64_t bytes = 2 * L.linear_input(B, D) + 2 * L.lora(B) + L.act(B * 6 * D);  // silu(temb) x2, emb
  if (!pre_only) bytes += L.act(B * 6 * D);                                     // cemb (kept by the text gates)
  bytes += L.layer_norm_stats(ns) + L.act(ns * D) + 2 * L.act(B * D);           // LN, 1 + scale
  bytes += L.linear_input(ni, D, 3) + L.linear_input(nt, D, 3);                 // modulated: q, k, v's input
  bytes += 2 * L.act(ns * D);                                                   // to_q, to_k, add_q_proj, add_k_proj
  bytes += 2 * (L.rms_norm(ni * D, B * H * n) + L.rms_norm(nt * D, B * H * t));
  bytes += 3 * L.act(ns * D);  // joint q, k, v
  bytes += L.attention(ns);
  const int64_t out_rows = pre_only ? ni : ns;  // the text stream's attention output is unused when pre-only
  // The merged attention output (see double_stream): at batch 1 the image slice is a view that keeps the
  // whole merged copy; beyond, a copy of the slice alone.
  bytes += L.copies() ? L.lora_copies(ni, D) + (pre_only ? 0 : L.lora_copies(nt, D))
                      : L.act((pre_only && B > 1 ? ni : ns) * D);
  bytes += L.act(out_rows * D);  // to_out / to_add_out outputs
  bytes += L.lora(ni) * 4 + L.lora(nt) * (pre_only ? 3 : 4);
  // MLP sub-block, per stream still running
  const auto per_stream = [&](int64_t in) {  // the image stream's, and the text stream's unless pre-only
    return L.linear_input(ni, in) + (pre_only ? 0 : L.linear_input(nt, in));
  };
  // LN input, LN output, fc2 output (gate); LN statistics, 1 + scale; the modulated input (fc1's)
  bytes += 3 * L.act(out_rows * D) + L.layer_norm_stats(out_rows) + (pre_only ? 1 : 2) * L.act(B * D) + per_stream(D);
  bytes += L.act(out_rows * m) + per_stream(m);  // GELU input, output (fc2's input)
  bytes += (L.lora(ni) + (pre_only ? 0 : L.lora(nt))) * 2;
  return bytes;
}

int64_t dit_block(const BlockLedger& L, int64_t n, int64_t m) {
  const int64_t B = L.B, D = L.D, ni = B * n;
  int64_t bytes = L.linear_input(B, D) + L.lora(B) + L.act(B * 6 * D);                     // silu(c), emb
  bytes += L.layer_norm_stats(ni) + L.act(ni * D) + L.act(B * D) + L.linear_input(ni, D);  // LN, 1 + scale, modulated
  bytes += L.act(3 * ni * D);                       // qkv output: q, k, v are views of it
  bytes += L.attention(ni) + L.lora_copies(ni, D);  // (its transposed output is proj's input)
  bytes += L.act(ni * D);                           // proj output (gate)
  bytes += L.act(ni * D);                           // h after attention
  bytes += L.layer_norm_stats(ni) + L.act(ni * D) + L.act(B * D) + L.linear_input(ni, D);
  bytes += L.act(ni * m) + L.linear_input(ni, m) + L.act(ni * D);  // fc1 out, GELU out (fc2's input), fc2 out
  bytes += L.lora(ni) * 4;                                         // qkv, proj, fc1, fc2
  return bytes;
}

}  // namespace gclab::model
