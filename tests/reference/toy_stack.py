"""The checkpoint tests' block stack (tests/support/toy_blocks.h) in Python torch, op for op, with
torch.utils.checkpoint (non-reentrant) as the reference for gclab's C++ checkpoint.

  toy_stack.py parity DIR   reads DIR/weights.safetensors and DIR/inputs.safetensors written by the C++
                            test, runs the stack with checkpointing off and on, writes DIR/python.safetensors
                            (loss and gradient of every trainable parameter, for each run)
  toy_stack.py bench [--blocks 8 --width 256 --batch 4 --tokens 256,1024 --runs 7 --threads N]
                            prints JSON: per token count, GC off and full, median step seconds, activation
                            bytes kept after forward and the step's peak (from the CPU allocator's totals
                            recorded by torch.profiler)

Only `torch` is needed: safetensors files are read and written here with json + torch.frombuffer.
"""
import argparse
import json
import os
import statistics
import struct
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

DTYPES = {"F32": torch.float32, "F64": torch.float64, "BF16": torch.bfloat16, "F16": torch.float16,
          "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8, "BOOL": torch.bool}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[base + b:base + end]), dtype=DTYPES[e["dtype"]]) if end > b else \
            torch.empty(0, dtype=DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"])
    return out, meta


def write_safetensors(path, tensors):
    names = {v: k for k, v in DTYPES.items()}
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        raw = t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


class ToyBlock(nn.Module):
    """y = x + attn(norm1(x)); out = y + mlp(norm2(y)) — as ToyBlock in tests/support/toy_blocks.h."""

    def __init__(self, width, heads, mlp_ratio, lora_rank, dropout, frozen_base):
        super().__init__()
        self.width, self.heads, self.dropout = width, heads, dropout
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.fc1 = nn.Linear(width, mlp_ratio * width)
        self.fc2 = nn.Linear(mlp_ratio * width, width)
        self.q_lora_down = nn.Parameter(torch.randn(lora_rank, width) * 0.1)
        self.q_lora_up = nn.Parameter(torch.randn(width, lora_rank) * 0.1)
        self.fc1_lora_down = nn.Parameter(torch.randn(lora_rank, width) * 0.1)
        self.fc1_lora_up = nn.Parameter(torch.randn(mlp_ratio * width, lora_rank) * 0.1)
        if frozen_base:
            for m in (self.qkv, self.proj, self.fc1, self.fc2):
                m.requires_grad_(False)

    def attention(self, x):
        b, n, d, h = x.shape[0], x.shape[1], self.width, self.heads
        hx = F.layer_norm(x, (d,))
        q, k, v = self.qkv(hx).chunk(3, -1)
        q = q + F.linear(F.linear(hx, self.q_lora_down), self.q_lora_up)
        heads = lambda t: t.view(b, n, h, d // h).transpose(1, 2)  # noqa: E731
        a = F.scaled_dot_product_attention(heads(q), heads(k), heads(v))
        a = a.transpose(1, 2).reshape(b, n, d)
        return F.dropout(self.proj(a), self.dropout, self.training)

    def mlp(self, y):
        hy = F.layer_norm(y, (self.width,))
        h1 = self.fc1(hy) + F.linear(F.linear(hy, self.fc1_lora_down), self.fc1_lora_up)
        h1 = F.dropout(F.gelu(h1, approximate="tanh"), self.dropout, self.training)
        return self.fc2(h1)

    def forward(self, x):
        y = x + self.attention(x)
        return y + self.mlp(y)


class ToyStack(nn.Module):
    def __init__(self, blocks, **options):
        super().__init__()
        self.blocks = nn.ModuleList(ToyBlock(**options) for _ in range(blocks))

    def forward(self, x, use_checkpoint, early_stop=True):
        for block in self.blocks:
            # Non-reentrant: the variant PyTorch recommends, and the one gclab's C++ checkpoint mirrors.
            # early_stop (PyTorch's default) ends each recompute once the last tensor backward needs is
            # saved, skipping the block's tail ops; gclab's C++ checkpoint recomputes the whole block.
            if use_checkpoint:
                with torch.utils.checkpoint.set_checkpoint_early_stop(early_stop):
                    x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return x


def parity(directory):
    weights, meta = read_safetensors(os.path.join(directory, "weights.safetensors"))
    inputs, _ = read_safetensors(os.path.join(directory, "inputs.safetensors"))
    torch.set_num_threads(int(meta["threads"]))
    stack = ToyStack(int(meta["blocks"]), width=int(meta["width"]), heads=int(meta["heads"]),
                     mlp_ratio=int(meta["mlp_ratio"]), lora_rank=int(meta["lora_rank"]),
                     dropout=float(meta["dropout"]), frozen_base=meta["frozen_base"] == "1")
    stack.load_state_dict(weights, strict=True)
    stack.train()
    out = {}
    for tag, use_checkpoint in (("off", False), ("full", True)):
        stack.zero_grad(set_to_none=True)
        torch.manual_seed(int(meta["seed"]))
        loss = F.mse_loss(stack(inputs["x"], use_checkpoint), inputs["target"])
        loss.backward()
        out[f"{tag}.loss"] = loss.detach().reshape(1)
        for name, p in stack.named_parameters():
            if p.requires_grad:
                out[f"{tag}.grad.{name}"] = p.grad
    write_safetensors(os.path.join(directory, "python.safetensors"), out)


def allocator_totals(fn):
    """Runs fn under the profiler; returns (peak, final) of the CPU allocator's running total, in bytes
    allocated since the start of fn."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    os.unlink(path)
    # Running sum of the allocation events in the order they happened ("Ev Idx"): the trace's own
    # "Total Allocated" field is not reliable when frees are recorded out of timestamp order.
    memory = sorted((e for e in events if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0),
                    key=lambda e: e["args"].get("Ev Idx", 0))
    total, peak = 0, 0
    for e in memory:
        total += e["args"]["Bytes"]
        peak = max(peak, total)
    return peak, total


def bench(args):
    if args.threads:
        torch.set_num_threads(args.threads)
    result = {"threads": torch.get_num_threads(), "torch": torch.__version__, "tokens": {}}
    for tokens in [int(t) for t in args.tokens.split(",")]:
        torch.manual_seed(1)
        stack = ToyStack(args.blocks, width=args.width, heads=args.width // 64, mlp_ratio=4, lora_rank=4,
                         dropout=0.1, frozen_base=True).train()
        x = torch.randn(args.batch, tokens, args.width)

        def forward(tag):
            return stack(x, tag != "off", early_stop=tag == "full")

        def step(tag):
            stack.zero_grad(set_to_none=True)
            forward(tag).pow(2).mean().backward()

        row = {}
        tags = ["off", "full", "full_no_early_stop"]
        for tag in tags:
            step(tag)  # warm-up
            holder = {}
            _, final = allocator_totals(lambda: holder.setdefault("out", forward(tag)))
            kept = final - holder["out"].numel() * holder["out"].element_size()
            del holder
            peak, _ = allocator_totals(lambda: step(tag))
            row[tag] = {"kept_bytes": kept, "peak_bytes": peak, "step_s": []}
        for r in range(args.runs):  # interleaved, like ckpt_micro
            for k in range(len(tags)):
                tag = tags[(k + r) % len(tags)]
                t0 = time.perf_counter()
                step(tag)
                row[tag]["step_s"].append(time.perf_counter() - t0)
        for tag in row:
            row[tag]["step_s"] = statistics.median(row[tag]["step_s"])
        result["tokens"][str(tokens)] = row
    json.dump(result, sys.stdout)
    print()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("parity").add_argument("directory")
    b = sub.add_parser("bench")
    b.add_argument("--blocks", type=int, default=8)
    b.add_argument("--width", type=int, default=256)
    b.add_argument("--batch", type=int, default=4)
    b.add_argument("--tokens", default="256,1024")
    b.add_argument("--runs", type=int, default=7)
    b.add_argument("--threads", type=int, default=0)
    args = p.parse_args()
    parity(args.directory) if args.command == "parity" else bench(args)


if __name__ == "__main__":
    main()
