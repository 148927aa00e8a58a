#include "model/families/bfl/blocks.h"

#include "gclab/nn/activation.h"
#include "gclab/nn/meta_kernels.h"

namespace gclab::model::bfl {
namespace {

constexpr double kEps = 1e-6;

// A fused [q | k | v] projection's output [B, L, 3D] as three [B, H, L, Dh] views (rearrange
// "B L (K H D) -> K B H L D").
std::array<torch::Tensor, 3> split_qkv(const torch::Tensor& qkv, int64_t heads) {
  const torch::Tensor t = qkv.unflatten(-1, {3, heads, qkv.size(-1) / (3 * heads)}).permute({2, 0, 3, 1, 4});
  return {t[0], t[1], t[2]};
}

// math.py attention: rotary embedding on q and k, SDPA (with the boolean mask where there is one), heads
// merged ("B H L D -> B L (H D)").
torch::Tensor rope_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& table, const torch::Tensor& mask) {
  return merge_heads(nn::attention(bfl::apply_rope(q, table), bfl::apply_rope(k, table), v, mask));
}

// SiLUActivation (flux2/src/model.py): silu(first half) * second half.
torch::Tensor mlp_activation(const torch::Tensor& x, bool swiglu) {
  if (!swiglu) return nn::activate(nn::Activation::gelu_tanh, x);
  const auto halves = x.chunk(2, -1);
  return torch::silu(halves[0]) * halves[1];
}

torch::Tensor optional(const Tensors& in, size_t i) { return i < in.size() ? in[i] : torch::Tensor(); }

}  // namespace

torch::Tensor timestep_embedding(const torch::Tensor& t, int64_t dim, bool frequencies_on_cpu) {
  const torch::Tensor scaled = 1000 * t;
  const int64_t half = dim / 2;
  const auto f = torch::TensorOptions().dtype(torch::kFloat);
  const torch::Tensor freqs =
      torch::exp(-std::log(10000.0) * torch::arange(half, f.device(frequencies_on_cpu ? torch::kCPU : t.device())) /
                 static_cast<double>(half))
          .to(t.device());
  const torch::Tensor args = scaled.unsqueeze(1).to(torch::kFloat) * freqs.unsqueeze(0);
  const torch::Tensor emb = torch::cat({torch::cos(args), torch::sin(args)}, -1);
  return torch::isFloatingType(t.scalar_type()) ? emb.to(t.scalar_type()) : emb;
}

torch::Tensor rope_table(const torch::Tensor& ids, const std::vector<int64_t>& axes, double theta) {
  const bool f64 = torch::isFloatingType(ids.scalar_type());
  const auto o = torch::TensorOptions().dtype(f64 ? torch::kDouble : torch::kFloat).device(ids.device());
  std::vector<torch::Tensor> per_axis;
  for (size_t i = 0; i < axes.size(); ++i) {
    const int64_t d = axes[i];
    const torch::Tensor omega = 1.0 / torch::pow(theta, torch::arange(0, d, 2, o) / static_cast<double>(d));
    const torch::Tensor angle = ids.select(-1, static_cast<int64_t>(i)).to(o.dtype()).unsqueeze(-1) * omega;
    const torch::Tensor c = angle.cos(), s = angle.sin();
    per_axis.push_back(torch::stack({c, -s, s, c}, -1).unflatten(-1, {2, 2}));  // [B, L, d/2, 2, 2]
  }
  return torch::cat(per_axis, -3).unsqueeze(1).to(torch::kFloat);
}

torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& table) {
  auto sizes = x.sizes().vec();
  sizes.back() /= 2;
  sizes.push_back(1);
  sizes.push_back(2);
  const torch::Tensor pairs = x.to(torch::kFloat).reshape(sizes);  // [..., D/2, 1, 2]
  const torch::Tensor out = table.select(-1, 0) * pairs.select(-1, 0) + table.select(-1, 1) * pairs.select(-1, 1);
  return out.reshape(x.sizes()).to(x.scalar_type());
}

ScaleNorm::ScaleNorm(torch::nn::Module& owner, const std::string& path, int64_t dim, bool functional_rms_norm,
                     const torch::TensorOptions& o)
    : scale(holder_at(owner, path).register_parameter("scale", torch::ones({dim}, o))),
      functional(functional_rms_norm) {}

torch::Tensor ScaleNorm::operator()(const torch::Tensor& x) const {
  if (functional) return torch::rms_norm(x, {x.size(-1)}, scale, kEps);
  const torch::Tensor f = x.to(torch::kFloat);
  const torch::Tensor rrms = torch::rsqrt(f.pow(2).mean(-1, /*keepdim=*/true) + kEps);
  return (f * rrms).to(x.scalar_type()) * scale;
}

Stream::Stream(torch::nn::Module& owner, const std::string& name, int64_t dim, int64_t heads, int64_t mlp_hidden,
               const BlockOptions& b, const torch::TensorOptions& o)
    : qkv(register_at(owner, name + "_attn.qkv", Linear(LinearOptions(dim, 3 * dim).bias(b.bias).tensor_options(o)))),
      proj(register_at(owner, name + "_attn.proj", Linear(LinearOptions(dim, dim).bias(b.bias).tensor_options(o)))),
      mlp_in(register_at(owner, name + "_mlp.0",
                         Linear(LinearOptions(dim, (b.swiglu ? 2 : 1) * mlp_hidden).bias(b.bias).tensor_options(o)))),
      mlp_out(
          register_at(owner, name + "_mlp.2", Linear(LinearOptions(mlp_hidden, dim).bias(b.bias).tensor_options(o)))),
      q_norm(owner, name + "_attn.norm.query_norm", dim / heads, b.functional_rms_norm, o),
      k_norm(owner, name + "_attn.norm.key_norm", dim / heads, b.functional_rms_norm, o),
      swiglu(b.swiglu) {}

std::array<torch::Tensor, 3> Stream::qkv_heads(const torch::Tensor& x, int64_t heads) {
  auto [q, k, v] = split_qkv(qkv(x), heads);
  return {q_norm(q), k_norm(k), v};
}

torch::Tensor Stream::mlp(const torch::Tensor& x) { return mlp_out(mlp_activation(mlp_in(x), swiglu)); }

DoubleBlock::DoubleBlock(int64_t dim, int64_t heads, int64_t mlp_hidden, const BlockOptions& b,
                         const torch::TensorOptions& o)
    : heads_(heads),
      joins_rope_(b.joins_rope_tables),
      img_(*this, "img", dim, heads, mlp_hidden, b, o),
      txt_(*this, "txt", dim, heads, mlp_hidden, b, o) {}

Tensors DoubleBlock::forward_block(const Tensors& in, const SubBlockRunner& run) {
  const Tensors attn_in(in.begin(), in.end());
  const auto mod = [](const torch::Tensor& m, int64_t i) { return m.narrow(1, i, 1); };
  const Tensors after_attn = run(
      SubBlock::attn,
      [this, mod](const Tensors& t) {
        const torch::Tensor &img = t[0], &txt = t[1], &mi = t[2], &mt = t[3];
        const auto [iq, ik, iv] = img_.qkv_heads(shift_scale(layer_norm(img), mod(mi, 0), mod(mi, 1)), heads_);
        const auto [tq, tk, tv] = txt_.qkv_heads(shift_scale(layer_norm(txt), mod(mt, 0), mod(mt, 1)), heads_);
        const torch::Tensor pe = joins_rope_ ? torch::cat({t[5], t[4]}, 2) : t[4];
        const torch::Tensor out = rope_attention(torch::cat({tq, iq}, 2), torch::cat({tk, ik}, 2),
                                                 torch::cat({tv, iv}, 2), pe, optional(t, joins_rope_ ? 6 : 5));
        const int64_t n_txt = txt.size(1);
        return Tensors{img + mod(mi, 2) * img_.proj(out.narrow(1, n_txt, img.size(1))),
                       txt + mod(mt, 2) * txt_.proj(out.narrow(1, 0, n_txt))};
      },
      attn_in);
  return run(
      SubBlock::mlp,
      [this, mod](const Tensors& t) {
        const torch::Tensor &mi = t[2], &mt = t[3];
        const torch::Tensor img = t[0] + mod(mi, 5) * img_.mlp(shift_scale(layer_norm(t[0]), mod(mi, 3), mod(mi, 4)));
        const torch::Tensor txt = t[1] + mod(mt, 5) * txt_.mlp(shift_scale(layer_norm(t[1]), mod(mt, 3), mod(mt, 4)));
        return Tensors{img, txt};
      },
      {after_attn[0], after_attn[1], in.at(2), in.at(3)});
}

SingleBlock::SingleBlock(int64_t dim, int64_t heads, int64_t mlp_hidden, const BlockOptions& b,
                         const torch::TensorOptions& o)
    : dim_(dim), heads_(heads), mlp_in_((b.swiglu ? 2 : 1) * mlp_hidden), swiglu_(b.swiglu) {
  linear1 = register_module("linear1", Linear(LinearOptions(dim, 3 * dim + mlp_in_).bias(b.bias).tensor_options(o)));
  linear2 = register_module("linear2", Linear(LinearOptions(dim + mlp_hidden, dim).bias(b.bias).tensor_options(o)));
  q_norm = ScaleNorm(*this, "norm.query_norm", dim / heads, b.functional_rms_norm, o);
  k_norm = ScaleNorm(*this, "norm.key_norm", dim / heads, b.functional_rms_norm, o);
}

Tensors SingleBlock::forward_block(const Tensors& in, const SubBlockRunner& run) {
  const torch::Tensor& x = in.at(0);
  const torch::Tensor& m = in.at(1);
  const torch::Tensor h = linear1(shift_scale(layer_norm(x), m.narrow(1, 0, 1), m.narrow(1, 1, 1)));
  Tensors attn_in = {h.narrow(-1, 0, 3 * dim_), in.at(2)};
  if (in.size() > 3) attn_in.push_back(in[3]);
  const torch::Tensor attn_out = run(
      SubBlock::attn,
      [this](const Tensors& t) {
        auto [q, k, v] = split_qkv(t[0], heads_);
        return Tensors{rope_attention(q_norm(q), k_norm(k), v, t[1], optional(t, 2))};
      },
      attn_in)[0];
  const torch::Tensor mlp_out =
      run(SubBlock::mlp, [this](const Tensors& t) { return Tensors{mlp_activation(t[0], swiglu_)}; },
          {h.narrow(-1, 3 * dim_, mlp_in_)})[0];
  return {x + m.narrow(1, 2, 1) * linear2(torch::cat({attn_out, mlp_out}, 2))};
}

}  // namespace gclab::model::bfl
