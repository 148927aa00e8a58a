"""The 8-bit weight storages AI Toolkit's qtype selects besides uintN, written here with torch only from
each library's documented steps, for tests/quant/scaled_test.cpp:

  qfloat8  optimum-quanto: quantize_weight(w, qfloat8_e4m3fn, axis=0) -- AbsmaxOptimizer (amax of |w| over
           the row, / qmax, in w's dtype), SymmetricQuantizer (w / scale, clamped to the float8 range, cast);
           used as qbytes_mm: codes in the scale's dtype times the scale.
  float8   torchao 0.10 Float8WeightOnlyConfig: per-row block, choose_qparams_affine_float8 (amax / 448 in w's
           dtype, then float32), quantize_affine_float8 (float32(w) / scale, clamped, cast),
           dequantize_affine_float8 (float32(codes) * scale, to w's dtype).
  int8     torchao 0.10 Int8WeightOnlyConfig: choose_qparams_affine SYMMETRIC, block (1, in), eps = float32 eps,
           int64 zero point; quantize_affine (round(w * (1 / scale)) + zero point, clamped, int8);
           dequantize_affine; the weight-only int8 linear (x @ codes^T in x's dtype, times the scale).

  scaled_reference.py IN.safetensors OUT.safetensors

For each weight `w.NAME` (and input `x.NAME`) in IN it writes `{data,scale,zero_point,dequantized,y}.NAME.TYPE`.
Exit 77 without torch / safetensors.
"""
import sys

from reference_io import torch_and_safetensors

E4M3_MAX = 448.0


def qfloat8(w):
    scale = torch.amax(torch.abs(w), dim=[1], keepdim=True) / E4M3_MAX
    data = torch.clamp(w / scale, min=-E4M3_MAX, max=E4M3_MAX).to(torch.float8_e4m3fn)
    dq = scale * data.to(scale.dtype)
    return data, scale, None, dq


def float8(w):
    scale = (w.abs().amax(dim=1, keepdim=True) / E4M3_MAX).to(torch.float32)
    data = (w.to(torch.float32) / scale).clamp(min=-E4M3_MAX, max=E4M3_MAX).to(torch.float8_e4m3fn)
    dq = (data.to(torch.float32) * scale).to(w.dtype)
    return data, scale, None, dq


def int8(w):
    lo = torch.min(torch.amin(w, dim=1, keepdim=True), torch.zeros(1, dtype=w.dtype))
    hi = torch.max(torch.amax(w, dim=1, keepdim=True), torch.zeros(1, dtype=w.dtype))
    top = torch.max(-lo, hi)
    scale = torch.clamp(top / (float(127 - (-128)) / 2), min=torch.finfo(torch.float32).eps)
    zero = torch.full_like(scale, int((127 + (-128) + 1) / 2)).to(torch.int64)
    data = torch.clamp(torch.round(w * (1.0 / scale)) + zero, -128, 127).to(torch.int8)
    dq = (data.to(torch.int32) - zero.to(torch.int32)).to(w.dtype) * scale
    return data, scale, zero, dq


def linear(x, kind, data, scale, dq):
    if kind == "int8":
        m = torch.mm(x.reshape(-1, x.shape[-1]), data.t().to(x.dtype))
        return (m * scale.view(1, -1).to(m.dtype)).reshape(*x.shape[:-1], data.shape[0])
    if kind == "qfloat8":
        return torch.matmul(x.to(scale.dtype), dq.t())
    return torch.matmul(x, dq.to(x.dtype).t())


def main():
    global torch
    torch, load_file, save_file = torch_and_safetensors()
    tensors = load_file(sys.argv[1])
    out = {}
    for key, w in tensors.items():
        if not key.startswith("w."):
            continue
        name = key[2:]
        x = tensors["x." + name]
        for kind, fn in (("qfloat8", qfloat8), ("float8", float8), ("int8", int8)):
            data, scale, zero, dq = fn(w)
            tag = f"{name}.{kind}"
            out["data." + tag] = data.contiguous()
            out["scale." + tag] = scale.contiguous()
            if zero is not None:
                out["zero_point." + tag] = zero.contiguous()
            out["dequantized." + tag] = dq.contiguous()
            out["y." + tag] = linear(x, kind, data, scale, dq).contiguous()
    save_file(out, sys.argv[2])


if __name__ == "__main__":
    main()
