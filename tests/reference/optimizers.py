"""The reference implementations of the optimizers gclab writes itself, run on the parameters and
gradients a test hands over (tests/train/optimizer_test.cpp):

  optimizers.py KIND IN OUT OPTIONS_JSON [KIND IN OUT OPTIONS_JSON ...]

(several runs in one process: Python, torch and bitsandbytes start once)

KIND: adafactor (transformers.optimization.Adafactor, which AI Toolkit's toolkit/optimizers/adafactor.py
modifies only for low-precision parameters), prodigy (prodigyopt.Prodigy), or adamw8bit / adam8bit / lion8bit
(bitsandbytes' AdamW8bit / Adam8bit / Lion8bit, what AI Toolkit's toolkit/optimizer.py builds for them;
exit 77, after the other runs, when bitsandbytes cannot be imported), or their algorithm written out here, `<kind>:algorithm`
(bitsandbytes' 8-bit optimizers as its paper, Dettmers et al. 2022 "8-bit Optimizers via Block-wise
Quantization", and its CUDA kernel describe them: create_dynamic_map codes, absmax blocks of 256, float32
moments under 4096 values, each step dequantize, update in float32, requantize to the nearest code; its CPU
build replaces the nearest-code search with a lookup table, which differs near the codes' midpoints). IN holds `param.<name>` and `grad.<step>.<name>`; every step
applies the gradients at learning rate `lr`. OUT gets `param.<name>` after the last step and, for the 8-bit
ones, `state.<name>.<key>` (bitsandbytes' state1 / state2 codes, absmax1 / absmax2 or float32 moments) and
`qmap.signed` / `qmap.unsigned` (its create_dynamic_map).
"""
import json
import math
import sys

import torch
from safetensors.torch import load_file, save_file


def dynamic_map(signed):
    # create_dynamic_map(signed, max_exponent_bits=7, total_bits=8), from bitsandbytes' documentation.
    data = []
    for i in range(7):
        items = 2 ** i + 1 if signed else 2 ** (i + 1) + 1
        b = torch.linspace(0.1, 1, items, dtype=torch.float32)
        means = (b[:-1] + b[1:]) / 2.0
        data += ((10 ** (-6 + i)) * means).tolist()
        if signed:
            data += (-(10 ** (-6 + i)) * means).tolist()
    data += [0, 1.0]
    return torch.tensor(sorted(data), dtype=torch.float32)


class EightBitAlgorithm:
    """bitsandbytes' block-wise 8-bit Adam / Lion step, with nearest-code requantization."""

    def __init__(self, kind, params, lr, betas=None, eps=1e-6, weight_decay=None):
        self.kind, self.params, self.lr, self.eps = kind, params, lr, eps
        lion = kind == "lion8bit"
        self.betas = betas or ((0.9, 0.99) if lion else (0.9, 0.999))
        self.wd = weight_decay if weight_decay is not None else (1e-2 if kind == "adamw8bit" else 0.0)
        self.codes = (dynamic_map(True), dynamic_map(False))
        self.step_count = 0
        self.state = {p: {} for p in params}

    @staticmethod
    def quantize(x, code):
        flat = x.reshape(-1)
        n = flat.numel()
        blocks = torch.nn.functional.pad(flat, (0, (-n) % 256)).reshape(-1, 256)
        absmax = blocks.abs().amax(1)
        scaled = (blocks * (1.0 / absmax.clamp(min=1e-38)).unsqueeze(1)).clamp(-1, 1).reshape(-1)[:n]
        q = torch.bucketize(scaled, (code[:-1] + code[1:]) / 2)  # nearest code, a tie to the lower
        return q.to(torch.uint8).reshape(x.shape), absmax

    @staticmethod
    def dequantize(q, absmax, code):
        n = q.numel()
        v = torch.nn.functional.pad(code[q.reshape(-1).long()], (0, (-n) % 256)).reshape(-1, 256)
        return (v * absmax.unsqueeze(1)).reshape(-1)[:n].reshape(q.shape)

    def moment(self, st, i, p):
        key = f"state{i}"
        if key not in st:
            return torch.zeros_like(p)
        if st[key].dtype == torch.float32:
            return st[key]
        return self.dequantize(st[key], st[f"absmax{i}"], self.codes[i - 1])

    def keep(self, st, i, value):
        if value.numel() < 4096:
            st[f"state{i}"] = value
        else:
            st[f"state{i}"], st[f"absmax{i}"] = self.quantize(value, self.codes[i - 1])

    def step(self):
        self.step_count += 1
        b1, b2 = self.betas
        for p in self.params:
            g, st, data = p.grad.float(), self.state[p], p.data
            m = self.moment(st, 1, p).clone()
            if self.kind == "lion8bit":
                if self.wd > 0:
                    data.mul_(1 - self.lr * self.wd)
                data.add_(torch.sign(m * b1 + g * (1 - b1)), alpha=-self.lr)
                m.mul_(b2).add_(g, alpha=1 - b2)
                self.keep(st, 1, m)
                continue
            v = self.moment(st, 2, p).clone()
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            c1 = 1 - b1 ** self.step_count
            c2 = math.sqrt(1 - b2 ** self.step_count)
            if self.wd > 0:
                data.mul_(1 - self.lr * self.wd)
            data.addcdiv_(m, (v.sqrt() / c2).add_(self.eps), value=-self.lr / c1)
            self.keep(st, 1, m)
            self.keep(st, 2, v)


def main():
    args = sys.argv[1:]
    if not args or len(args) % 4:
        raise SystemExit(__doc__)
    unavailable = False
    for i in range(0, len(args), 4):
        unavailable |= not run(args[i], args[i + 1], args[i + 2], json.loads(args[i + 3]))
    sys.exit(77 if unavailable else 0)


def run(kind, src, dst, options):
    """One reference run; False when it needs bitsandbytes and that cannot be imported."""
    t = load_file(src)
    names = sorted(k[len("param."):] for k in t if k.startswith("param."))
    params = {n: torch.nn.Parameter(t["param." + n].clone()) for n in names}  # float32, as gclab trains
    steps = sorted({int(k.split(".")[1]) for k in t if k.startswith("grad.")})
    lr = options.pop("lr")
    if kind == "adafactor":
        from transformers.optimization import Adafactor
        opt = Adafactor(list(params.values()), lr=lr, relative_step=False, warmup_init=False, **options)
    elif kind == "prodigy":
        from prodigyopt import Prodigy
        opt = Prodigy(list(params.values()), lr=lr, **options)
    elif kind.endswith(":algorithm"):
        opt = EightBitAlgorithm(kind.split(":")[0], list(params.values()), lr, **options)
    elif kind in ("adamw8bit", "adam8bit", "lion8bit"):
        try:
            import bitsandbytes as bnb
        except Exception as e:  # not installed, or no build for this machine
            print(f"bitsandbytes unavailable: {e}", file=sys.stderr)
            return False
        cls = {"adamw8bit": bnb.optim.AdamW8bit, "adam8bit": bnb.optim.Adam8bit, "lion8bit": bnb.optim.Lion8bit}[kind]
        opt = cls(list(params.values()), lr=lr, **options)
    else:
        raise SystemExit(f"unknown optimizer {kind}")
    for s in steps:
        for n, p in params.items():
            p.grad = t[f"grad.{s}.{n}"].clone()
        opt.step()
    out = {"param." + n: p.detach().float().contiguous() for n, p in params.items()}
    if kind.endswith(":algorithm"):
        out["qmap.signed"], out["qmap.unsigned"] = opt.codes
        for n, p in params.items():
            for key, value in opt.state[p].items():
                out[f"state.{n}.{key}"] = value.contiguous()
    elif kind.endswith("8bit"):
        import bitsandbytes as bnb
        out["qmap.signed"] = bnb.functional.create_dynamic_map(signed=True)
        out["qmap.unsigned"] = bnb.functional.create_dynamic_map(signed=False)
        for n, p in params.items():
            for key, value in opt.state[p].items():
                if torch.is_tensor(value) and key not in ("qmap1", "qmap2"):
                    out[f"state.{n}.{key}"] = value.contiguous()
    save_file(out, dst)
    return True


if __name__ == "__main__":
    main()
