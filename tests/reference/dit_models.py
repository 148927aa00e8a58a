"""A Python reference of gclab's five transformer families, written from the reference implementations
(diffusers transformer_flux.py, transformer_qwenimage.py, transformer_z_image.py, transformer_sd3.py,
facebookresearch/DiT models.py) in plain PyTorch, with the same parameter names. gclab's C++ models
must agree with it from identical weights and inputs (tests/model/parity_test.cpp).

  dit_models.py forward WEIGHTS INPUTS OUT [--grads]
      WEIGHTS: safetensors written by gclab (the spec in its metadata), INPUTS: latents, timestep, text,
      pooled, guidance, class_labels. Writes OUT with `prediction` and, with --grads, the gradient of
      mean(prediction^2) for every parameter as `grad.<name>`.
"""
import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from toy_stack import read_safetensors, write_safetensors  # noqa: E402


# ---- layers -------------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        dtype = x.dtype
        variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            x = x.to(self.weight.dtype)
        return x * self.weight if self.weight is not None else x.to(dtype)


def layer_norm(x, eps=1e-6):
    return F.layer_norm(x, (x.shape[-1],), eps=eps)


def modulate(x, shift, scale):
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


def timestep_embedding(t, dim, max_period=10000.0):
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], -1)


def rope_cos_sin(ids, axes_dims, theta):
    cos, sin = [], []
    for i, d in enumerate(axes_dims):
        freqs = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        angles = ids[:, i].double()[:, None] * freqs
        cos.append(torch.cos(angles).repeat_interleave(2, 1))
        sin.append(torch.sin(angles).repeat_interleave(2, 1))
    return torch.cat(cos, 1).float(), torch.cat(sin, 1).float()


def apply_rope(x, cos, sin):
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    real, imag = pairs.unbind(-1)
    rotated = torch.stack([-imag, real], -1).flatten(-2)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


def split_heads(x, heads):
    return x.unflatten(-1, (heads, -1)).transpose(1, 2)


def merge_heads(x):
    return x.transpose(1, 2).flatten(2)


def sincos_2d(h, w, dim, scale=1.0, h_off=0, w_off=0):
    def one_axis(pos):
        quarter = dim // 4
        omega = 1.0 / (10000.0 ** (torch.arange(quarter, dtype=torch.float64) / quarter))
        out = pos[:, None] * omega[None]
        return torch.cat([torch.sin(out), torch.cos(out)], 1)
    ys = (torch.arange(h, dtype=torch.float64) + h_off) / scale
    xs = (torch.arange(w, dtype=torch.float64) + w_off) / scale
    gy = ys[:, None].expand(h, w).reshape(-1)
    gx = xs[None, :].expand(h, w).reshape(-1)
    return torch.cat([one_axis(gx), one_axis(gy)], 1).float()


def patchify(latents, p, channels_last):
    b, c, h, w = latents.shape
    t = latents.reshape(b, c, h // p, p, w // p, p)
    t = t.permute(0, 2, 4, 3, 5, 1) if channels_last else t.permute(0, 2, 4, 1, 3, 5)
    return t.reshape(b, (h // p) * (w // p), c * p * p)


def unpatchify(tokens, h, w, p, c, channels_last):
    b = tokens.shape[0]
    if channels_last:
        return tokens.reshape(b, h // p, w // p, p, p, c).permute(0, 5, 1, 3, 2, 4).reshape(b, c, h, w)
    return tokens.reshape(b, h // p, w // p, c, p, p).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)


def holder(**children):
    m = nn.Module()
    for k, v in children.items():
        m.add_module(k, v)
    return m


def indexed(**children):  # names "0", "1", ... as nn.Sequential has them
    m = nn.Module()
    for k, v in children.items():
        m.add_module(k.lstrip("_"), v)
    return m


class FeedForward(nn.Module):  # diffusers FeedForward(activation_fn="gelu-approximate")
    def __init__(self, dim, inner):
        super().__init__()
        self.net = indexed(_0=holder(proj=nn.Linear(dim, inner)), _2=nn.Linear(inner, dim))

    def forward(self, x):
        return getattr(self.net, "2")(F.gelu(getattr(self.net, "0").proj(x), approximate="tanh"))


class JointAttention(nn.Module):
    def __init__(self, dim, heads, context_out, eps=1e-6):
        super().__init__()
        self.heads = heads
        hd = dim // heads
        self.to_q, self.to_k, self.to_v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.norm_q, self.norm_k = RMSNorm(hd, eps), RMSNorm(hd, eps)
        self.add_q_proj, self.add_k_proj, self.add_v_proj = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.norm_added_q, self.norm_added_k = RMSNorm(hd, eps), RMSNorm(hd, eps)
        self.to_out = indexed(_0=nn.Linear(dim, dim))
        self.to_add_out = nn.Linear(dim, dim) if context_out else None

    def forward(self, img, txt, cos, sin, text_first):
        h = self.heads
        q, k = self.norm_q(split_heads(self.to_q(img), h)), self.norm_k(split_heads(self.to_k(img), h))
        v = split_heads(self.to_v(img), h)
        tq = self.norm_added_q(split_heads(self.add_q_proj(txt), h))
        tk = self.norm_added_k(split_heads(self.add_k_proj(txt), h))
        tv = split_heads(self.add_v_proj(txt), h)
        joint = (lambda i, t: torch.cat([t, i], 2)) if text_first else (lambda i, t: torch.cat([i, t], 2))
        jq, jk = joint(q, tq), joint(k, tk)
        if cos is not None:
            jq, jk = apply_rope(jq, cos, sin), apply_rope(jk, cos, sin)
        out = merge_heads(F.scaled_dot_product_attention(jq, jk, joint(v, tv))).to(img.dtype)
        nt, ni = txt.shape[1], img.shape[1]
        txt_out, img_out = (out[:, :nt], out[:, nt:]) if text_first else (out[:, ni:], out[:, :ni])
        return getattr(self.to_out, "0")(img_out), (self.to_add_out(txt_out) if self.to_add_out is not None else None)


class SelfAttention(nn.Module):
    def __init__(self, dim, heads, bias, out_proj, eps):
        super().__init__()
        self.heads = heads
        self.to_q, self.to_k, self.to_v = (nn.Linear(dim, dim, bias=bias) for _ in range(3))
        self.norm_q, self.norm_k = RMSNorm(dim // heads, eps), RMSNorm(dim // heads, eps)
        self.to_out = indexed(_0=nn.Linear(dim, dim, bias=bias)) if out_proj else None

    def forward(self, x, cos, sin):
        q, k = self.norm_q(split_heads(self.to_q(x), self.heads)), self.norm_k(split_heads(self.to_k(x), self.heads))
        v = split_heads(self.to_v(x), self.heads)
        if cos is not None:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = merge_heads(F.scaled_dot_product_attention(q, k, v)).to(x.dtype)
        return getattr(self.to_out, "0")(out) if self.to_out is not None else out


# ---- blocks -------------------------------------------------------------------------------------

class DoubleStreamBlock(nn.Module):
    """FLUX's and Qwen-Image's double-stream block: the same computation, named differently (subclasses
    register the modulation Linears and the MLPs and say where they are)."""

    def modules_in_use(self):  # (img_mod, txt_mod, img_mlp, txt_mlp)
        raise NotImplementedError

    def forward(self, img, txt, temb, cos, sin):
        img_mod, txt_mod, img_mlp, txt_mlp = self.modules_in_use()
        m = img_mod(F.silu(temb)).chunk(6, 1)
        c = txt_mod(F.silu(temb)).chunk(6, 1)
        ia, ta = self.attn(modulate(layer_norm(img), m[0], m[1]), modulate(layer_norm(txt), c[0], c[1]), cos, sin, True)
        img, txt = img + m[2].unsqueeze(1) * ia, txt + c[2].unsqueeze(1) * ta
        img = img + m[5].unsqueeze(1) * img_mlp(modulate(layer_norm(img), m[3], m[4]))
        txt = txt + c[5].unsqueeze(1) * txt_mlp(modulate(layer_norm(txt), c[3], c[4]))
        return img, txt


class FluxDoubleBlock(DoubleStreamBlock):
    def __init__(self, d, heads, mlp):
        super().__init__()
        self.norm1 = holder(linear=nn.Linear(d, 6 * d))
        self.norm1_context = holder(linear=nn.Linear(d, 6 * d))
        self.attn = JointAttention(d, heads, True)
        self.ff, self.ff_context = FeedForward(d, mlp), FeedForward(d, mlp)

    def modules_in_use(self):
        return self.norm1.linear, self.norm1_context.linear, self.ff, self.ff_context


class FluxSingleBlock(nn.Module):
    def __init__(self, d, heads, mlp):
        super().__init__()
        self.norm = holder(linear=nn.Linear(d, 3 * d))
        self.proj_mlp = nn.Linear(d, mlp)
        self.proj_out = nn.Linear(d + mlp, d)
        self.attn = SelfAttention(d, heads, True, False, 1e-6)

    def forward(self, x, temb, cos, sin):
        m = self.norm.linear(F.silu(temb)).chunk(3, 1)
        nx = modulate(layer_norm(x), m[0], m[1])
        h = torch.cat([self.attn(nx, cos, sin), F.gelu(self.proj_mlp(nx), approximate="tanh")], 2)
        return x + m[2].unsqueeze(1) * self.proj_out(h)


class QwenImageBlock(DoubleStreamBlock):
    def __init__(self, d, heads, mlp):
        super().__init__()
        self.img_mod = indexed(_1=nn.Linear(d, 6 * d))
        self.txt_mod = indexed(_1=nn.Linear(d, 6 * d))
        self.attn = JointAttention(d, heads, True)
        self.img_mlp, self.txt_mlp = FeedForward(d, mlp), FeedForward(d, mlp)

    def modules_in_use(self):
        return getattr(self.img_mod, "1"), getattr(self.txt_mod, "1"), self.img_mlp, self.txt_mlp


class ZImageBlock(nn.Module):
    def __init__(self, d, heads, mlp, adaln, modulation):
        super().__init__()
        eps = 1e-5
        self.modulation = modulation
        self.attention = SelfAttention(d, heads, False, True, eps)
        self.feed_forward = holder(w1=nn.Linear(d, mlp, bias=False), w2=nn.Linear(mlp, d, bias=False),
                                   w3=nn.Linear(d, mlp, bias=False))
        self.attention_norm1, self.ffn_norm1 = RMSNorm(d, eps), RMSNorm(d, eps)
        self.attention_norm2, self.ffn_norm2 = RMSNorm(d, eps), RMSNorm(d, eps)
        if modulation:
            self.adaLN_modulation = indexed(_0=nn.Linear(adaln, 4 * d))

    def forward(self, x, adaln, cos, sin):
        ff = self.feed_forward
        if self.modulation:
            scale_msa, gate_msa, scale_mlp, gate_mlp = getattr(self.adaLN_modulation, "0")(adaln).unsqueeze(1).chunk(4, 2)
            gate_msa, gate_mlp = gate_msa.tanh(), gate_mlp.tanh()
            scale_msa, scale_mlp = 1.0 + scale_msa, 1.0 + scale_mlp
            attn_out = self.attention(self.attention_norm1(x) * scale_msa, cos, sin)
            x = x + gate_msa * self.attention_norm2(attn_out)
            h = self.ffn_norm1(x) * scale_mlp
            return x + gate_mlp * self.ffn_norm2(ff.w2(F.silu(ff.w1(h)) * ff.w3(h)))
        attn_out = self.attention(self.attention_norm1(x), cos, sin)
        x = x + self.attention_norm2(attn_out)
        h = self.ffn_norm1(x)
        return x + self.ffn_norm2(ff.w2(F.silu(ff.w1(h)) * ff.w3(h)))


class SD3JointBlock(nn.Module):
    def __init__(self, d, heads, mlp, context_pre_only):
        super().__init__()
        self.pre_only = context_pre_only
        self.norm1 = holder(linear=nn.Linear(d, 6 * d))
        self.norm1_context = holder(linear=nn.Linear(d, (2 if context_pre_only else 6) * d))
        self.attn = JointAttention(d, heads, not context_pre_only)
        self.ff = FeedForward(d, mlp)
        if not context_pre_only:
            self.ff_context = FeedForward(d, mlp)

    def forward(self, img, txt, temb):
        m = self.norm1.linear(F.silu(temb)).chunk(6, 1)
        cemb = self.norm1_context.linear(F.silu(temb))
        if self.pre_only:
            scale, shift = cemb.chunk(2, 1)
            norm_txt = modulate(layer_norm(txt), shift, scale)
        else:
            c = cemb.chunk(6, 1)
            norm_txt = modulate(layer_norm(txt), c[0], c[1])
        attn_out, ctx_out = self.attn(modulate(layer_norm(img), m[0], m[1]), norm_txt, None, None, False)
        img = img + m[2].unsqueeze(1) * attn_out
        img = img + m[5].unsqueeze(1) * self.ff(modulate(layer_norm(img), m[3], m[4]))
        if self.pre_only:
            return img, txt
        txt = txt + c[2].unsqueeze(1) * ctx_out
        txt = txt + c[5].unsqueeze(1) * self.ff_context(modulate(layer_norm(txt), c[3], c[4]))
        return img, txt


class DiTBlock(nn.Module):
    def __init__(self, d, heads, mlp):
        super().__init__()
        self.heads = heads
        self.attn = holder(qkv=nn.Linear(d, 3 * d), proj=nn.Linear(d, d))
        self.mlp = holder(fc1=nn.Linear(d, mlp), fc2=nn.Linear(mlp, d))
        self.adaLN_modulation = indexed(_1=nn.Linear(d, 6 * d))

    def forward(self, x, c):
        m = getattr(self.adaLN_modulation, "1")(F.silu(c)).chunk(6, 1)
        a = modulate(layer_norm(x), m[0], m[1])
        b, n, d = a.shape
        qkv = self.attn.qkv(a).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2]).transpose(1, 2).reshape(b, n, d)
        x = x + m[2].unsqueeze(1) * self.attn.proj(o)
        return x + m[5].unsqueeze(1) * self.mlp.fc2(F.gelu(self.mlp.fc1(modulate(layer_norm(x), m[3], m[4])),
                                                            approximate="tanh"))


# ---- transformers -------------------------------------------------------------------------------

def two_layer(n1, n2, i, mid, o):
    return {n1: nn.Linear(i, mid), n2: nn.Linear(mid, o)}


def norm_out(linear, x, c):
    scale, shift = linear(F.silu(c)).chunk(2, 1)
    return modulate(layer_norm(x), shift, scale)


def ids_tensor(rows):
    return torch.tensor(rows, dtype=torch.long).reshape(-1, 3)


def image_ids(frame, h, w, row0=0, col0=0):
    return [[frame, row0 + r, col0 + c] for r in range(h) for c in range(w)]


class Flux(nn.Module):
    def __init__(self, s):
        super().__init__()
        d, p = s["hidden"], s["patch"]
        self.s = s
        self.x_embedder = nn.Linear(s["latent_channels"] * p * p, d)
        embeds = {"timestep_embedder": holder(linear_1=nn.Linear(256, d), linear_2=nn.Linear(d, d)),
                  "text_embedder": holder(linear_1=nn.Linear(s["pooled_dim"], d), linear_2=nn.Linear(d, d))}
        if s["guidance_embed"]:
            embeds["guidance_embedder"] = holder(linear_1=nn.Linear(256, d), linear_2=nn.Linear(d, d))
        self.time_text_embed = holder(**embeds)
        self.context_embedder = nn.Linear(s["text_dim"], d)
        self.transformer_blocks = nn.ModuleList(FluxDoubleBlock(d, s["heads"], s["mlp_hidden"])
                                                for _ in range(s["double_blocks"]))
        self.single_transformer_blocks = nn.ModuleList(FluxSingleBlock(d, s["heads"], s["mlp_hidden"])
                                                       for _ in range(s["single_blocks"]))
        self.norm_out = holder(linear=nn.Linear(d, 2 * d))
        self.proj_out = nn.Linear(d, p * p * s["out_channels"])

    def forward(self, inp):
        s, p = self.s, self.s["patch"]
        lat = inp["latents"]
        h, w = lat.shape[2], lat.shape[3]
        img = self.x_embedder(patchify(lat, p, False))
        txt = self.context_embedder(inp["text"])
        mlp = lambda m, x: m.linear_2(F.silu(m.linear_1(x)))  # noqa: E731
        tte = self.time_text_embed
        temb = mlp(tte.timestep_embedder, timestep_embedding(inp["timestep"] * 1000, 256))
        if s["guidance_embed"]:
            temb = temb + mlp(tte.guidance_embedder, timestep_embedding(inp["guidance"] * 1000, 256))
        temb = temb + mlp(tte.text_embedder, inp["pooled"])
        ids = [[0, 0, 0]] * txt.shape[1] + image_ids(0, h // p, w // p)
        cos, sin = rope_cos_sin(ids_tensor(ids), s["rope_axes"], s["rope_theta"])
        for b in self.transformer_blocks:
            img, txt = b(img, txt, temb, cos, sin)
        x = torch.cat([txt, img], 1)
        for b in self.single_transformer_blocks:
            x = b(x, temb, cos, sin)
        img = x[:, txt.shape[1]:]
        return unpatchify(self.proj_out(norm_out(self.norm_out.linear, img, temb)), h, w, p, s["out_channels"], False)


class QwenImage(nn.Module):
    def __init__(self, s):
        super().__init__()
        d, p = s["hidden"], s["patch"]
        self.s = s
        self.img_in = nn.Linear(s["latent_channels"] * p * p, d)
        self.txt_norm = RMSNorm(s["text_dim"], 1e-6)
        self.txt_in = nn.Linear(s["text_dim"], d)
        self.time_text_embed = holder(timestep_embedder=holder(linear_1=nn.Linear(256, d), linear_2=nn.Linear(d, d)))
        self.transformer_blocks = nn.ModuleList(QwenImageBlock(d, s["heads"], s["mlp_hidden"])
                                                for _ in range(s["double_blocks"]))
        self.norm_out = holder(linear=nn.Linear(d, 2 * d))
        self.proj_out = nn.Linear(d, p * p * s["out_channels"])

    def forward(self, inp):
        s, p = self.s, self.s["patch"]
        lat = inp["latents"]
        h, w = lat.shape[2], lat.shape[3]
        parts, shapes = [patchify(lat, p, False)], [(0, h // p, w // p)]
        for r, ref in enumerate(inp.get("reference_latents", [])):
            parts.append(patchify(ref, p, False))
            shapes.append((r + 1, ref.shape[2] // p, ref.shape[3] // p))
        img = self.img_in(torch.cat(parts, 1))
        txt = self.txt_in(self.txt_norm(inp["text"]))
        te = self.time_text_embed.timestep_embedder
        temb = te.linear_2(F.silu(te.linear_1(timestep_embedding(inp["timestep"] * 1000, 256))))
        start = max(max(gh // 2, gw // 2) for _, gh, gw in shapes)
        ids = [[start + j] * 3 for j in range(txt.shape[1])]
        for frame, gh, gw in shapes:
            ids += image_ids(frame, gh, gw, -(gh - gh // 2), -(gw - gw // 2))
        cos, sin = rope_cos_sin(ids_tensor(ids), s["rope_axes"], s["rope_theta"])
        for b in self.transformer_blocks:
            img, txt = b(img, txt, temb, cos, sin)
        img = img[:, :(h // p) * (w // p)]
        return unpatchify(self.proj_out(norm_out(self.norm_out.linear, img, temb)), h, w, p, s["out_channels"], False)


class ZImage(nn.Module):
    def __init__(self, s):
        super().__init__()
        d, p = s["hidden"], s["patch"]
        pd = s["latent_channels"] * p * p
        self.s = s
        self.all_x_embedder = nn.ModuleDict({"2-1": nn.Linear(pd, d)})
        self.all_final_layer = nn.ModuleDict({"2-1": holder(linear=nn.Linear(d, pd),
                                                            adaLN_modulation=indexed(_1=nn.Linear(s["adaln_dim"], d)))})
        self.t_embedder = holder(mlp=indexed(_0=nn.Linear(256, s["t_embed_mid"]), _2=nn.Linear(s["t_embed_mid"], s["adaln_dim"])))
        self.cap_embedder = indexed(_0=RMSNorm(s["text_dim"], 1e-5), _1=nn.Linear(s["text_dim"], d))
        self.x_pad_token = nn.Parameter(torch.zeros(1, d))
        self.cap_pad_token = nn.Parameter(torch.zeros(1, d))
        args = (d, s["heads"], s["mlp_hidden"], s["adaln_dim"])
        self.noise_refiner = nn.ModuleList(ZImageBlock(*args, True) for _ in range(s["refiner_blocks"]))
        self.context_refiner = nn.ModuleList(ZImageBlock(*args, False) for _ in range(s["refiner_blocks"]))
        self.layers = nn.ModuleList(ZImageBlock(*args, True) for _ in range(s["single_blocks"]))

    def forward(self, inp):
        s, p = self.s, self.s["patch"]
        lat = inp["latents"]
        h, w = lat.shape[2], lat.shape[3]
        gh, gw = h // p, w // p
        n_img = gh * gw
        n_pad = (n_img + 31) // 32 * 32
        n_cap = inp["text"].shape[1]
        n_cap_pad = (n_cap + 31) // 32 * 32
        x = self.all_x_embedder["2-1"](patchify(lat, p, True))
        if n_pad > n_img:
            x = torch.cat([x, self.x_pad_token.unsqueeze(0).expand(x.shape[0], n_pad - n_img, -1)], 1)
        cap = getattr(self.cap_embedder, "1")(getattr(self.cap_embedder, "0")(inp["text"]))
        if n_cap_pad > n_cap:  # the caption, too, is padded to a multiple of 32 with a learned token
            cap = torch.cat([cap, self.cap_pad_token.unsqueeze(0).expand(cap.shape[0], n_cap_pad - n_cap, -1)], 1)
        mlp = self.t_embedder.mlp
        # Z-Image's time runs the other way (1 - sigma), and it predicts x0 - noise: negated at the end.
        adaln = getattr(mlp, "2")(F.silu(getattr(mlp, "0")(timestep_embedding((1 - inp["timestep"]) * 1000, 256))))
        img_ids = image_ids(n_cap_pad + 1, gh, gw) + [[0, 0, 0]] * (n_pad - n_img)
        cap_ids = [[1 + j, 0, 0] for j in range(n_cap_pad)]
        icos, isin = rope_cos_sin(ids_tensor(img_ids), s["rope_axes"], s["rope_theta"])
        ccos, csin = rope_cos_sin(ids_tensor(cap_ids), s["rope_axes"], s["rope_theta"])
        for b in self.noise_refiner:
            x = b(x, adaln, icos, isin)
        for b in self.context_refiner:
            cap = b(cap, None, ccos, csin)
        u = torch.cat([x, cap], 1)
        cos, sin = torch.cat([icos, ccos], 0), torch.cat([isin, csin], 0)
        for b in self.layers:
            u = b(u, adaln, cos, sin)
        fl = self.all_final_layer["2-1"]
        scale = 1.0 + getattr(fl.adaLN_modulation, "1")(F.silu(adaln))
        out = -fl.linear(layer_norm(u[:, :n_img]) * scale.unsqueeze(1))
        return unpatchify(out, h, w, p, s["out_channels"], True)


class SD3(nn.Module):
    def __init__(self, s):
        super().__init__()
        d, p = s["hidden"], s["patch"]
        self.s = s
        self.pos_embed = holder(proj=nn.Conv2d(s["latent_channels"], d, p, p))
        self.time_text_embed = holder(timestep_embedder=holder(linear_1=nn.Linear(256, d), linear_2=nn.Linear(d, d)),
                                      text_embedder=holder(linear_1=nn.Linear(s["pooled_dim"], d), linear_2=nn.Linear(d, d)))
        self.context_embedder = nn.Linear(s["text_dim"], d)
        n = s["double_blocks"]
        self.transformer_blocks = nn.ModuleList(SD3JointBlock(d, s["heads"], s["mlp_hidden"], i == n - 1) for i in range(n))
        self.norm_out = holder(linear=nn.Linear(d, 2 * d))
        self.proj_out = nn.Linear(d, p * p * s["out_channels"])

    def forward(self, inp):
        s, p = self.s, self.s["patch"]
        lat = inp["latents"]
        h, w = lat.shape[2], lat.shape[3]
        gh, gw, mx = h // p, w // p, s["pos_embed_max"]
        pos = sincos_2d(gh, gw, s["hidden"], mx / s["sd3_base_size"], (mx - gh) // 2, (mx - gw) // 2)
        img = self.pos_embed.proj(lat).flatten(2).transpose(1, 2) + pos.unsqueeze(0)
        txt = self.context_embedder(inp["text"])
        mlp = lambda m, x: m.linear_2(F.silu(m.linear_1(x)))  # noqa: E731
        tte = self.time_text_embed
        temb = mlp(tte.timestep_embedder, timestep_embedding(inp["timestep"] * 1000, 256)) + \
            mlp(tte.text_embedder, inp["pooled"])
        for b in self.transformer_blocks:
            img, txt = b(img, txt, temb)
        return unpatchify(self.proj_out(norm_out(self.norm_out.linear, img, temb)), h, w, p, s["out_channels"], True)


class DiT(nn.Module):
    def __init__(self, s):
        super().__init__()
        d, p = s["hidden"], s["patch"]
        self.s = s
        self.x_embedder = holder(proj=nn.Conv2d(s["latent_channels"], d, p, p))
        self.t_embedder = holder(mlp=indexed(_0=nn.Linear(256, d), _2=nn.Linear(d, d)))
        self.y_embedder = nn.Module()
        self.y_embedder.embedding_table = nn.Parameter(torch.zeros(s["num_classes"] + 1, d))
        self.blocks = nn.ModuleList(DiTBlock(d, s["heads"], s["mlp_hidden"]) for _ in range(s["single_blocks"]))
        self.final_layer = holder(linear=nn.Linear(d, p * p * s["out_channels"]),
                                  adaLN_modulation=indexed(_1=nn.Linear(d, 2 * d)))

    def forward(self, inp):
        s, p = self.s, self.s["patch"]
        lat = inp["latents"]
        h, w = lat.shape[2], lat.shape[3]
        x = self.x_embedder.proj(lat).flatten(2).transpose(1, 2) + sincos_2d(h // p, w // p, s["hidden"]).unsqueeze(0)
        mlp = self.t_embedder.mlp
        t = getattr(mlp, "2")(F.silu(getattr(mlp, "0")(timestep_embedding(inp["timestep"] * 1000, 256))))
        c = t + self.y_embedder.embedding_table[inp["class_labels"]]
        for b in self.blocks:
            x = b(x, c)
        shift, scale = getattr(self.final_layer.adaLN_modulation, "1")(F.silu(c)).chunk(2, 1)
        return unpatchify(self.final_layer.linear(modulate(layer_norm(x), shift, scale)), h, w, p, s["out_channels"], True)


FAMILIES = {"flux": Flux, "qwen_image": QwenImage, "zimage": ZImage, "sd3": SD3, "dit": DiT}


def spec_from_metadata(meta):
    s = {}
    for k, v in meta.items():
        if k in ("preset", "family"):
            s[k] = v
        elif k == "rope_axes":
            s[k] = [int(a) for a in v.split(",")] if v else []
        elif k == "rope_theta":
            s[k] = float(v)
        elif k == "guidance_embed":
            s[k] = v == "1"
        else:
            s[k] = int(v)
    return s


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["forward"])
    ap.add_argument("weights")
    ap.add_argument("inputs")
    ap.add_argument("out")
    ap.add_argument("--grads", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    weights, meta = read_safetensors(a.weights)
    spec = spec_from_metadata(meta)
    model = FAMILIES[spec["family"]](spec)
    model.load_state_dict(weights, strict=True)
    inputs, _ = read_safetensors(a.inputs)
    inp = {k: v for k, v in inputs.items() if not k.startswith("reference_latents.")}
    refs = sorted(k for k in inputs if k.startswith("reference_latents."))
    inp["reference_latents"] = [inputs[k] for k in refs]
    pred = model(inp)
    out = {"prediction": pred.detach()}
    if a.grads:
        pred.pow(2).mean().backward()
        for name, p in model.named_parameters():
            out["grad." + name] = p.grad if p.grad is not None else torch.zeros_like(p)
    write_safetensors(a.out, out)


if __name__ == "__main__":
    main()
