"""AI Toolkit's uint2..uint7 weight quantization (toolkit/util/uintx_quant.py, torchao 0.10's
UIntXWeightOnlyConfig), written here from its documented steps with torch only, for
tests/quant/uintx_test.cpp:

  uintx_reference.py IN.safetensors OUT.safetensors

For each weight `w.NAME` in IN and each bits in 2..7 it writes `packed.NAME.BITS`, `scale.NAME.BITS`,
`zero_point.NAME.BITS` and `dequantized.NAME.BITS`. Exit 77 without torch / safetensors.
"""
import sys

from reference_io import torch_and_safetensors

GROUP = 64


def pack(codes, k):
    per_byte = 8 // k
    if per_byte == 1:
        return codes.clone()
    pad = (-codes.numel()) % per_byte
    if pad:
        codes = torch.cat([codes, codes.new_zeros(pad)])
    rows = codes.view(per_byte, -1)
    out = rows[0].clone()
    for j in range(1, per_byte):
        out = out | (rows[j] << (j * k))
    return out


def unpack(data, k, n):
    per_byte = 8 // k
    if per_byte == 1:
        return data[:n].clone()
    parts = [(data >> (j * k)) & ((1 << k) - 1) for j in range(per_byte)]
    return torch.cat(parts)[:n]


def quantize(w, bits):
    rows, cols = w.shape
    groups = cols // GROUP
    g = w.contiguous().view(rows, groups, GROUP)
    lo = torch.min(torch.amin(g, dim=2), torch.zeros_like(g[:, :, 0]))
    hi = torch.max(torch.amax(g, dim=2), torch.zeros_like(g[:, :, 0]))
    top = (1 << bits) - 1
    scale = torch.clamp((hi - lo) / float(top), min=torch.finfo(torch.float32).eps)
    zero = torch.clamp(0 - torch.round(lo / scale), 0, top).to(torch.int32)
    codes = torch.clamp(torch.round(g * (1.0 / scale.view(rows, groups, 1))) + zero.view(rows, groups, 1), 0, top)
    codes = codes.view(-1).to(torch.uint8)
    widths = [k for k in (8, 4, 2, 1) if bits & k]
    shards, shift = [], 0
    for k in widths:
        shards.append(pack(codes if k == bits else (codes >> shift) & ((1 << k) - 1), k))
        shift += k
    packed = torch.cat(shards)
    # back again, from the packed bytes
    restored, shift, at = None, 0, 0
    for k in widths:
        size = -(-codes.numel() // (8 // k))
        part = unpack(packed[at:at + size], k, codes.numel())
        restored = part if restored is None else restored | (part << shift)
        shift += k
        at += size
    dq = restored.view(rows, groups, GROUP).to(scale.dtype)
    dq = (dq - zero.to(scale.dtype).view(rows, groups, 1)) * scale.view(rows, groups, 1)
    return packed, scale, zero.to(torch.uint8), dq.view(rows, cols)


def main():
    global torch
    torch, load_file, save_file = torch_and_safetensors()
    out = {}
    for key, w in load_file(sys.argv[1]).items():
        name = key[len("w."):]
        for bits in range(2, 8):
            packed, scale, zero, dq = quantize(w, bits)
            out[f"packed.{name}.{bits}"] = packed
            out[f"scale.{name}.{bits}"] = scale.contiguous()
            out[f"zero_point.{name}.{bits}"] = zero.contiguous()
            out[f"dequantized.{name}.{bits}"] = dq.contiguous()
    save_file(out, sys.argv[2])


if __name__ == "__main__":
    main()
